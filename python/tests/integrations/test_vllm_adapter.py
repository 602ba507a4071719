"""pagedkv.integrations.vllm: the interface vLLM 0.33.0's scheduler calls, the version pin,
the selection through SchedulerConfig.scheduler_cls, block ids, refusals and bad input."""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
from typing import Any, Iterator

import pytest

pytest.importorskip("torch", reason="the vLLM tests need torch (bash scripts/test-integrations.sh)")
pytest.importorskip("vllm", reason="the vLLM tests need vLLM 0.33.0 (bash scripts/test-integrations.sh)")

import vllm_traces  # noqa: E402
from vllm_traces import NewRequest, TraceConfig  # noqa: E402

import pagedkv as pk  # noqa: E402
from pagedkv.integrations import vllm as pkv  # noqa: E402


def _config(**over) -> TraceConfig:
    base = dict(
        block_size=4,
        num_blocks=33,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=256,
        enable_prefix_caching=True,
        watermark=0.0,
    )
    base.update(over)
    return TraceConfig(**base)


def _scheduler_members_called() -> dict[str, bool]:
    """Members of kv_cache_manager that vLLM's scheduler.py uses: name -> called as a method."""
    import vllm.v1.core.sched.scheduler as sched_mod

    src = inspect.getsource(sched_mod)
    names: dict[str, bool] = {}
    for m in re.finditer(r"self\.kv_cache_manager\.(\w+)(\s*\()?", src):
        names[m.group(1)] = names.get(m.group(1), False) or bool(m.group(2))
    return names


def _shape(fn) -> list[tuple]:
    """A signature without annotations: parameter names, kinds and defaults."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_version_pin() -> None:
    import vllm

    assert vllm.__version__ == pkv.SUPPORTED_VLLM_VERSION == "0.33.0"
    pkv.check_vllm_version("0.33.0")
    with pytest.raises(ImportError, match=r"supports vLLM 0\.33\.0 only.*found vLLM 0\.34\.0"):
        pkv.check_vllm_version("0.34.0")


def test_every_member_the_scheduler_uses_exists_with_vllms_signature() -> None:
    """Fails when vLLM's scheduler calls a member we lack, or a signature we copy changed."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    called = _scheduler_members_called()
    # The scan found the scheduler's calls (about 30 members in 0.33.0).
    assert {"allocate_slots", "get_computed_blocks", "free", "take_events"} <= called.keys()
    assert len(called) >= 25
    for name, is_call in called.items():
        if name in ("coordinator", "block_pool"):
            continue  # internals: the views below serve what the scheduler reads
        ours = inspect.getattr_static(pkv.PagedKVCacheManager, name, None)
        if ours is None:
            # Instance attributes (set in __init__) are checked on an instance below.
            assert not is_call, f"PagedKVCacheManager lacks method {name}"
            continue
        theirs = inspect.getattr_static(KVCacheManager, name, None)
        assert theirs is not None, f"vLLM's KVCacheManager no longer has {name}"
        if isinstance(theirs, property):
            assert isinstance(ours, property), name
            continue
        assert _shape(ours) == _shape(theirs), (
            f"{name}: ours {inspect.signature(ours)} != vLLM's {inspect.signature(theirs)}"
        )
    assert _shape(pkv.PagedKVCacheManager.__init__) == _shape(KVCacheManager.__init__)


def test_scheduler_cls_selects_pagedkv_and_block_ids_skip_the_null_block() -> None:
    config = _config()
    sched = vllm_traces.make_scheduler(config, pagedkv=True)
    assert type(sched) is pkv.PagedKVScheduler
    manager = sched.kv_cache_manager
    assert isinstance(manager, pkv.PagedKVCacheManager)
    # Every member the scheduler reads exists on the instance (attributes included).
    for name in _scheduler_members_called():
        assert hasattr(manager, name), name
    assert manager.pagedkv_manager.stats().num_blocks == config.num_blocks - 1
    seen: set[int] = set()
    reqs = [NewRequest(f"r{i}", [7, 8, 9, 10, 11, 12, 13, i], 6) for i in range(4)]
    for r in reqs:
        sched.add_request(vllm_traces.make_request(r, config.block_size))
    for _ in range(20):
        out = sched.schedule()
        for rid in out.num_scheduled_tokens:
            seen.update(manager.get_block_ids(rid)[0])
        sched.update_from_output(out, vllm_traces.model_output(sched, out))
        manager.pagedkv_manager.check_invariants()
    assert not sched.has_unfinished_requests()
    assert seen and min(seen) >= 1 and max(seen) <= config.num_blocks - 1
    assert manager.usage == 0.0


def test_prefix_hit_and_events_through_the_scheduler() -> None:
    config = _config()
    sched = vllm_traces.make_scheduler(config, pagedkv=True)
    prompt = list(range(100, 113))  # 3 full blocks of 4, and one token
    sched.add_request(vllm_traces.make_request(NewRequest("a", prompt, 1), 4))
    out = sched.schedule()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 0
    sched.update_from_output(out, vllm_traces.model_output(sched, out))
    stored = [e for e in sched.recorded_events if type(e).__name__ == "BlockStored"]
    assert [t for e in stored for t in e.token_ids] == prompt[:12]
    assert all(isinstance(h, bytes) and len(h) == 16 for e in stored for h in e.block_hashes)
    sched.add_request(vllm_traces.make_request(NewRequest("b", prompt, 1), 4))
    out = sched.schedule()
    # "a" finished; "b" hits its 3 full blocks.
    assert out.scheduled_new_reqs[0].req_id == "b"
    assert out.scheduled_new_reqs[0].num_computed_tokens == 12
    assert out.num_scheduled_tokens["b"] == 1


def test_unknown_request_ids_behave_as_in_vllm() -> None:
    config = _config()
    stock = vllm_traces.make_scheduler(config, pagedkv=False).kv_cache_manager
    paged = vllm_traces.make_scheduler(config, pagedkv=True).kv_cache_manager
    for m in (stock, paged):
        assert m.get_block_ids("nope") == ([],)
        assert m.get_block_ids_for_computed_tokens("nope", 8) == ([],)
        assert m.get_blocks("nope").get_block_ids() == ([],)
    req = vllm_traces.make_request(NewRequest("x", [1, 2, 3], 1), 4)
    stock.free(req)  # a request that holds nothing: no error in either
    paged.free(req)
    assert paged.usage == stock.usage == 0.0


def test_token_ids_beyond_int32_are_refused_with_value_error() -> None:
    sched = vllm_traces.make_scheduler(_config(), pagedkv=True)
    with pytest.raises(ValueError, match=r"prompt_token_ids\[1\] = 2147483648 is outside the int32"):
        sched.add_request(vllm_traces.make_request(NewRequest("x", [1, 2**31, 3], 1), 4))
    assert not sched.has_unfinished_requests()
    # A sampled token beyond int32 reaches pagedkv at the next allocation: ValueError.
    sched.add_request(vllm_traces.make_request(NewRequest("y", [1, 2, 3], 4), 4))
    out = sched.schedule()
    from vllm.v1.outputs import ModelRunnerOutput

    bad = ModelRunnerOutput(req_ids=["y"], req_id_to_index={"y": 0}, sampled_token_ids=[[2**40]])
    sched.update_from_output(out, bad)
    with pytest.raises(ValueError, match="outside the int32 range"):
        sched.schedule()
    sched.kv_cache_manager.pagedkv_manager.check_invariants()


def test_zero_or_one_block_budget_is_a_value_error() -> None:
    for num_blocks in (0, 1):
        with pytest.raises(ValueError, match=r"num_blocks = %d: vLLM keeps block 0" % num_blocks):
            vllm_traces.make_scheduler(_config(num_blocks=num_blocks), pagedkv=True)


def test_unsupported_settings_are_refused_by_name() -> None:
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
        SlidingWindowSpec,
    )

    full = FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=16, dtype=torch.float32)
    swa = SlidingWindowSpec(
        block_size=4, num_kv_heads=2, head_size=16, dtype=torch.float32, sliding_window=8
    )
    hybrid = KVCacheConfig(
        num_blocks=16,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["a"], full), KVCacheGroupSpec(["b"], swa)],
    )
    # A hybrid of full-attention and sliding-window groups runs on one shared pagedkv pool,
    # as vLLM's groups share its block pool; a window without a full group is refused.
    manager = pkv.PagedKVCacheManager(hybrid, max_model_len=64, scheduler_block_size=4, hash_block_size=4)
    options = manager.pagedkv_manager.options
    assert options.shared_block_pool and not options.window_eviction_classes
    assert [g.kind for g in options.layer_groups] == [
        pk.AttentionKind.FULL,
        pk.AttentionKind.SLIDING_WINDOW,
    ]
    assert manager.block_pool.get_num_free_blocks() == 15  # one pool, vLLM's null block out
    only_window = KVCacheConfig(
        num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["b"], swa)]
    )
    with pytest.raises(NotImplementedError, match="sliding-window groups without a full-attention"):
        pkv.PagedKVCacheManager(only_window, max_model_len=64, scheduler_block_size=4, hash_block_size=4)
    mamba = KVCacheConfig(
        num_blocks=16,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["m"],
                MambaSpec(block_size=4, shapes=((2, 2),), dtypes=(torch.float32,)),
            )
        ],
    )
    with pytest.raises(NotImplementedError, match="MambaSpec"):
        pkv.PagedKVCacheManager(mamba, max_model_len=64, scheduler_block_size=4, hash_block_size=4)
    single = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["a"], full)])
    with pytest.raises(NotImplementedError, match="speculative decoding"):
        pkv.PagedKVCacheManager(
            single, max_model_len=64, scheduler_block_size=4, hash_block_size=4, use_eagle=True
        )
    manager = pkv.PagedKVCacheManager(single, max_model_len=64, scheduler_block_size=4, hash_block_size=4)
    assert manager.take_events() == []  # events off, as in vLLM's default
    with pytest.raises(NotImplementedError, match="coordinator.find_longest_cache_hit"):
        manager.coordinator.find_longest_cache_hit
    with pytest.raises(NotImplementedError, match="block_pool.free_blocks"):
        manager.block_pool.free_blocks
    assert manager.block_pool.get_num_free_blocks() == 15


@contextlib.contextmanager
def _test_config_with(path: str, value: object) -> Iterator[Any]:
    """The test VllmConfig with attribute `path` ("a" or "a.b") set to `value`, restored on
    exit (vllm_config() caches the config)."""
    config = _config()
    vc = vllm_traces.vllm_config(
        config.block_size, config.num_blocks, config.max_num_seqs,
        config.max_num_batched_tokens, config.max_model_len, True, 0.0,
        vllm_traces.PAGEDKV_SCHEDULER,
    )
    *parents, name = path.split(".")
    owner = functools.reduce(getattr, parents, vc)
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield vc
    finally:
        setattr(owner, name, old)


def _scheduler(vc: Any) -> Any:
    from vllm.v1.structured_output import StructuredOutputManager

    return pkv.PagedKVScheduler(
        vllm_config=vc,
        kv_cache_config=vllm_traces.kv_cache_config(4, 33),
        structured_output_manager=StructuredOutputManager(vc),
        block_size=4,
    )


def test_async_scheduling_is_refused() -> None:
    with _test_config_with("scheduler_config.async_scheduling", True) as vc:
        with pytest.raises(NotImplementedError, match="async scheduling"):
            _scheduler(vc)


def test_diffusion_models_are_refused() -> None:
    """vLLM schedules a diffusion canvas as speculative tokens (its DiffusionScheduler)."""
    from vllm.config import DiffusionConfig

    with _test_config_with("diffusion_config", DiffusionConfig(canvas_length=8)) as vc:
        assert vc.num_speculative_tokens == 8
        with pytest.raises(NotImplementedError, match="diffusion models"):
            _scheduler(vc)


def test_reset_prefix_cache_refuses_while_blocks_are_held_as_vllm_does() -> None:
    config = _config()
    for pagedkv in (False, True):
        sched = vllm_traces.make_scheduler(config, pagedkv=pagedkv)
        sched.add_request(vllm_traces.make_request(NewRequest("a", list(range(9)), 3), 4))
        out = sched.schedule()
        sched.update_from_output(out, vllm_traces.model_output(sched, out))
        assert sched.kv_cache_manager.reset_prefix_cache() is False
        while sched.has_unfinished_requests():
            out = sched.schedule()
            sched.update_from_output(out, vllm_traces.model_output(sched, out))
        sched.recorded_events.clear()
        assert sched.kv_cache_manager.reset_prefix_cache() is True
        assert [type(e).__name__ for e in sched.kv_cache_manager.take_events()] == ["AllBlocksCleared"]
