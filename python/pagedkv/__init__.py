"""pagedkv: the KV-cache allocator and paged-attention kernels of a serving engine.

The allocator (KvCacheManager, BlockPool) is pure bookkeeping and runs anywhere; the kernels
(write_kv, paged_decode_attention, paged_extend_attention, paged_mla_decode) and KvStorage take DLPack
tensors on CPU (reference kernels) or CUDA. See docs/python.md.
"""

from typing import Protocol, Union

from ._pagedkv import (
    DEFAULT_RETENTION_PRIORITY,
    MAX_RETENTION_PRIORITY,
    MIN_RETENTION_PRIORITY,
    NO_BLOCK,
    PADDING_BLOCK,
    AllBlocksCleared,
    AlreadyExists,
    AttentionKind,
    BatchStatus,
    BlockCopy,
    BlockHash,
    BlockPool,
    BlockRemoved,
    BlockStored,
    BlockTables,
    DType,
    Device,
    EventGroup,
    FailedPrecondition,
    InternalError,
    KvCacheConfig,
    KvCacheGroup,
    EvictionPolicy,
    HostAdmission,
    KvCacheManager,
    KvCacheSpec,
    KvEventBuffer,
    KvExport,
    KvHandoffGroup,
    KvImport,
    KvLayout,
    KvStorage,
    LayerGroup,
    Medium,
    PoolSplit,
    Preemption,
    PreemptionMode,
    PrefixHit,
    PrefixHitGroup,
    ResourceExhausted,
    RetentionRange,
    SequenceInfo,
    SequenceState,
    SequenceView,
    SlotBatch,
    StateSave,
    StateShape,
    StatusCode,
    StepOps,
    bytes_per_element,
    cuda_device_available,
    cuda_unavailable_reason,
    decode_workspace_bytes,
    default_device,
    first_attended,
    full_attention,
    hash_block,
    mla_decode_workspace_bytes,
    paged_decode_attention,
    paged_extend_attention,
    paged_mla_decode,
    write_kv,
)

KvEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]

# The capacity planner is compiled in when its library was built (it needs nlohmann-json).
try:
    from ._pagedkv import plan_capacity
except ImportError:  # pragma: no cover - a build without nlohmann-json
    pass


class KvEventSink(Protocol):
    """What KvCacheManager / BlockPool accept as event_sink (or a KvEventBuffer)."""

    def on_event(self, event: KvEvent) -> None: ...


class PreemptionHooks(Protocol):
    """What KvCacheManager accepts as preemption_hooks. It may also define
    on_claim_released(seq: int) -> None, called when allocate_slots_or_preempt() gives back
    the prefix a waiting sequence claimed with match_prefix() (call match_prefix() again
    before admitting it)."""

    def on_preempt(self, victim: int, mode: PreemptionMode) -> None: ...


__all__ = [
    "DEFAULT_RETENTION_PRIORITY", "MAX_RETENTION_PRIORITY", "MIN_RETENTION_PRIORITY",
    "NO_BLOCK", "PADDING_BLOCK", "AllBlocksCleared", "AlreadyExists", "AttentionKind",
    "BatchStatus", "BlockCopy", "BlockHash", "BlockPool", "BlockRemoved", "BlockStored",
    "BlockTables", "DType", "Device", "EventGroup", "EvictionPolicy", "FailedPrecondition",
    "HostAdmission", "InternalError",
    "KvCacheConfig", "KvCacheGroup", "KvCacheManager", "KvCacheSpec", "KvEvent",
    "KvEventBuffer", "KvEventSink", "KvExport", "KvHandoffGroup", "KvImport", "KvLayout",
    "KvStorage", "LayerGroup", "Medium",
    "PoolSplit", "Preemption", "PreemptionHooks", "PreemptionMode", "PrefixHit",
    "PrefixHitGroup", "ResourceExhausted",
    "RetentionRange", "SequenceInfo", "SequenceState", "SequenceView", "SlotBatch",
    "StateSave", "StateShape", "StatusCode", "StepOps", "bytes_per_element", "cuda_device_available",
    "cuda_unavailable_reason", "decode_workspace_bytes", "default_device", "first_attended",
    "full_attention", "hash_block", "mla_decode_workspace_bytes", "paged_decode_attention",
    "paged_extend_attention", "paged_mla_decode", "write_kv",
]
if "plan_capacity" in globals():
    __all__.append("plan_capacity")
