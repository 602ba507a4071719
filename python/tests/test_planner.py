"""The capacity planner from Python: pagedkv.plan_capacity (docs/planner.md), on the
public config.json fixtures of tests/planner/fixtures. Figures as
tests/planner/capacity_plan_test.cc works them out."""

import pathlib

import pytest

import pagedkv

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "tests" / "planner" / "fixtures"
GEMMA = FIXTURES / "google--gemma-3-27b-it" / "excerpt.json"

pytestmark = pytest.mark.skipif(
    not hasattr(pagedkv, "plan_capacity"), reason="built without the planner (nlohmann-json)"
)


def gemma_plan(**kwargs):
    if not GEMMA.exists():
        pytest.skip(f"fixture {GEMMA} is absent")
    return pagedkv.plan_capacity(str(GEMMA), 64 << 30, **kwargs)


def test_gemma_pools_and_vllm_waste():
    plan = gemma_plan(target_tokens=32768, lengths=[4096, 32768])
    assert plan["model_type"] == "gemma3_text"
    groups = plan["groups"]
    assert [g["kind"] for g in groups] == ["sliding_window", "full"]
    assert [g["layers"] for g in groups] == [52, 10]
    assert [g["bytes_per_token"] for g in groups] == [425984, 81920]
    assert [g["num_blocks"] for g in groups] == [1447, 44903]
    assert plan["padding_bytes"] == 0
    assert plan["lost_bytes"] == 1835008
    assert plan["waste_fraction"] <= 0.02
    assert plan["vllm"]["padding_layers"] == 8
    assert plan["vllm"]["waste_fraction"] == pytest.approx(0.0216036, rel=1e-5)
    at_32k = plan["lengths"][1]
    assert at_32k["tokens"] == 32768
    assert at_32k["sequences"] == 21
    assert at_32k["held_bytes"] == at_32k["min_bytes"] == 3120562176


def test_kv_dtype_and_errors():
    plan = gemma_plan(kv_dtype="fp8", target_tokens=32768)
    assert plan["kv_dtype"] == "fp8"
    assert plan["groups"][0]["bytes_per_token"] == 425984 // 2
    with pytest.raises(ValueError, match="KV dtype 'int4' is not one of"):
        gemma_plan(kv_dtype="int4")
    with pytest.raises(ValueError, match="target length is 200000 tokens"):
        gemma_plan(target_tokens=200000)
    with pytest.raises(KeyError, match="cannot open config"):
        pagedkv.plan_capacity("/nonexistent/config.json", 1 << 30)


def test_latent_spec():
    spec = pagedkv.KvCacheSpec(num_layers=61, num_kv_heads=1, head_dim=576, latent=True)
    assert spec.latent
    assert spec.bytes_per_token() == 70272
