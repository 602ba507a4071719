"""The C++ decode loop on a Hugging Face checkpoint: a tiny random-weight Llama built and
saved by transformers (config.json, model.safetensors) is loaded by pagedkv-decode
(--checkpoint, examples/decode_loop/checkpoint.h), which serves prompts that share a
prefix on pagedkv's paged cache and kernels and writes the logits each greedy token was
chosen from (--logits-out). transformers' own forward over the same tokens must give the
same logits within 1e-4 (fp32), and the same greedy tokens."""

import json
import os
import subprocess

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: run bash "
                            "scripts/test-integrations.sh (its environment has it)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed: run "
                                   "bash scripts/test-integrations.sh")

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
DECODE = os.environ.get("PAGEDKV_DECODE_LOOP",
                        os.path.join(ROOT, "build", "examples", "decode_loop", "pagedkv-decode"))
if not os.access(DECODE, os.X_OK):
    pytest.skip(f"{DECODE} is not built (bash scripts/test.sh builds it; PAGEDKV_DECODE_LOOP "
                "names another)", allow_module_level=True)

NEW_TOKENS = 24


def save_tiny_llama(path, dtype=torch.float32, tie=False):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
        rms_norm_eps=1e-5, tie_word_embeddings=tie,
        # Weights larger than the default 0.02 so that logits are peaked and greedy choices
        # are not near ties.
        initializer_range=0.15)
    model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    model.save_pretrained(path, safe_serialization=True)
    return model


def prompts():
    shared = [(7 * i + 3) % 512 for i in range(40)]  # a 40-token prefix every prompt shares
    return [shared + [(11 * i + 5 * p) % 512 for i in range(3 + p)] for p in range(8)]


def run_decode(checkpoint, tmp_path, extra=()):
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("".join(" ".join(map(str, p)) + "\n" for p in prompts()))
    out = tmp_path / "logits.jsonl"
    run = subprocess.run(
        [DECODE, f"--checkpoint={checkpoint}", f"--prompts={prompt_file}",
         f"--max_new_tokens={NEW_TOKENS}", f"--logits_out={out}", "--verify=all",
         "--device=cpu", *extra], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout, [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.parametrize("tie", [False, True], ids=["lm_head", "tied_embeddings"])
def test_cpp_loader_logits_match_transformers(tmp_path, tie):
    model = save_tiny_llama(tmp_path / "ckpt", tie=tie)
    summary, sequences = run_decode(tmp_path / "ckpt", tmp_path)
    assert len(sequences) == len(prompts())
    assert "prefix" in summary
    worst = 0.0
    for seq in sorted(sequences, key=lambda s: s["request"]):
        n = seq["prompt_len"]
        assert seq["tokens"][:n] == prompts()[seq["request"]]
        with torch.no_grad():
            logits = model(torch.tensor([seq["tokens"]])).logits[0]
        # Row i of the C++ logits chose token n + i, from the logits at position n + i - 1.
        ours = torch.tensor(seq["logits"], dtype=torch.float32)
        theirs = logits[n - 1:n - 1 + NEW_TOKENS]
        worst = max(worst, (ours - theirs).abs().max().item())
        assert seq["tokens"][n:] == theirs.argmax(-1).tolist()
    print(f"tie_word_embeddings={tie}: max |logit difference| {worst:.2e} over "
          f"{len(sequences)} sequences x {NEW_TOKENS} tokens")
    assert worst < 1e-4


def test_cpp_loader_reads_bf16_weights(tmp_path):
    save_tiny_llama(tmp_path / "ckpt", dtype=torch.bfloat16)
    _, sequences = run_decode(tmp_path / "ckpt", tmp_path)
    # The C++ model computes in fp32 from the bf16 weights: so does transformers' model of
    # the same file loaded as fp32 (its RoPE frequencies computed in fp32, not rounded).
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "ckpt",
                                                          dtype=torch.float32).eval()
    for seq in sequences:
        n = seq["prompt_len"]
        with torch.no_grad():
            logits = model(torch.tensor([seq["tokens"]])).logits[0][n - 1:n - 1 + NEW_TOKENS]
        assert (torch.tensor(seq["logits"]) - logits).abs().max().item() < 1e-4


def test_cpp_loader_refuses_what_it_cannot_run(tmp_path):
    save_tiny_llama(tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    config["attention_bias"] = True
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    run = subprocess.run([DECODE, f"--checkpoint={tmp_path / 'ckpt'}", "--device=cpu"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "attention_bias is true: the model has no biases" in run.stderr
