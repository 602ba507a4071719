"""Hugging Face transformers models generating on pagedkv (pagedkv.integrations.transformers):
tiny random-weight Llama, Mistral (sliding window), Qwen3, Gemma 3 (sliding + full layers),
gpt-oss (sliding + full layers, attention sinks), DeepSeek-V3 (MLA: the cache holds the
latent) and Qwen3-Next (Gated DeltaNet layers: their state in pagedkv's state slots, with
checkpoints for prefix hits), built offline from their config classes, against
transformers' own eager attention on the same weights.

- fp32: greedy tokens identical to transformers' `generate` over 64 new tokens for a batch
  of 10 prompts with shared prefixes (continuous batching, prefix hits); teacher-forced
  logits within 1e-4 of a full eager forward pass while samples fork (copy-on-write), the
  pool is too small for the batch (preemption by recompute) and a running sequence is
  preempted on purpose.
- bf16: the same runs, logits within a bound derived from transformers' own bf16 error, and
  greedy tokens identical up to near ties (reported).

Run with `bash scripts/test-integrations.sh` (the ML environment of scripts/ml-venv.sh); they
skip where torch or transformers is missing (the README's test command).
"""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tiny models are built from configs: no hub
torch = pytest.importorskip(
    "torch", reason="torch is not installed: run bash scripts/test-integrations.sh "
    "(its environment, scripts/ml-venv.sh, has torch and transformers)")
transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed: run bash "
    "scripts/test-integrations.sh")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip(f"transformers {transformers.__version__} has no AttentionMaskInterface "
                "registry as used here: these tests need transformers >= 5",
                allow_module_level=True)

import hf_models as hf  # noqa: E402

import pagedkv.integrations.transformers as pkt  # noqa: E402

# The tiny models are latency-bound: extra intra-op threads only contend (2-core machine).
torch.set_num_threads(1)

NEW_TOKENS = 64
FP32_LOGIT_TOL = 1e-4
WINDOWED = {"mistral", "gemma3", "gpt_oss"}


def windowed_group(engine):
    """The index of the engine's sliding-window layer group."""
    return next(g for g, w in enumerate(engine.windows) if w)


def check_window_released(arch, engine):
    """Windowed models: blocks behind the window were released. Linear attention: state
    checkpoints were saved mid-computation and prefix hits restored them."""
    if arch in WINDOWED:
        released = engine.manager.group_stats(windowed_group(engine)).released_blocks
        assert released > 0, "the sliding-window group released no block behind its window"
    if arch == "qwen3_next":
        stats = engine.manager.group_stats(engine.state_group)
        print(f"{arch}: {stats.checkpoints_saved} state checkpoints saved, "
              f"{stats.checkpoints_restored} restored by prefix hits")
        assert stats.checkpoints_saved > 0 and stats.checkpoints_restored > 0


def run_with_preemption(engine, preempt_at_step=6):
    """Steps to completion, preempting the oldest running sequence once (at a step where it
    is decoding), as an engine would under external pressure."""
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
        if steps == preempt_at_step:
            assert engine.running, "nothing running to preempt"
            engine.preempt(engine.running[0])
    return steps


def without_window(ref):
    """A copy of the eager reference whose sliding windows exceed every context."""
    other = hf.eager_copy(ref)
    other.config.sliding_window = 1 << 20
    for layer in other.model.layers:
        if getattr(layer.self_attn, "sliding_window", None):
            layer.self_attn.sliding_window = 1 << 20
    return other


def without_sinks(ref):
    other = hf.eager_copy(ref)
    with torch.no_grad():
        for layer in other.model.layers:
            layer.self_attn.sinks.fill_(float("-inf"))
    return other


# --- fp32 -------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", hf.ARCHITECTURES)
def test_fp32_greedy_equals_transformers_generate(arch):
    model = hf.build(arch)
    ref = hf.eager_copy(model)
    prompts = hf.prompts(10, seed=1)
    engine = pkt.PagedEngine(model, num_blocks=256, block_size=16, check_invariants=True,
                             state_checkpoint_interval_blocks=1)
    # The first prompt runs a step ahead: the others join the running batch and hit the
    # blocks (and, for linear attention, the state checkpoints) it computed.
    ids = [engine.add_request(prompts[0], max_new_tokens=NEW_TOKENS, return_logits=True)]
    engine.step()
    ids += [engine.add_request(p, max_new_tokens=NEW_TOKENS, return_logits=True)
            for p in prompts[1:]]
    engine.run()
    completions = [engine.completions[i] for i in ids]
    worst = 0.0
    for prompt, completion in zip(prompts, completions):
        tokens, logits = hf.eager_greedy(ref, prompt, NEW_TOKENS)
        assert completion.samples[0] == tokens, f"prompt of {len(prompt)} tokens"
        worst = max(worst, (completion.logits[0] - logits).abs().max().item())
    print(f"\n{arch} fp32 greedy: {len(prompts)} x {NEW_TOKENS} tokens identical, "
          f"max |logit diff| {worst:.2e}, prefix hits "
          f"{engine.manager.stats().prefix_hit_tokens} tokens")
    assert worst <= FP32_LOGIT_TOL
    assert engine.manager.stats().prefix_hit_tokens > 0  # the shared prefixes were reused
    assert engine.num_steps == NEW_TOKENS + 1  # continuous batching: one running batch
    check_window_released(arch, engine)
    if arch == "deepseek_v3":  # the cache holds one latent of 48 + 16 per token and layer
        spec = engine.storages[0].spec
        assert spec.latent and (spec.num_kv_heads, spec.head_dim) == (1, 64)


@pytest.mark.parametrize("arch", hf.ARCHITECTURES)
def test_fp32_teacher_forced_logits_with_forks_and_preemption(arch):
    """Two samples per prompt, each forced along its own continuation from the fork on
    (so the shared partial block is copied), in a pool too small for the batch."""
    model = hf.build(arch)
    ref = hf.eager_copy(model)
    prompts = hf.prompts(8, seed=2)
    g = torch.Generator().manual_seed(3)
    forced = [[torch.randint(0, hf.VOCAB, (NEW_TOKENS,), generator=g).tolist()
               for _ in range(2)] for _ in prompts]
    engine = pkt.PagedEngine(model, num_blocks=40, block_size=16, check_invariants=True,
                             state_checkpoint_interval_blocks=1)
    ids = [engine.add_request(p, max_new_tokens=NEW_TOKENS, n=2, forced_tokens=f,
                              return_logits=True) for p, f in zip(prompts, forced)]
    run_with_preemption(engine)
    worst, sensitivity = 0.0, []
    for rid, prompt, continuations in zip(ids, prompts, forced):
        completion = engine.completions[rid]
        for sample, continuation in enumerate(continuations):
            assert completion.samples[sample] == continuation
            full = prompt + continuation
            rows = slice(len(prompt) - 1, len(full) - 1)
            expected = hf.eager_logits(ref, full)[rows]
            worst = max(worst, (completion.logits[sample] - expected).abs().max().item())
    stats = engine.manager.stats()
    print(f"\n{arch} fp32 teacher-forced: max |logit diff| {worst:.2e}; "
          f"{engine.num_preempted} preemptions, {stats.cow_copies} copy-on-write copies, "
          f"{stats.prefix_hit_tokens} prefix-hit tokens, {engine.num_forks} forks")
    assert worst <= FP32_LOGIT_TOL
    assert engine.num_forks == len(prompts)
    assert stats.cow_copies > 0
    assert engine.num_preempted > 1  # the forced one and at least one for lack of blocks
    assert stats.prefix_hit_tokens > 0
    check_window_released(arch, engine)
    # The comparison can see what the kernels must get right: dropping the window (or the
    # sinks) moves the reference's logits far beyond the tolerance.
    full = prompts[0] + forced[0][0]
    if arch in WINDOWED:
        sensitivity.append((without_window(ref), "window"))
    if arch == "gpt_oss":
        sensitivity.append((without_sinks(ref), "sinks"))
    for other, what in sensitivity:
        moved = (hf.eager_logits(other, full) - hf.eager_logits(ref, full)).abs().max().item()
        assert moved > 100 * FP32_LOGIT_TOL, f"without {what} the logits moved only {moved}"


def test_fp32_sampled_forks_follow_the_models_distribution():
    """n = 3 samples at temperature 1: forks whose continuations diverge, each scored by
    the engine exactly as a full eager pass scores it; the same seed samples the same."""
    model = hf.build("llama")
    ref = hf.eager_copy(model)
    prompts = hf.prompts(8, seed=7)
    engine = pkt.PagedEngine(model, num_blocks=256, check_invariants=True)
    completions = engine.generate(prompts, max_new_tokens=32, n=3, temperature=1.0, seed=11,
                                  return_logits=True)
    worst = 0.0
    for prompt, completion in zip(prompts, completions):
        assert len({tuple(sample) for sample in completion.samples}) > 1  # they diverge
        for sample, logits in zip(completion.samples, completion.logits):
            expected = hf.eager_logits(ref, prompt + sample)[len(prompt) - 1:-1]
            worst = max(worst, (logits - expected).abs().max().item())
    assert worst <= FP32_LOGIT_TOL
    assert engine.manager.stats().cow_copies > 0
    again = pkt.PagedEngine(hf.eager_copy(model), num_blocks=256).generate(
        prompts, max_new_tokens=32, n=3, temperature=1.0, seed=11)
    assert [c.samples for c in again] == [c.samples for c in completions]


def test_fp32_windowed_model_without_prefix_caching_has_no_anchor_group():
    """Mistral without prefix caching: one sliding-window group (no full group to verify
    hits against), the same tokens as transformers."""
    model = hf.build("mistral")
    ref = hf.eager_copy(model)
    prompts = hf.prompts(8, seed=8)
    engine = pkt.PagedEngine(model, num_blocks=64, enable_prefix_caching=False,
                             check_invariants=True)
    assert engine.windows == [8] and engine.manager.num_groups() == 1
    completions = engine.generate(prompts, max_new_tokens=NEW_TOKENS)
    for prompt, completion in zip(prompts, completions):
        assert completion.samples[0] == hf.eager_greedy(ref, prompt, NEW_TOKENS)[0]
    assert engine.manager.stats().prefix_hit_tokens == 0
    assert engine.manager.group_stats(0).released_blocks > 0


# --- bf16 -------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", hf.ARCHITECTURES)
def test_bf16_logits_and_greedy_tokens_within_bf16_error(arch):
    """bf16 weights and cache. Bound: pagedkv's logits stay within twice transformers' own
    bf16 error (both against the fp32 model on the same weights) plus 0.02; greedy tokens
    are identical until a near tie (top-2 gap of the fp32 logits within that bound).
    The mixtures of experts (gpt-oss, DeepSeek-V3, Qwen3-Next) route each token to all 4
    experts here (see hf_models.build): with top-2 routing, bf16 flips expert choices and
    the logits of both implementations move by ~2."""
    model32 = hf.build(arch, smooth_routing=True)
    ref16 = hf.eager_copy(model32).to(torch.bfloat16)
    model16 = hf.eager_copy(model32).to(torch.bfloat16)
    prompts = hf.prompts(8, seed=4)
    g = torch.Generator().manual_seed(5)
    forced = [[torch.randint(0, hf.VOCAB, (NEW_TOKENS,), generator=g).tolist()
               for _ in range(2)] for _ in prompts]
    engine = pkt.PagedEngine(model16, num_blocks=40, block_size=16, check_invariants=True,
                             state_checkpoint_interval_blocks=1)
    ids = [engine.add_request(p, max_new_tokens=NEW_TOKENS, n=2, forced_tokens=f,
                              return_logits=True) for p, f in zip(prompts, forced)]
    run_with_preemption(engine)
    ours_err = theirs_err = ours_vs_theirs = 0.0
    for rid, prompt, continuations in zip(ids, prompts, forced):
        for sample, continuation in enumerate(continuations):
            full = prompt + continuation
            rows = slice(len(prompt) - 1, len(full) - 1)
            exact = hf.eager_logits(model32, full)[rows]
            theirs = hf.eager_logits(ref16, full)[rows]
            ours = engine.completions[rid].logits[sample]
            ours_err = max(ours_err, (ours - exact).abs().max().item())
            theirs_err = max(theirs_err, (theirs - exact).abs().max().item())
            ours_vs_theirs = max(ours_vs_theirs, (ours - theirs).abs().max().item())
    bound = 2 * theirs_err + 0.02
    print(f"\n{arch} bf16 teacher-forced (forks, preemption, prefix hits): max |logit "
          f"error| vs fp32 {ours_err:.3f} (transformers bf16 eager: {theirs_err:.3f}, "
          f"bound {bound:.3f}); pagedkv vs eager bf16 {ours_vs_theirs:.3f}")
    assert engine.num_preempted > 1 and engine.manager.stats().cow_copies > 0
    assert ours_err <= bound

    # Greedy: tokens equal to transformers' bf16 generate until a near tie.
    engine = pkt.PagedEngine(hf.eager_copy(model32).to(torch.bfloat16), num_blocks=256)
    greedy_prompts = hf.prompts(10, seed=6)
    completions = engine.generate(greedy_prompts, max_new_tokens=NEW_TOKENS)
    identical, ties = 0, []
    for prompt, completion in zip(greedy_prompts, completions):
        tokens, _ = hf.eager_greedy(ref16, prompt, NEW_TOKENS)
        ours = completion.samples[0]
        if ours == tokens:
            identical += 1
            continue
        i = next(i for i, (a, b) in enumerate(zip(ours, tokens)) if a != b)
        exact = hf.eager_logits(model32, prompt + tokens[:i])[-1]
        gap = abs(exact[ours[i]] - exact[tokens[i]]).item()
        ties.append((i, gap))
        assert gap <= bound, (f"greedy tokens differ at step {i} where the fp32 logits of the "
                              f"two choices are {gap:.3f} apart (bound {bound:.3f}): no near tie")
    print(f"{arch} bf16 greedy: {identical} of {len(greedy_prompts)} prompts identical over "
          f"{NEW_TOKENS} tokens; near ties (step, fp32 logit gap): {ties}")


# --- errors -------------------------------------------------------------------------------


def test_bad_models_and_requests_are_refused_naming_the_value():
    config = transformers.LlamaConfig(**{**hf.COMMON, "head_dim": 16})
    small = transformers.AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(ValueError, match="head_dim 16"):
        pkt.PagedEngine(small)

    model = hf.build("llama")
    engine = pkt.PagedEngine(model, num_blocks=2, block_size=16)
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.add_request([], max_new_tokens=4)
    with pytest.raises(ValueError, match="token 128 is outside the vocabulary"):
        engine.add_request([1, 128], max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens = 0"):
        engine.add_request([1, 2], max_new_tokens=0)
    with pytest.raises(ValueError, match="forced_tokens needs 2 lists"):
        engine.add_request([1, 2], max_new_tokens=4, n=2, forced_tokens=[[1, 2, 3, 4]])
    assert not engine.has_unfinished()  # a refused request leaves nothing behind

    # A prompt the pool can never hold (40 tokens, 2 blocks of 16) is refused with the fix.
    with pytest.raises(ValueError, match="needs 3 blocks of 16 tokens; the pool has 2"):
        engine.add_request(list(range(40)), max_new_tokens=4)
    assert not engine.has_unfinished() and not engine.requests and len(engine.manager) == 0

    # The model now calls pagedkv's attention, which needs the engine's step.
    with pytest.raises(RuntimeError, match="only inside PagedEngine.step"):
        with torch.no_grad():
            model(torch.tensor([[1, 2, 3]]))
    with pytest.raises(KeyError, match="not running"):
        engine.preempt(12345)
