"""vLLM's v1 scheduler on pagedkv's KV cache manager (vLLM 0.33.0 exactly).

vLLM's `Scheduler` builds its own `KVCacheManager` and calls about 30 of its members. This
module gives it pagedkv's C++ `KvCacheManager` instead, behind the same interface:

- `PagedKVCacheManager`: vLLM's `KVCacheManager` interface (`get_computed_blocks`,
  `allocate_slots`, `free`, `get_blocks`, `take_events`, `usage`, ...), backed by
  `pagedkv.KvCacheManager` through the bindings.
- `PagedKVScheduler`: vLLM's `Scheduler` with that manager; select it with
  `SchedulerConfig(scheduler_cls="pagedkv.integrations.vllm.PagedKVScheduler")`.

How the two models meet (docs/vllm.md has the rules and the measured differences):

- A vLLM request is a pagedkv sequence while it holds blocks: added with its tokens (prompt
  and outputs) when the scheduler looks up its prefix hit, freed by `free()` (finish,
  abort, or preemption: vLLM's preemption is recompute, a free).
- `get_computed_blocks()` looks the hit up without claiming it (`peek_prefix()`: its
  blocks, and how many of them are free); `allocate_slots()` decides the fit with vLLM's
  formula before anything changes, then claims the hit (`match_prefix()`) and admits. A
  lookup that does not admit changes nothing in pagedkv, as in vLLM.
- Block ids are pagedkv's plus one: vLLM's runner keeps block 0 as its null block, so the
  pool holds `kv_cache_config.num_blocks - 1` blocks, as vLLM's does. A window's released
  entries (pagedkv's kNoBlock) are that null block, as in vLLM's tables.
- Hybrid models (full-attention and sliding-window groups): one pagedkv pool for all
  groups (`shared_block_pool`), as vLLM's groups share its block pool, with the windows'
  released blocks in plain LRU order (`window_eviction_classes=False`).
- The scheduler's step ends with `take_step_ops()` at the end of `schedule()`; the pool
  never records copies here (no forks, swaps or host tier), and a step that would is an
  error, since vLLM's runner would not run them.
- Events are vLLM's classes (`vllm.distributed.kv_events`); block hashes are pagedkv's
  (XXH3-128, 16 bytes, `hi` then `lo` big-endian; the low 64 bits as an int with
  `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`), not vLLM's SHA-256 ones.

Unsupported (refused at construction with `NotImplementedError` naming the setting): KV
connectors (P/D, offloading), speculative decoding, async scheduling, encoder-decoder
models, diffusion models, context/decode parallelism, Mamba and other non-attention groups,
chunked-local attention, and sliding-window groups without a full-attention group.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

SUPPORTED_VLLM_VERSION = "0.33.0"

try:
    import vllm
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"pagedkv.integrations.vllm needs vLLM {SUPPORTED_VLLM_VERSION} "
        "(bash scripts/ml-venv.d/vllm.sh VENV installs it)"
    ) from e



def check_vllm_version(version: str) -> None:
    """Raises ImportError unless `version` is the vLLM release this module was written for."""
    if version != SUPPORTED_VLLM_VERSION:
        raise ImportError(
            f"pagedkv.integrations.vllm supports vLLM {SUPPORTED_VLLM_VERSION} only (its "
            f"scheduler's calls into the KV cache manager change between releases); "
            f"found vLLM {version}"
        )


check_vllm_version(vllm.__version__)

import pagedkv as pk
from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, SlidingWindowSpec
from vllm.v1.metrics.stats import PrefixCacheStats
from vllm.v1.request import Request, RequestStatus

__all__ = [
    "SUPPORTED_VLLM_VERSION",
    "check_vllm_version",
    "PagedKVCacheManager",
    "PagedKVScheduler",
]

_INT32_MAX = 2**31 - 1


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _unsupported(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"pagedkv.integrations.vllm does not support {what} (vLLM {SUPPORTED_VLLM_VERSION}); "
        "see docs/vllm.md, 'Not supported'"
    )


def _event_hash(h: Any) -> bytes | int:
    """pagedkv's BlockHash as vLLM's ExternalBlockHash (as docs/events.md puts it on the wire)."""
    raw = h.hi.to_bytes(8, "big") + h.lo.to_bytes(8, "big")
    if os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0") not in ("", "0"):
        return h.lo
    return raw


def _group_idx(event: Any) -> int:
    """vLLM's KV cache group index of a pagedkv event (0 for a model of one group)."""
    return 0 if event.group is None else event.group.index


def _extra_keys(request: Request) -> list[int]:
    """The keys that separate caches: vLLM's cache salt and LoRA adapter, as uint64 keys."""
    keys: list[int] = []
    if request.cache_salt:
        digest = hashlib.blake2b(request.cache_salt.encode(), digest_size=8).digest()
        keys.append(int.from_bytes(digest, "little"))
    if request.lora_request is not None:
        keys.append(int(request.lora_request.adapter_id) & (2**64 - 1))
    return keys


class _PoolView:
    """What vLLM's scheduler reads of `kv_cache_manager.block_pool`."""

    def __init__(self, manager: "PagedKVCacheManager") -> None:
        self._manager = manager

    def get_num_free_blocks(self) -> int:
        return self._manager._free_blocks()

    def get_usage(self) -> float:
        return self._manager.usage

    def __getattr__(self, name: str) -> Any:
        raise _unsupported(
            f"kv_cache_manager.block_pool.{name} (vLLM's own block pool: deferred frees of a "
            "KV connector, CoW retentions)"
        )


class _SingleTypeView:
    """What the scheduler's constructor reads of a single-type manager."""

    def __init__(self, spec: Any, group_id: int) -> None:
        self.kv_cache_spec = spec
        self.block_size = spec.block_size
        self.kv_cache_group_id = group_id
        self.retains_longer_hit = False


class _CoordinatorView:
    """What vLLM's scheduler reads of `kv_cache_manager.coordinator`; the rest is refused."""

    enable_partial_hash_hits = False

    def __init__(self, kv_cache_config: KVCacheConfig) -> None:
        self.single_type_managers = [
            _SingleTypeView(g.kv_cache_spec, i)
            for i, g in enumerate(kv_cache_config.kv_cache_groups)
        ]

    def __getattr__(self, name: str) -> Any:
        raise _unsupported(
            f"kv_cache_manager.coordinator.{name} (vLLM's coordinator internals: async KV "
            "loads, Mamba checkpoints)"
        )


class PagedKVCacheManager:
    """vLLM 0.33.0's `KVCacheManager` interface on pagedkv's `KvCacheManager`.

    The constructor takes vLLM's arguments (those the scheduler passes) and refuses the
    settings pagedkv cannot serve here with `NotImplementedError`.
    """

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_in_flight_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        num_hash_lookahead_tokens: int = 0,
        num_prefill_lookahead: int = 0,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        watermark: float = 0.0,
        enable_mamba_shared_prefix_checkpoint: bool = False,
    ) -> None:
        del enable_mamba_shared_prefix_checkpoint  # no Mamba groups
        if use_eagle or num_hash_lookahead_tokens or num_prefill_lookahead:
            raise _unsupported("speculative decoding (EAGLE, lookahead hashing, MTP prefill)")
        if dcp_world_size != 1 or pcp_world_size != 1:
            raise _unsupported("decode or prefill context parallelism")
        if hash_block_size != scheduler_block_size:
            raise _unsupported(
                f"hash_block_size {hash_block_size} != block_size {scheduler_block_size}"
            )
        if kv_cache_config.num_blocks < 2:
            raise ValueError(
                f"kv_cache_config.num_blocks = {kv_cache_config.num_blocks}: vLLM keeps block 0 "
                "as its null block, so a KV cache needs at least 2 blocks"
            )
        groups = kv_cache_config.kv_cache_groups
        if not groups:
            raise ValueError("kv_cache_config has no KV cache groups")
        layer_groups = []
        for i, group in enumerate(groups):
            spec = group.kv_cache_spec
            if spec.block_size != scheduler_block_size:
                raise _unsupported(
                    f"group {i} with block_size {spec.block_size} != {scheduler_block_size}"
                )
            if type(spec) is FullAttentionSpec and spec.sliding_window is None:
                layer_groups.append(pk.LayerGroup(kind=pk.AttentionKind.FULL))
            elif type(spec) is SlidingWindowSpec and spec.extra_retained_tokens == 0:
                layer_groups.append(
                    pk.LayerGroup(kind=pk.AttentionKind.SLIDING_WINDOW, window=spec.sliding_window)
                )
            else:
                raise _unsupported(f"KV cache group {i} of {type(spec).__name__}")
        # The windowed groups' indices: their tables lose entries behind the window.
        windowed = [i for i, g in enumerate(layer_groups) if g.kind != pk.AttentionKind.FULL]
        if len(windowed) == len(layer_groups):
            # pagedkv verifies a window's blocks along a full-attention group's chain.
            raise _unsupported("sliding-window groups without a full-attention group")
        num_blocks = kv_cache_config.num_blocks - 1  # vLLM's null block 0 is not ours
        for g in layer_groups:
            g.num_blocks = num_blocks
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.block_size = scheduler_block_size
        self.enable_caching = enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        self.log_stats = log_stats
        self.metrics_collector = metrics_collector
        self.use_eagle = False
        self.num_kv_cache_groups = len(groups)
        self._windowed = windowed
        # vLLM's admission cap of a window group (SlidingWindowSpec.
        # max_admission_blocks_per_request): the blocks a request holds there at most, its
        # window and the tokens in flight, which scheduler_reserve_full_isl's check counts.
        in_flight = max_in_flight_tokens if max_in_flight_tokens is not None else max_model_len
        self._admission_caps = [
            _cdiv(min(layer_groups[i].window - 1 + in_flight, max_model_len), scheduler_block_size)
            + 1
            for i in windowed
        ]
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.mamba_shared_prefix_checkpoint = False
        self.retained_hit_group_ids = ()
        # Events only when vLLM would publish them (its pool records none otherwise).
        self._events = pk.KvEventBuffer() if enable_kv_cache_events else None
        self._num_blocks = num_blocks
        self._manager = pk.KvCacheManager(
            layer_groups=layer_groups,
            block_size=scheduler_block_size,
            max_model_len=max_model_len,
            enable_prefix_caching=enable_caching,
            event_sink=self._events,
            shared_block_pool=len(layer_groups) > 1,
            window_eviction_classes=False,
        )
        # One KVCacheBlock per vLLM id, as vLLM's pool keeps them; id 0 is the null block.
        self._blocks = [KVCacheBlock(i) for i in range(num_blocks + 1)]
        self._blocks[0].is_null = True
        self._seq_of: dict[str, int] = {}  # request id -> pagedkv sequence id
        self._num_tokens: dict[int, int] = {}  # sequence -> tokens given to pagedkv
        # sequence -> (hit tokens, free blocks among the hit's) of get_computed_blocks()'s
        # lookup (peek_prefix()), not claimed yet: allocate_slots() claims it if it fits.
        self._peeks: dict[int, tuple[int, int]] = {}
        # sequence -> its tables (one per group) as vLLM's blocks, and its computed tokens:
        # pagedkv changes a table only in the calls below (no forks, no copy-on-write, no
        # preemption of its own here), so the adapter keeps a copy instead of reading the
        # tables back every step (check_tables() compares them); a window's table is read
        # again after each call that may release its entries.
        self._tables: dict[int, list[list[KVCacheBlock]]] = {}
        self._computed: dict[int, int] = {}
        self._next_seq = 0
        # Lookups with a hit that no admission took (the blocks did not fit, or the token
        # budget ran out): with peek_prefix() they change nothing, as vLLM's do.
        self.num_unadmitted_hits = 0
        # Sequences given slots in this step, and frees of such sequences: the priority
        # policy preempts a request it scheduled earlier in the same step, and pagedkv's
        # free() then drops the blocks that step filled from the prefix index (their K/V
        # is never written), where vLLM keeps them cached (docs/vllm.md, "Differences").
        self._scheduled: set[int] = set()
        self.num_unwritten_frees = 0
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in groups))
        self.block_pool = _PoolView(self)
        self.coordinator = _CoordinatorView(kv_cache_config)

    # -- pagedkv side -----------------------------------------------------------------

    @property
    def pagedkv_manager(self) -> "pk.KvCacheManager":
        """The pagedkv manager underneath (for tests and stats)."""
        return self._manager

    def _free_blocks(self) -> int:
        return self._manager.stats().free_blocks

    def _seq(self, request_id: str) -> int:
        seq = self._seq_of.get(request_id)
        if seq is None:
            raise KeyError(f"request {request_id!r} holds no KV cache blocks in pagedkv")
        return seq

    def _admit(self, request: Request) -> int:
        """The request's sequence, added with its tokens if it holds none."""
        seq = self._seq_of.get(request.request_id)
        if seq is not None:
            return seq
        tokens = list(request.all_token_ids)
        seq = self._next_seq
        keys = _extra_keys(request)
        if keys:
            self._manager.add_sequence(seq, tokens, extra_keys=keys)
        else:
            self._manager.add_sequence(seq, tokens)
        self._next_seq += 1
        self._seq_of[request.request_id] = seq
        self._num_tokens[seq] = len(tokens)
        self._tables[seq] = [[] for _ in range(self.num_kv_cache_groups)]
        self._computed[seq] = 0
        return seq

    def _sync_tokens(self, request: Request, seq: int) -> None:
        """Appends the tokens vLLM sampled since the last call (its all_token_ids grow)."""
        have = self._num_tokens[seq]
        if request.num_tokens > have:
            self._manager.append_tokens(seq, list(request.all_token_ids[have:]))
            self._num_tokens[seq] = request.num_tokens

    def _drop(self, request_id: str) -> None:
        seq = self._seq_of.pop(request_id, None)
        if seq is None:
            return
        self._peeks.pop(seq, None)
        self._num_tokens.pop(seq, None)
        self._tables.pop(seq, None)
        self._computed.pop(seq, None)
        self._manager.free(seq)

    def _release_claims(self) -> None:
        """Drops the sequences get_computed_blocks() added that no admission took.

        They hold no blocks (the lookup claimed nothing), so freeing them changes nothing
        in pagedkv's pools.
        """
        if not self._peeks:
            return
        for request_id, seq in list(self._seq_of.items()):
            if seq in self._peeks:
                if self._peeks[seq][0] > 0:
                    self.num_unadmitted_hits += 1
                self._drop(request_id)

    def _table(self, seq: int, group: int = 0, begin: int = 0) -> list[KVCacheBlock]:
        """pagedkv's table of `group` from entry `begin` on; kNoBlock (-1) is vLLM's null block."""
        blocks = self._blocks
        return [blocks[b + 1] for b in self._manager.sequence(seq, group).block_table[begin:]]

    def _reread_windows(self, seq: int) -> None:
        for g in self._windowed:
            self._tables[seq][g] = self._table(seq, g)

    def check_tables(self) -> None:
        """Raises InternalError unless the adapter's tables and counts are pagedkv's (tests)."""
        for request_id, seq in self._seq_of.items():
            for g, table in enumerate(self._tables[seq]):
                view = self._manager.sequence(seq, g)
                ours = [b.block_id - 1 for b in table]
                if ours != list(view.block_table) or self._computed[seq] != view.num_computed_tokens:
                    raise pk.InternalError(
                        f"request {request_id!r} group {g}: adapter table {ours} / "
                        f"{self._computed[seq]} computed, pagedkv {list(view.block_table)} / "
                        f"{view.num_computed_tokens}"
                    )

    def end_step(self) -> None:
        """Ends pagedkv's step (take_step_ops()), after the scheduler's schedule()."""
        self._release_claims()
        self._scheduled.clear()
        ops = self._manager.take_step_ops()
        if not ops.empty():
            raise pk.InternalError(
                "pagedkv recorded copies in a vLLM step (copy-on-write, swap or host-tier "
                "copies), which vLLM's model runner would not run"
            )

    # -- vLLM's KVCacheManager interface ----------------------------------------------

    @property
    def usage(self) -> float:
        stats = self._manager.stats()
        return stats.used_blocks / stats.num_blocks

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        if not self.log_stats:
            return None
        stats = self.prefix_cache_stats
        self.prefix_cache_stats = PrefixCacheStats()
        return stats

    def prefix_cache_lookup_enabled(self, request: Request) -> bool:
        return self.enable_caching and not request.skip_reading_prefix_cache

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        if not self.log_stats or not self.prefix_cache_lookup_enabled(request):
            return
        assert self.prefix_cache_stats is not None
        self.prefix_cache_stats.record(
            num_tokens=request.num_tokens,
            num_hits=num_hits,
            preempted=request.num_preemptions > 0,
        )

    def get_computed_blocks(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]:
        """The request's longest cached prefix, looked up without claiming it.

        pagedkv's peek_prefix(): no reference is taken and no block moves in the eviction
        order; allocate_slots() claims the hit (match_prefix()) when the request fits.
        """
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        if request.request_id in self._seq_of and request.status not in (
            RequestStatus.WAITING,
            RequestStatus.PREEMPTED,
        ):
            raise ValueError(
                f"get_computed_blocks: request {request.request_id!r} is "
                f"{request.status.name}, not waiting"
            )
        self._release_claims()
        seq = self._admit(request)
        hit = self._manager.peek_prefix(seq)
        num_tokens = hit.num_tokens
        if num_tokens == 0 or (
            max_cache_hit_length is not None and num_tokens > max_cache_hit_length
        ):
            # pagedkv claims whole hits; a shorter cap takes none of it.
            self._peeks[seq] = (0, 0)
            return self.empty_kv_cache_blocks, 0, 0
        # vLLM's evictable hit blocks: those in the free queue, in every group.
        self._peeks[seq] = (num_tokens, sum(g.num_free_hits for g in hit.groups))
        blocks = self._blocks
        return (
            KVCacheBlocks(tuple([blocks[b + 1] for b in g.blocks] for g in hit.groups)),
            num_tokens,
            0,
        )

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> KVCacheBlocks | None:
        """Slots for the request's next tokens, or None when the blocks do not fit.

        Admits a waiting request (claiming the hit get_computed_blocks() looked up), caches
        the full blocks it fills, and returns the new blocks. Returns None, changing
        nothing, when the pool lacks blocks: the fit (vLLM's formula, the hit's free blocks
        counted) is decided before the claim.
        """
        del skip_zeroing_group_ids
        if num_external_computed_tokens or delay_cache_blocks:
            raise _unsupported("KV connector loads (external computed tokens)")
        if num_encoder_tokens:
            raise _unsupported("encoder-decoder models (cross-attention blocks)")
        if num_new_tokens <= 0 and num_new_computed_tokens == 0:
            raise ValueError(
                "num_new_tokens must be greater than 0 when there are no computed tokens "
                "to adopt"
            )
        if num_new_tokens < 0 or num_lookahead_tokens < 0 or num_new_computed_tokens < 0:
            raise ValueError(
                f"allocate_slots({request.request_id!r}): negative count (new "
                f"{num_new_tokens}, computed {num_new_computed_tokens}, lookahead "
                f"{num_lookahead_tokens})"
            )
        seq = self._admit(request)
        peeked = self._peeks.pop(seq, None)
        waiting = peeked is not None or request.status in (
            RequestStatus.WAITING,
            RequestStatus.PREEMPTED,
        )
        hit, free_hits = peeked or (0, 0)
        if hit != num_new_computed_tokens:
            self._drop(request.request_id)
            raise ValueError(
                f"allocate_slots({request.request_id!r}): num_new_computed_tokens "
                f"{num_new_computed_tokens} is not the {hit} tokens get_computed_blocks() "
                "found"
            )
        try:
            self._sync_tokens(request, seq)
            tables = self._tables[seq]
            if self._windowed and tables[0]:
                # vLLM's remove_skipped_blocks(), before the fit: a running request's
                # windows release the entries behind them, whether the step fits or not.
                self._manager.allocate_slots(seq, 0)
                self._reread_windows(seq)
            # The hit's blocks count as held; those of them in the free queue leave it
            # when the hit is claimed (vLLM's "evictable computed blocks"). Every group's
            # table has an entry per block of the context (a window's released ones are
            # null blocks), so the groups need as many new blocks each.
            held = len(tables[0]) + hit // self.block_size
            computed = self._computed[seq] + hit
            if computed != request.num_computed_tokens + num_new_computed_tokens:
                raise ValueError(
                    f"allocate_slots({request.request_id!r}): vLLM counts "
                    f"{request.num_computed_tokens} + {num_new_computed_tokens} computed "
                    f"tokens, pagedkv {computed}"
                )
            watermark = self.watermark_blocks if has_scheduled_reqs and waiting else 0
            # Blocks free: read only when a check can fail (not in a decode step that
            # stays within its last block).
            free = self._free_blocks() if full_sequence_must_fit or watermark else 0
            if full_sequence_must_fit:
                # The whole sequence's blocks, in a window group at most its cap.
                full = _cdiv(min(request.num_tokens, self.max_model_len), self.block_size)
                required = [full] * (self.num_kv_cache_groups - len(self._windowed))
                required += [min(full, cap) for cap in self._admission_caps]
                blocks = sum(max(0, r - held) for r in required)
                if blocks + free_hits + watermark > free:
                    raise pk.ResourceExhausted("full sequence does not fit")
            need_tokens = min(computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
            lookahead = max(0, need_tokens - computed - num_new_tokens)
            new_blocks = max(0, _cdiv(need_tokens, self.block_size) - held)
            need = new_blocks * self.num_kv_cache_groups + free_hits
            if need or reserved_blocks:
                if not (full_sequence_must_fit or watermark):
                    free = self._free_blocks()
                if need + watermark > free - reserved_blocks:
                    raise pk.ResourceExhausted("blocks short")
            if hit:
                # It fits: claim the hit looked up (nothing changed since the lookup).
                claimed = self._manager.match_prefix(seq)
                if claimed != hit:
                    raise pk.InternalError(
                        f"allocate_slots({request.request_id!r}): match_prefix() claimed "
                        f"{claimed} tokens, peek_prefix() found {hit}"
                    )
                self._computed[seq] = hit
                for g, table in enumerate(tables):
                    table.extend(self._table(seq, g))
            if num_new_tokens or lookahead:
                self._manager.allocate_slots(seq, num_new_tokens, lookahead)
                self._computed[seq] = computed + num_new_tokens
                self._scheduled.add(seq)
        except pk.ResourceExhausted:
            if waiting:
                if hit:
                    self.num_unadmitted_hits += 1
                self._drop(request.request_id)
            return None
        except BaseException:
            if waiting:
                self._drop(request.request_id)
            raise
        if new_blocks == 0:
            return self.empty_kv_cache_blocks
        new = tuple(self._table(seq, g, held) for g in range(self.num_kv_cache_groups))
        for table, blocks in zip(tables, new):
            table.extend(blocks)
        return KVCacheBlocks(new)

    def free(self, request: Request) -> None:
        """Frees the request's blocks, tail first (hashed ones stay cached).

        Except the full blocks it filled in this step and holds alone, when the scheduler
        frees a request it scheduled in the same step (the priority policy's preemption):
        pagedkv takes them out of the prefix index, since their K/V is never written.
        """
        seq = self._seq_of.get(request.request_id)
        if seq is not None and seq in self._scheduled:
            self._scheduled.discard(seq)
            self.num_unwritten_frees += 1
        self._drop(request.request_id)

    def remove_skipped_blocks(
        self,
        request_id: str,
        processed_computed_tokens: int,
        num_prompt_tokens: int | None = None,
    ) -> None:
        """Nothing to do: pagedkv releases what a window no longer needs by itself."""

    def pop_blocks_for_free(self, request: Request) -> list[KVCacheBlock]:
        raise _unsupported("deferred block frees (KV connectors with overlapped steps)")

    def evict_blocks(self, block_ids: set[int]) -> None:
        raise _unsupported("evict_blocks (KV connector load failures)")

    def reset_prefix_cache(self) -> bool:
        """Flushes the prefix cache; as vLLM's, refuses (False) while blocks are in use."""
        self._release_claims()
        if self._manager.stats().used_blocks > 0:
            return False
        self._manager.reset_prefix_cache()
        if self.log_stats:
            assert self.prefix_cache_stats is not None
            self.prefix_cache_stats.reset = True
        return True

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [0] * self.num_kv_cache_groups

    def take_events(self) -> list[KVCacheEvent]:
        """The events since the last call, as vLLM's event classes."""
        out: list[KVCacheEvent] = []
        if self._events is None:
            return out
        for ev in self._events.take():
            if isinstance(ev, pk.BlockStored):
                parent = ev.parent_hash
                out.append(
                    BlockStored(
                        block_hashes=[_event_hash(h) for h in ev.block_hashes],
                        parent_block_hash=None if parent is None else _event_hash(parent),
                        token_ids=list(ev.token_ids),
                        block_size=ev.block_size,
                        lora_id=None,
                        medium="GPU",
                        lora_name=None,
                        group_idx=_group_idx(ev),
                    )
                )
            elif isinstance(ev, pk.BlockRemoved):
                out.append(
                    BlockRemoved(
                        block_hashes=[_event_hash(h) for h in ev.block_hashes],
                        medium="GPU",
                        group_idx=_group_idx(ev),
                    )
                )
            else:
                out.append(AllBlocksCleared())
        return out

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        seq = self._seq_of.get(request_id)
        tables = None if seq is None else self._tables[seq]
        if not tables or not tables[0]:
            return self.empty_kv_cache_blocks
        return KVCacheBlocks(tuple(list(t) for t in tables))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()

    def get_block_ids_for_computed_tokens(
        self, request_id: str, num_computed_tokens: int
    ) -> tuple[list[int], ...]:
        n = _cdiv(num_computed_tokens, self.block_size)
        return tuple(ids[:n] for ids in self.get_block_ids(request_id))

    def estimate_cached_tokens(self, request: Request) -> int:
        """Tokens of the request in full blocks (all of them are cached with caching on)."""
        if not self.enable_caching:
            return 0
        seq = self._seq_of.get(request.request_id)
        if seq is None:
            return 0
        return (self._computed[seq] // self.block_size) * self.block_size

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Nothing to do: allocate_slots() caches each block as it fills."""

    def truncate_computed_blocks(
        self, blocks: KVCacheBlocks, num_computed_tokens: int
    ) -> KVCacheBlocks:
        raise _unsupported("truncate_computed_blocks (KV connector partial hits)")

    def take_new_block_ids(self) -> list[int]:
        return []

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        raise _unsupported("record_blocks_for_zeroing (failed KV connector loads)")

    def take_kv_cache_block_copies(self) -> tuple[list[Any], list[KVCacheBlock]]:
        return [], []

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        return {}

    def finalize_partial_tail_offloads(self, request: Request) -> list[tuple[int, int, int]]:
        raise _unsupported("finalize_partial_tail_offloads (KV connector producers)")

    def get_computed_blocks_for_connector(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int, bool]:
        raise _unsupported("get_computed_blocks_for_connector (KV connectors)")

    def new_step_starts(self) -> None:
        """Nothing to do: the step ends in end_step()."""

    def create_kv_cache_blocks(self, blocks: tuple[list[KVCacheBlock], ...]) -> KVCacheBlocks:
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks


class PagedKVScheduler(Scheduler):
    """vLLM's Scheduler with its KV cache on pagedkv (`PagedKVCacheManager`).

    Select it with SchedulerConfig(scheduler_cls="pagedkv.integrations.vllm.PagedKVScheduler").
    """

    def __init__(self, vllm_config: Any, kv_cache_config: KVCacheConfig, *args: Any, **kwargs: Any):
        _check_config(vllm_config)
        if kv_cache_config.num_blocks < 2:
            raise ValueError(
                f"kv_cache_config.num_blocks = {kv_cache_config.num_blocks}: vLLM keeps block 0 "
                "as its null block, so a KV cache needs at least 2 blocks"
            )
        super().__init__(vllm_config, kv_cache_config, *args, **kwargs)
        # The base constructor built vLLM's own manager (its reads of it, above, depend on
        # the config alone); replace it before any request arrives.
        own = self.kv_cache_manager
        self.kv_cache_manager = PagedKVCacheManager(
            kv_cache_config=kv_cache_config,
            max_model_len=self.max_model_len,
            max_in_flight_tokens=vllm_config.max_in_flight_tokens,
            scheduler_block_size=self.block_size,
            hash_block_size=self.hash_block_size,
            enable_caching=self.cache_config.enable_prefix_caching,
            log_stats=self.log_stats,
            enable_kv_cache_events=self.enable_kv_cache_events,
            watermark=self.scheduler_config.watermark,
        )
        self.kv_cache_manager.metrics_collector = own.metrics_collector
        del own

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        output = super().schedule(*args, **kwargs)
        self.kv_cache_manager.end_step()
        return output

    def add_request(self, request: Request) -> None:
        for i, token in enumerate(request.prompt_token_ids or ()):
            if not -(2**31) <= token <= _INT32_MAX:
                raise ValueError(
                    f"request {request.request_id!r}: prompt_token_ids[{i}] = {token} is "
                    "outside the int32 range of pagedkv's token ids"
                )
        super().add_request(request)


def _check_config(vllm_config: Any) -> None:
    if vllm_config.kv_transfer_config is not None:
        raise _unsupported("KV connectors (kv_transfer_config)")
    if vllm_config.speculative_config is not None:
        raise _unsupported("speculative decoding (speculative_config)")
    if vllm_config.scheduler_config.async_scheduling:
        raise _unsupported(
            "async scheduling (blocks for tokens not yet sampled); set async_scheduling=False"
        )
    if vllm_config.model_config is not None and vllm_config.model_config.is_encoder_decoder:
        raise _unsupported("encoder-decoder models")
    if vllm_config.diffusion_config is not None:
        # vLLM schedules a diffusion canvas as speculative tokens (num_speculative_tokens
        # is its width) and selects its own DiffusionScheduler for it.
        raise _unsupported("diffusion models (diffusion_config)")
