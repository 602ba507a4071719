"""vLLM 0.33.0's own scheduler tests (tests/v1/core/test_scheduler.py) on PagedKVScheduler.

No vLLM test code is copied into this repository (vLLM is Apache-2.0; the wheel does not
ship its tests). PAGEDKV_VLLM_SRC names a directory with vLLM 0.33.0's tests/: that of its
PyPI sdist, which scripts/ml-venv.d/vllm-tests.sh downloads once (sha256-checked) into the
ML environment and scripts/test-integrations.sh sets by default, or a checkout of tag
v0.33.0:

    bash scripts/test-integrations.sh -k upstream -rs
    PAGEDKV_VLLM_SRC=/path/to/vllm-0.33.0 bash scripts/test-integrations.sh -k upstream -rs

This module imports the directory's tests/v1/core/utils.py and test_scheduler.py as the
package `tests.v1.core`, swaps the scheduler class their `create_scheduler()` builds for
`PagedKVScheduler` (and vLLM's `Scheduler` name in the test module, for tests that build
one themselves), points the default model (facebook/opt-125m) of both modules'
`ModelConfig` at a local config of the same shape so that the tests build offline (no
tokenizer: skip_tokenizer_init), and re-exports the test functions as this module's. A test
runs when its source uses only what the adapter serves: the scheduler and the manager's
public calls. The others are reported skipped with the rule and the marker that excluded
them (`-rs`; EXCLUSIONS, docs/vllm.md "vLLM's own scheduler tests"): they read vLLM's
manager internals (block pool, coordinator), or use a feature the adapter refuses
(docs/vllm.md, "Not supported"). Without PAGEDKV_VLLM_SRC, torch or vLLM the module
reports skipped.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import tempfile
import types
from typing import Any, Callable

import pytest

pytest.importorskip("torch", reason="the vLLM tests need torch (bash scripts/test-integrations.sh)")
pytest.importorskip("vllm", reason="the vLLM tests need vLLM 0.33.0 (bash scripts/test-integrations.sh)")

SRC = os.environ.get("PAGEDKV_VLLM_SRC", "")
CORE = os.path.join(SRC, "tests", "v1", "core")
if not SRC or not os.path.isfile(os.path.join(CORE, "test_scheduler.py")):
    pytest.skip(
        "PAGEDKV_VLLM_SRC does not name vLLM 0.33.0's sources with "
        "tests/v1/core/test_scheduler.py (scripts/ml-venv.d/vllm-tests.sh; this module's "
        "docstring)",
        allow_module_level=True,
    )

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from pagedkv.integrations.vllm import PagedKVCacheManager, PagedKVScheduler  # noqa: E402

# Why a test is not run: the first of these whose marker its source contains. Markers are
# plain text of the test's source (its body and decorators).
EXCLUSIONS: list[tuple[str, tuple[str, ...]]] = [
    (
        "reads vLLM's KVCacheManager internals (block pool, coordinator, per-request "
        "block maps), which PagedKVCacheManager serves only for what the scheduler reads",
        (
            ".block_pool.",
            ".coordinator",
            "single_type_manager",
            "req_to_blocks",
            "num_cached_block",
            "free_block_queue",
            "cached_block_hash_to_block",
            "block_hash_to_block",
            "kv_cache_manager.blocks",
        ),
    ),
    (
        "KV connectors (P/D, offloading): not supported by the adapter",
        (
            "use_kv_connector",
            "mock_kv",
            "KVTransferConfig",
            "kv_connector",
            "connector",
            # test_scheduler.py's builder of a scheduler with a MockKVConnector.
            "_setup_remote_kv_resume(",
        ),
    ),
    (
        # vLLM's DiffusionScheduler / DiffusionAsyncScheduler (scheduler_cls=...): they
        # schedule the canvas as speculative tokens, and the adapter refuses
        # diffusion_config; before the async rule, which "DiffusionAsyncScheduler" matches.
        "diffusion models (vLLM's DiffusionScheduler): not supported by the adapter",
        ("DiffusionScheduler", "DiffusionAsyncScheduler", "_diffusion_scheduler("),
    ),
    (
        "speculative decoding: not supported by the adapter",
        (
            "num_speculative_tokens",
            "SpeculativeConfig",
            "spec_token",
            "eagle",
            "draft",
            # A request block hasher with lookahead tokens (the drafter's lookahead
            # hashing: a block is published only once the token after it exists);
            # pagedkv hashes a block's own tokens when it fills.
            "get_request_block_hasher(block_size, sha256, 1)",
        ),
    ),
    ("async scheduling: not supported by the adapter", ("async_scheduling=True", "AsyncScheduler")),
    (
        # Before the hybrid rule: test_scheduler.py's encoder-decoder builder has a
        # CrossAttentionSpec group beside a FullAttentionSpec one.
        "encoder-decoder models (cross-attention KV cache groups): not supported by the adapter",
        ("CrossAttentionSpec", "_create_encoder_decoder_scheduler(", "_get_num_cross_attn_blocks("),
    ),
    (
        # Their hybrids are Mamba ones, and their one sliding-window case has no
        # full-attention group (and a KV connector).
        "Mamba KV cache groups, or sliding-window ones without a full-attention group: not "
        "supported by the adapter",
        ("MambaSpec", "SlidingWindowSpec", "HybridKVCacheCoordinator", "KVCacheGroupSpec"),
    ),
    ("encoder cache transfer (EC connectors)", ("ECTransferConfig", "ec_connector")),
    ("a model other than the default needs its Hugging Face config (offline)", ("model=",)),
    (
        "structured outputs need the model's tokenizer (offline: skip_tokenizer_init)",
        ("StructuredOutputsParams", "structured_output", "grammar"),
    ),
    ("pipeline parallelism", ("pipeline_parallel",)),
]

DEFAULT_MODEL = "facebook/opt-125m"


@functools.lru_cache(maxsize=1)
def _default_model_dir() -> str:
    """facebook/opt-125m's config (transformers' OPTConfig defaults), saved locally."""
    from transformers import OPTConfig

    d = os.path.join(tempfile.gettempdir(), f"pagedkv-vllm-opt125m-{os.getuid()}")
    if not os.path.exists(os.path.join(d, "config.json")):
        OPTConfig(architectures=["OPTForCausalLM"]).save_pretrained(d)
    return d


def _offline_model_config(model_config_cls: Any) -> Callable[..., Any]:
    def build(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("model", DEFAULT_MODEL) == DEFAULT_MODEL:
            kwargs["model"] = _default_model_dir()
        kwargs["skip_tokenizer_init"] = True
        return model_config_cls(*args, **kwargs)

    return build


def _assert_scheduler_empty(scheduler: Any) -> None:
    """test_scheduler.py's leak check (assert_scheduler_empty), its KV cache part on pagedkv.

    vLLM's reads its manager's internals (req_to_blocks, num_cached_block, the block
    pool's free queue and every block's ref_cnt); the same facts here are pagedkv's: no
    sequence left, every block free (vLLM's num_gpu_blocks - 1: block 0 is the null
    block), and the pools' invariants. The scheduler part is vLLM's, unchanged.
    """
    assert len(scheduler.requests) == 0
    assert len(scheduler.waiting) == 0
    assert len(scheduler.running) == 0
    assert len(scheduler.finished_req_ids) == 0
    assert len(scheduler.encoder_cache_manager.freed) == 0
    assert len(scheduler.encoder_cache_manager.cached) == 0
    kv = scheduler.kv_cache_manager
    assert isinstance(kv, PagedKVCacheManager)
    manager = kv.pagedkv_manager
    assert manager.num_sequences() == 0
    stats = manager.stats()
    assert stats.used_blocks == 0
    assert stats.free_blocks == stats.num_blocks == kv.kv_cache_config.num_blocks - 1
    assert kv.block_pool.get_num_free_blocks() == kv.kv_cache_config.num_blocks - 1
    manager.check_invariants()


def _load_upstream() -> types.ModuleType:
    """vLLM's tests/v1/core as package `tests.v1.core` (its modules import their helpers as
    `tests.v1...`), patched."""
    loaded = sys.modules.get("tests")
    if loaded is not None and os.path.join(SRC, "tests") not in list(getattr(loaded, "__path__", [])):
        raise ImportError(f"a package named 'tests' is already imported from {loaded!r}")
    if SRC not in sys.path:
        sys.path.insert(0, SRC)
    utils = importlib.import_module("tests.v1.core.utils")
    utils.Scheduler = PagedKVScheduler
    if hasattr(utils, "ModelConfig"):
        utils.ModelConfig = _offline_model_config(utils.ModelConfig)
    module = importlib.import_module("tests.v1.core.test_scheduler")
    module.Scheduler = PagedKVScheduler
    # Its own builders (create_scheduler_with_priority(), ...) construct ModelConfig too.
    if hasattr(module, "ModelConfig"):
        module.ModelConfig = _offline_model_config(module.ModelConfig)
    if hasattr(module, "assert_scheduler_empty"):
        module.assert_scheduler_empty = _assert_scheduler_empty
    return module


# pytest's own fixtures; vLLM's conftest.py fixtures are not loaded here.
BUILTIN_FIXTURES = {"monkeypatch", "tmp_path", "tmp_path_factory", "capsys", "caplog", "request"}


def _missing_fixtures(fn: Callable[..., Any]) -> list[str]:
    parametrized: set[str] = set()
    for mark in getattr(fn, "pytestmark", ()):
        if mark.name == "parametrize":
            names = mark.args[0]
            parametrized.update(
                n.strip() for n in (names.split(",") if isinstance(names, str) else names)
            )
    params = inspect.signature(fn).parameters
    return [p for p in params if p not in parametrized and p not in BUILTIN_FIXTURES]


def exclusion(fn: Callable[..., Any]) -> str | None:
    """Why the upstream test `fn` is not run, or None."""
    source = inspect.getsource(fn)
    for reason, markers in EXCLUSIONS:
        hit = next((m for m in markers if m in source), None)
        if hit is not None:
            return f"{reason} (its source has {hit!r})"
    missing = _missing_fixtures(fn)
    if missing:
        return f"needs fixtures of vLLM's conftest.py: {', '.join(missing)}"
    return None


def _export(module: types.ModuleType) -> dict[str, list[str]]:
    ran: list[str] = []
    excluded: list[str] = []
    for name, fn in vars(module).items():
        if not name.startswith("test_") or not inspect.isfunction(fn):
            continue
        reason = exclusion(fn)
        if reason is not None:
            fn = pytest.mark.skip(reason=f"upstream {name}: {reason}")(fn)
            excluded.append(name)
        else:
            ran.append(name)
        globals()[name] = fn
    return {"ran": ran, "excluded": excluded}


SELECTION = _export(_load_upstream())


def test_upstream_selection_runs_some_tests() -> None:
    """The selection is not empty (a renamed helper would silently exclude everything)."""
    print(f"vLLM test_scheduler.py: {len(SELECTION['ran'])} run, "
          f"{len(SELECTION['excluded'])} excluded")
    assert SELECTION["ran"], SELECTION
