"""Tiny random-weight transformers models, built offline from their config classes, and the
reference computations (transformers' eager attention) the integration tests compare with.

Every model: vocabulary 128, hidden 64, 2 layers, 4 query heads and 2 KV heads of head_dim
64 (pagedkv's kernels take 64, 128 or 256), weights drawn with std 0.1 (the default 0.02
gives near-uniform logits, whose argmax ties would make greedy comparisons meaningless), no
eos token (generation always runs max_new_tokens).
"""

import copy

import torch
import transformers

VOCAB = 128

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=64, eos_token_id=None,
              bos_token_id=None, pad_token_id=None, tie_word_embeddings=False,
              initializer_range=0.1)

HYBRID = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=8)


def _configs():
    return {
        "llama": lambda: transformers.LlamaConfig(**COMMON),
        "mistral": lambda: transformers.MistralConfig(**COMMON, sliding_window=8),
        "qwen3": lambda: transformers.Qwen3Config(**COMMON),
        "gemma3": lambda: transformers.Gemma3TextConfig(**COMMON, **HYBRID,
                                                        query_pre_attn_scalar=64),
        "gpt_oss": lambda: transformers.GptOssConfig(**COMMON, **HYBRID, num_local_experts=4,
                                                     num_experts_per_tok=2),
        # MLA: a latent of 48 + 16 per token (the extend kernel's head_dim 64), 4 heads of
        # q/k 32 + 16 and v 32; the second layer a mixture of 4 routed experts (2 per token).
        "deepseek_v3": lambda: transformers.DeepseekV3Config(
            **{**COMMON, "head_dim": None, "num_key_value_heads": 4}, kv_lora_rank=48,
            q_lora_rank=None, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
            n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
            first_k_dense_replace=1, n_group=1, topk_group=1),
        # A Gated DeltaNet layer (its conv and recurrent state in pagedkv's state slots) and
        # a gated full-attention layer; mixtures of 4 experts (2 per token).
        "qwen3_next": lambda: transformers.Qwen3NextConfig(
            **COMMON, layer_types=["linear_attention", "full_attention"],
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64),
    }


ARCHITECTURES = list(_configs())


def build(arch, dtype=torch.float32, seed=0, smooth_routing=False):
    """The architecture's tiny model in eval mode with eager attention, in `dtype`.
    smooth_routing: a mixture of experts routes every token to all its experts (top-k
    routing is discontinuous: bf16 rounding flips expert choices and moves logits by whole
    units, in transformers' eager attention as much as in pagedkv's)."""
    config = _configs()[arch]()
    if smooth_routing:
        experts = (getattr(config, "num_local_experts", None)
                   or getattr(config, "n_routed_experts", None)
                   or getattr(config, "num_experts", None))
        if experts:
            config.num_experts_per_tok = experts
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    if arch == "gpt_oss":
        # Sinks are initialized near zero (std 0.1); spread them so that they matter.
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 1.0)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model.to(dtype).eval()


def eager_copy(model):
    """An independent copy of `model` with transformers' eager attention (the reference)."""
    ref = copy.deepcopy(model)
    ref.set_attn_implementation("eager")
    return ref


def prompts(num, seed, shared_prefix=37, min_suffix=3, max_suffix=24):
    """`num` prompts sharing their first `shared_prefix` tokens (two groups share a longer
    prefix still), with distinct suffixes of random lengths."""
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, VOCAB, (shared_prefix,), generator=g).tolist()
    branch = torch.randint(0, VOCAB, (20,), generator=g).tolist()
    out = []
    for i in range(num):
        n = int(torch.randint(min_suffix, max_suffix + 1, (1,), generator=g))
        suffix = torch.randint(0, VOCAB, (n,), generator=g).tolist()
        out.append(prefix + (branch if i % 2 else []) + suffix)
    return out


def eager_greedy(ref, prompt, max_new_tokens):
    """transformers' greedy generate (eager attention, its DynamicCache), one prompt alone
    (no padding), and the logits of every generated token."""
    with torch.no_grad():
        out = ref.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens,
                           do_sample=False, output_scores=True, output_logits=True,
                           return_dict_in_generate=True)
    tokens = out.sequences[0, len(prompt):].tolist()
    logits = torch.stack([l[0] for l in out.logits]).float()
    return tokens, logits


def eager_logits(ref, tokens):
    """Logits of a full forward pass (no cache) over `tokens`: row i predicts token i+1."""
    with torch.no_grad():
        return ref(torch.tensor([tokens])).logits[0].float()
