"""Hugging Face transformers models on pagedkv's paged KV cache, scheduler and kernels.

`PagedEngine` runs a causal LM of transformers (Llama, Mistral, Qwen3, Gemma 3, gpt-oss,
DeepSeek-V3, Qwen3-Next and other models whose attention goes through
`AttentionInterface`) as a serving engine would:
continuous batching of many requests, each step one packed forward pass of the model over
the new tokens of every scheduled sequence (prompt chunks and decode tokens together).

- **Storage**: the K/V of every attention layer lives in pagedkv `KvStorage` pools, one
  storage per layer group (full attention, one per sliding-window size), the model's dtype.
- **Scheduling**: a `KvCacheManager` admits requests with prefix-cache hits
  (`match_prefix`), reserves slots every step (`allocate_slots_batch(..., preempt=True)`),
  forks sequences for n > 1 samples (copy-on-write of the shared partial block), preempts
  by recompute when blocks run out (the victim is re-admitted later and hits its own
  cached blocks), and releases sliding-window blocks behind the window.
- **Attention**: `register()` adds pagedkv's attention function to transformers'
  `AttentionInterface` under the name "pagedkv"; the model calls it per layer with the
  step's queries and new K/V (after RoPE). It writes the new K/V into the layer's pools
  through the step's slot mapping (`write_kv`) and runs `paged_decode_attention` (a step of
  decode tokens only) or `paged_extend_attention` over the block tables, with the layer's
  window and the module's attention sinks (gpt-oss). Causality and windows come from the
  kernels, so the model builds no dense mask: the mask function registered under the same
  name returns None.
- **MLA** (DeepSeek-V2/V3): the cache holds one latent per token (the compressed KV and the
  shared RoPE key), attended with absorbed queries (`paged_mla_decode`, and for prompts
  `paged_extend_attention` over the latent as one KV head).
- **Linear attention** (Qwen3-Next's Gated DeltaNet): a STATE layer group; each sequence's
  conv and recurrent state live in its slot of a state `KvStorage`, the model's own layer
  code runs per sequence on views of that slot, and the state checkpoints the manager
  asks for (`StepOps.save_state`) are copied at their exact positions, so prefix hits
  restore them (`copy_state`) and forks copy the parent's slot.

Example:

    import pagedkv.integrations.transformers as pkt
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    engine = pkt.PagedEngine(model, num_blocks=1024)
    for completion in engine.generate(prompts, max_new_tokens=64):
        print(completion.samples[0])

Not supported (refused with NotImplementedError): other state-space layers (Mamba), logit
soft-capping, bidirectional attention. The kernels take head_dim 64, 128 or 256 (MLA: the
latent, kv_lora_rank + qk_rope_head_dim, for prompts).
"""

from __future__ import annotations

import collections
import contextvars
import dataclasses
import functools
from typing import Optional, Sequence

import numpy as np
import torch

import pagedkv as pk

try:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "pagedkv.integrations.transformers needs transformers >= 5 "
        f"(AttentionInterface, AttentionMaskInterface): {e}") from e

ATTENTION_NAME = "pagedkv"

_TORCH_TO_PK = {
    torch.float32: pk.DType.FLOAT32,
    torch.float16: pk.DType.FLOAT16,
    torch.bfloat16: pk.DType.BFLOAT16,
}

# The step being computed: set by PagedEngine around its forward pass, read by the attention
# function (one per thread / task, so two engines in two threads do not mix).
_ACTIVE_STEP: contextvars.ContextVar[Optional["_StepBatch"]] = contextvars.ContextVar(
    "pagedkv_active_step", default=None)


# --- the attention function -------------------------------------------------------------


def paged_attention_forward(module, query, key, value, attention_mask, scaling=None,
                            dropout=0.0, sliding_window=None, softcap=None, s_aux=None,
                            **kwargs):
    """transformers' attention-function signature over pagedkv's paged cache.

    query [1, num_q_heads, T, head_dim], key / value [1, num_kv_heads, T, head_dim]: the T
    new tokens of the step's packed batch (after RoPE). Writes key / value into the layer's
    pools at the step's slots, then attends each sequence's new tokens to its whole context
    (cached prefix and new tokens, causal, within the layer's window). Returns
    ([1, T, num_q_heads, head_dim], None). `attention_mask` is ignored: the kernels mask by
    position and block table.
    """
    step = _ACTIVE_STEP.get()
    if step is None:
        raise RuntimeError(
            f"the '{ATTENTION_NAME}' attention implementation runs only inside "
            "PagedEngine.step(): the K/V cache and block tables of a step belong to a "
            "PagedEngine (use model.set_attn_implementation('eager') to run the model alone)")
    layer_idx = getattr(module, "layer_idx", None)
    layer = step.layers.get(layer_idx)
    if layer is None:
        raise ValueError(f"attention module {type(module).__name__} has layer_idx "
                         f"{layer_idx!r}, not an attention layer of this PagedEngine "
                         f"(layers {sorted(step.layers)})")
    group = layer[0]
    if dropout and module.training:
        raise NotImplementedError("pagedkv attention is for inference: call model.eval()")
    if softcap is not None or getattr(module, "attn_logit_softcapping", None) is not None:
        raise NotImplementedError(
            f"layer {layer_idx}: attention logit soft-capping is not supported by pagedkv's "
            "kernels")
    if not getattr(module, "is_causal", True):
        raise NotImplementedError(f"layer {layer_idx}: bidirectional attention is not supported")
    window = step.windows[group]
    if (sliding_window or 0) != window:
        raise ValueError(
            f"layer {layer_idx} attends with sliding_window={sliding_window}, but the engine "
            f"put it in a layer group with window {window or None} (from the config's "
            "layer_types / sliding_window)")
    if query.shape[0] != 1 or query.shape[2] != step.num_tokens:
        raise ValueError(f"layer {layer_idx}: query has shape {tuple(query.shape)}; the step "
                         f"packs {step.num_tokens} tokens as [1, heads, tokens, head_dim]")
    if step.mla is not None:
        return _mla_attention(step, module, query, key, layer_idx, group, scaling)
    if key.shape[-1] != value.shape[-1]:
        raise NotImplementedError(
            f"layer {layer_idx}: K head_dim {key.shape[-1]} != V head_dim {value.shape[-1]} "
            "outside an MLA model: not supported")
    k_cache, v_cache = step.caches[layer_idx]
    dtype = k_cache.dtype
    q = query[0].transpose(0, 1).to(dtype).contiguous()  # [T, num_q_heads, head_dim]
    k = key[0].transpose(0, 1).to(dtype).contiguous()
    v = value[0].transpose(0, 1).to(dtype).contiguous()
    pk.write_kv(k, v, step.slots[group], k_cache, v_cache)
    sinks = s_aux if s_aux is not None else getattr(module, "sinks", None)
    if sinks is not None:
        sinks = sinks.detach().to(torch.float32).contiguous()
    kind = pk.AttentionKind.SLIDING_WINDOW if window else pk.AttentionKind.FULL
    out = torch.empty_like(q)
    scale = float(scaling) if scaling is not None else 0.0
    if step.decode_only:
        pk.paged_decode_attention(q, k_cache, v_cache, step.block_tables[group],
                                  step.context_lens[group], out, sm_scale=scale,
                                  max_context_len=step.max_context_len, kind=kind,
                                  window=window, sinks=sinks)
    else:
        pk.paged_extend_attention(q, k_cache, v_cache, step.block_tables[group],
                                  step.context_lens[group], step.qo_indptr, out,
                                  sm_scale=scale, max_query_len=step.max_query_len, kind=kind,
                                  window=window, sinks=sinks)
    return out.to(query.dtype).unsqueeze(0), None


def _mla_attention(step, module, query, key, layer_idx, group, scaling):
    """Multi-head latent attention (DeepSeek-V2/V3) over the paged latent cache.

    The cache holds one latent per token: the normalized compressed KV (kv_lora_rank) and
    the shared RoPE key (qk_rope_head_dim), taken where the model computes them (a forward
    hook on kv_a_layernorm, and the RoPE part of the key it passes). Queries are absorbed:
    q_nope W_UK per head, then q_rope, so scores are scaling * q . latent; the output's
    first kv_lora_rank elements times W_UV are the heads' values. Decode runs
    paged_mla_decode; prompts run paged_extend_attention with the latent pool as both K
    and V (one KV head) and keep the first kv_lora_rank elements.
    """
    rank, nope, rope, v_dim = step.mla
    latent_nope = step.latents.pop(layer_idx, None)
    if latent_nope is None:
        raise RuntimeError(f"layer {layer_idx}: the compressed KV of this step was not "
                           "captured (no kv_a_layernorm hook ran)")
    latent_cache = step.caches[layer_idx][0]
    dtype, tokens = latent_cache.dtype, step.num_tokens
    # query [1, H, T, nope + rope]: the model's q_pass and RoPE'd q_rot.
    q_pass = query[0, :, :, :nope]
    q_rot = query[0, :, :, nope:]
    # key [1, H, T, nope + rope]: its last rope dims are the shared RoPE'd key of every head.
    k_rot = key[0, 0, :, nope:]
    latent = torch.cat([latent_nope.reshape(tokens, rank), k_rot.reshape(tokens, rope)],
                       dim=-1).to(dtype).reshape(tokens, 1, rank + rope).contiguous()
    pk.write_kv(latent, None, step.slots[group], latent_cache, None)
    w = module.kv_b_proj.weight.view(-1, nope + v_dim, rank)  # [H, nope + v, rank]
    w_uk, w_uv = w[:, :nope, :], w[:, nope:, :]
    q_abs = torch.einsum("htn,hnr->thr", q_pass, w_uk)
    q = torch.cat([q_abs, q_rot.transpose(0, 1)], dim=-1).to(dtype).contiguous()
    scale = float(scaling)
    if step.decode_only:
        out = q.new_empty(tokens, q.shape[1], rank)
        pk.paged_mla_decode(q, latent_cache, step.block_tables[group], step.context_lens[group],
                            out, kv_lora_rank=rank, sm_scale=scale,
                            max_context_len=step.max_context_len)
    else:
        out = torch.empty_like(q)
        pk.paged_extend_attention(q, latent_cache, latent_cache, step.block_tables[group],
                                  step.context_lens[group], step.qo_indptr, out,
                                  sm_scale=scale, max_query_len=step.max_query_len)
        out = out[..., :rank]
    values = torch.einsum("thr,hvr->thv", out.to(w.dtype), w_uv)  # [T, H, v_head_dim]
    return values.to(query.dtype).unsqueeze(0), None


class _SlotState:
    """The part of transformers' Cache that a Gated DeltaNet layer calls, over one
    sequence's state slot: conv [1, conv_dim, kernel] and recurrent [1, heads, dk, dv]
    views of pagedkv's state storage."""

    def __init__(self, conv, recurrent, has_previous_state):
        self.conv, self.recurrent = conv, recurrent
        self.has_previous_state = has_previous_state

    def get_conv_state(self, layer_idx, state_idx=0):
        return self.conv if self.has_previous_state else None

    def get_recurrent_state(self, layer_idx, state_idx=0):
        return self.recurrent if self.has_previous_state else None

    def is_recording_past(self, layer_idx):
        return False

    def update_conv_state(self, conv_states, layer_idx, state_idx=0, conv_kernel_size=None,
                          **kwargs):
        kernel = self.conv.shape[-1]
        if self.has_previous_state:
            full = torch.cat([self.conv.to(conv_states.dtype), conv_states], dim=-1)
        else:
            full = conv_states
            if full.shape[-1] < kernel:
                full = torch.nn.functional.pad(full, (kernel - full.shape[-1], 0), value=0)
        self.conv.copy_(full[..., -kernel:])
        return full

    def update_recurrent_state(self, recurrent_states, layer_idx, state_idx=0, **kwargs):
        self.recurrent.copy_(recurrent_states)
        return self.recurrent


def _linear_attention_forward(original, module, layer, hidden_states, cache_params=None,
                              attention_mask=None, **kwargs):
    """A Gated DeltaNet layer over the step's packed batch: the model's own forward per
    sequence (and per segment between state checkpoints), its state in the sequence's
    slot; a checkpoint the manager asked for (StepOps.save_state) is copied once the
    sequence has processed exactly its position."""
    step = _ACTIVE_STEP.get()
    if step is None:
        raise RuntimeError(
            f"layer {layer}: this linear-attention layer keeps its state in a PagedEngine's "
            "state slots and runs only inside PagedEngine.step()")
    conv, recurrent = step.states[layer]
    indptr = step.qo_indptr_host
    outputs = []
    for i, (start, slot) in enumerate(zip(step.starts, step.state_slots)):
        begin, end = indptr[i], indptr[i + 1]
        position = start
        saves = step.saves.get(i, [])
        cuts = sorted({p for p, _ in saves if start < p < start + end - begin})
        for cut_end in cuts + [start + end - begin]:
            for p, dst in saves:
                if p == position:
                    conv[dst].copy_(conv[slot])
                    recurrent[dst].copy_(recurrent[slot])
            state = _SlotState(conv[slot:slot + 1], recurrent[slot:slot + 1], position > 0)
            lo, hi = begin + position - start, begin + cut_end - start
            outputs.append(original(module, hidden_states[:, lo:hi], cache_params=state,
                                    **kwargs))
            position = cut_end
        for p, dst in saves:
            if p == position:
                conv[dst].copy_(conv[slot])
                recurrent[dst].copy_(recurrent[slot])
    return torch.cat(outputs, dim=1)


def _capture_latent(layer, output):
    step = _ACTIVE_STEP.get()
    if step is not None:
        step.latents[layer] = output


def _no_dense_mask(*args, **kwargs):
    """The mask function of the "pagedkv" implementation: the kernels mask by position."""
    return None


def register() -> str:
    """Registers pagedkv's attention (and its mask function) with transformers under the
    name "pagedkv" and returns the name. Idempotent; PagedEngine calls it."""
    AttentionInterface.register(ATTENTION_NAME, paged_attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, _no_dense_mask)
    return ATTENTION_NAME


# --- the engine ---------------------------------------------------------------------------


@dataclasses.dataclass
class Completion:
    """A finished request: `samples[j]` are the tokens generated for sample j (n samples;
    prompt excluded); with return_logits, `logits[j]` [len(samples[j]), vocab] fp32 are
    the logits each of those tokens was chosen from."""

    request_id: int
    prompt: list
    samples: list
    logits: Optional[list] = None


@dataclasses.dataclass
class _Request:
    id: int
    prompt: list
    max_new_tokens: int
    n: int
    temperature: float
    seed: int
    forced: Optional[list]  # per sample, the tokens to append instead of sampling
    return_logits: bool
    stop_token_ids: frozenset
    seqs: list = dataclasses.field(default_factory=list)
    forked: bool = False


@dataclasses.dataclass
class _Seq:
    id: int
    request: _Request
    sample: int
    generated: list = dataclasses.field(default_factory=list)
    logits: list = dataclasses.field(default_factory=list)
    generator: Optional[torch.Generator] = None
    done: bool = False


@dataclasses.dataclass
class _StepBatch:
    """What the attention function needs of one step (all on the model's device)."""

    layers: dict  # model layer index -> (group, index in the group's storage)
    caches: dict  # model layer index -> (k_cache, v_cache) tensors
    windows: list  # per group: 0 (full) or the sliding window
    slots: list  # per group: int64 [num_tokens]
    block_tables: list  # per group: int32 [num_seqs, max_blocks]
    context_lens: list  # per group: int32 [num_seqs]
    qo_indptr: torch.Tensor  # int32 [num_seqs + 1]
    num_tokens: int
    max_query_len: int
    max_context_len: int
    decode_only: bool
    mla: Optional[tuple] = None  # (kv_lora_rank, qk_nope, qk_rope, v_head_dim) of MLA models
    latents: dict = dataclasses.field(default_factory=dict)  # MLA: layer -> [1, T, rank]
    states: dict = dataclasses.field(default_factory=dict)  # linear layer -> (conv, recurrent)
    qo_indptr_host: list = dataclasses.field(default_factory=list)
    starts: list = dataclasses.field(default_factory=list)  # per sequence: first new position
    state_slots: list = dataclasses.field(default_factory=list)  # per sequence: its state slot
    saves: dict = dataclasses.field(default_factory=dict)  # seq index -> [(position, dst)]


class _Hooks:
    def __init__(self):
        self.victims = []

    def on_preempt(self, victim, mode):
        self.victims.append(victim)

    def on_claim_released(self, seq):
        pass  # admission re-matches a sequence whose table is empty


STATE = -1  # _layer_windows' mark of a linear-attention (state) layer


def _layer_windows(config, num_layers):
    """Per layer: 0 (full attention), its sliding window, or STATE (linear attention)."""
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if types is None:
        return [int(window) if window else 0] * num_layers  # Mistral: every layer windowed
    windows = []
    for i, kind in enumerate(types[:num_layers]):
        if kind == "full_attention":
            windows.append(0)
        elif kind == "sliding_attention":
            if not window:
                raise ValueError(f"layer {i} is a sliding_attention layer but the config's "
                                 f"sliding_window is {window!r}")
            windows.append(int(window))
        elif kind == "linear_attention":
            windows.append(STATE)
        else:
            raise NotImplementedError(
                f"layer {i} is a {kind!r} layer: PagedEngine serves full attention, sliding "
                "window attention and linear attention (Gated DeltaNet) layers")
    return windows


def _text_config(config):
    get = getattr(config, "get_text_config", None)
    return get() if get is not None else config


class PagedEngine:
    """A continuous-batching engine for a transformers causal LM on pagedkv.

    Args:
        model: a transformers causal LM (`AutoModelForCausalLM`), in eval mode, on CPU (or
            CUDA when pagedkv was built with CUDA). Its attention implementation is set to
            "pagedkv" (`model.set_attn_implementation`).
        num_blocks: blocks of `block_size` tokens per layer group (each group gets its own
            pool of this many blocks).
        block_size: tokens per block.
        enable_prefix_caching: share the K/V of identical prompt prefixes (full blocks).
        max_num_batched_tokens: prompt tokens admitted per step at most (a request's prompt
            is never split; one longer than this is admitted alone). 0: no limit.
        num_state_slots: models with linear-attention layers (Qwen3-Next): state slots, one
            per running sequence plus the checkpoints that prefix hits restore.
        state_checkpoint_interval_blocks: a state checkpoint every that many blocks (and at
            each prompt's last full block): where prefix hits of such models may end.
        check_invariants: run `KvCacheManager.check_invariants()` after every step.
    """

    def __init__(self, model, *, num_blocks: int = 1024, block_size: int = 16,
                 enable_prefix_caching: bool = True, max_num_batched_tokens: int = 0,
                 num_state_slots: int = 256, state_checkpoint_interval_blocks: int = 4,
                 check_invariants: bool = False):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must "
                             "be >= 1")
        self.model = model
        self.block_size = block_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.check = check_invariants
        config = _text_config(model.config)
        dtype = next(model.parameters()).dtype
        if dtype not in _TORCH_TO_PK:
            raise ValueError(f"model dtype {dtype}: pagedkv stores fp32, fp16 or bf16 K/V")
        self.device = next(model.parameters()).device
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"model on {self.device}: pagedkv runs on CPU and CUDA")
        pk_device = pk.Device.CUDA if self.device.type == "cuda" else pk.Device.CPU
        num_layers = config.num_hidden_layers
        num_heads = config.num_attention_heads
        num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        windows = _layer_windows(config, num_layers)
        self.mla = None
        if getattr(config, "kv_lora_rank", None):  # DeepSeek-V2/V3: a latent per token
            rank, rope = config.kv_lora_rank, config.qk_rope_head_dim
            self.mla = (rank, config.qk_nope_head_dim, rope, config.v_head_dim)
            num_kv_heads, head_dim = 1, rank + rope
            if any(windows):
                raise NotImplementedError("MLA with sliding-window or linear-attention layers "
                                          "is not supported")
            if head_dim not in (64, 128, 256):
                raise ValueError(
                    f"kv_lora_rank {rank} + qk_rope_head_dim {rope} = {head_dim}: prompts "
                    "attend over the latent with pagedkv's extend kernel, which takes head_dim "
                    "64, 128 or 256")
        elif head_dim not in (64, 128, 256):
            raise ValueError(f"head_dim {head_dim}: pagedkv's attention kernels take head_dim "
                             "64, 128 or 256")

        # Layer groups: full attention first (the anchor of prefix hits), then one group per
        # window size. A model of windowed layers only gets a full group without layers (no
        # storage) when prefix caching is on: windowed hits are verified against it.
        group_windows = []
        if 0 in windows or enable_prefix_caching or STATE in windows:
            group_windows.append(0)
        group_windows += sorted({w for w in windows if w > 0})
        self.windows = group_windows
        layer_groups = [
            pk.LayerGroup(kind=pk.AttentionKind.SLIDING_WINDOW if w else pk.AttentionKind.FULL,
                          window=w, num_blocks=num_blocks) for w in group_windows]
        # Linear-attention layers: a STATE group after the attention groups (a slot each).
        self.state_group = None
        if STATE in windows:
            self.state_group = len(layer_groups)
            layer_groups.append(pk.LayerGroup(kind=pk.AttentionKind.STATE,
                                              num_blocks=num_state_slots))
        self.hooks = _Hooks()
        self.manager = pk.KvCacheManager(
            layer_groups=layer_groups, block_size=block_size,
            enable_prefix_caching=enable_prefix_caching, preemption_hooks=self.hooks,
            state_checkpoint_interval_blocks=(state_checkpoint_interval_blocks
                                              if self.state_group is not None else 0))
        self.layers = {}  # model layer -> (group, index in the group's storage)
        self.storages = []  # one per group that has layers
        self.caches = {}
        for g, w in enumerate(group_windows):
            members = [i for i in range(num_layers) if windows[i] == w]
            if not members:
                continue
            spec = pk.KvCacheSpec(num_layers=len(members), num_kv_heads=num_kv_heads,
                                  head_dim=head_dim, dtype=_TORCH_TO_PK[dtype],
                                  block_size=block_size, latent=self.mla is not None)
            storage = pk.KvStorage(spec, num_blocks, device=pk_device, layer_group=g)
            self.storages.append(storage)
            for local, layer in enumerate(members):
                self.layers[layer] = (g, local)
                self.caches[layer] = (torch.from_dlpack(storage.k_cache(local)),
                                      None if self.mla else
                                      torch.from_dlpack(storage.v_cache(local)))
        if self.mla is not None:
            self._hook_latents(model)
        self.states = {}  # linear-attention layer -> (conv [slots, ...], recurrent [slots, ...])
        if self.state_group is not None:
            self._wrap_linear_attention(model, [i for i in range(num_layers)
                                                if windows[i] == STATE], dtype, pk_device,
                                        num_state_slots)
        register()
        model.set_attn_implementation(ATTENTION_NAME)
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.default_stop = frozenset([eos] if isinstance(eos, int) else (eos or []))

        self.requests = {}
        self.seqs = {}
        self.waiting = collections.deque()  # seq ids in admission order
        self.running = []  # seq ids
        self.completions = {}
        self.num_steps = 0
        self.num_preempted = 0
        self.num_forks = 0
        self._next_request = 0
        self._next_seq = 0

    def _hook_latents(self, model):
        """MLA: every attention layer hands its normalized compressed KV to the step."""
        hooked = set()
        for module in model.modules():
            layer = getattr(module, "layer_idx", None)
            norm = getattr(module, "kv_a_layernorm", None)
            if norm is None or layer not in self.layers:
                continue
            norm.register_forward_hook(
                lambda _m, _inputs, output, layer=layer: _capture_latent(layer, output))
            hooked.add(layer)
        if hooked != set(self.layers):
            missing = sorted(set(self.layers) - hooked)
            raise NotImplementedError(
                f"MLA config (kv_lora_rank) but layers {missing} have no kv_a_layernorm "
                "whose output is the compressed KV: not a DeepSeek-V2/V3 attention")

    def _wrap_linear_attention(self, model, layers, dtype, pk_device, num_slots):
        """Linear-attention layers (Qwen3-Next's Gated DeltaNet) keep their conv and recurrent
        state in the state group's slots: each module's forward runs the model's own code
        once per sequence of the packed batch, with a cache object whose states are views
        of the sequence's slot (split where the manager wants a checkpoint saved)."""
        modules = {}
        for module in model.modules():
            layer = getattr(module, "layer_idx", None)
            if layer in layers and all(hasattr(module, a) for a in (
                    "conv_dim", "conv_kernel_size", "num_v_heads", "head_k_dim",
                    "head_v_dim")):
                modules[layer] = module
        if sorted(modules) != sorted(layers):
            missing = sorted(set(layers) - set(modules))
            raise NotImplementedError(
                f"linear_attention layers {missing} are not Gated DeltaNet modules (conv_dim, "
                "conv_kernel_size, num_v_heads, head_k_dim, head_v_dim): not supported")
        first = modules[layers[0]]
        conv_shape = (first.conv_dim, first.conv_kernel_size)
        recurrent_shape = (first.num_v_heads, first.head_k_dim, first.head_v_dim)
        shape = pk.StateShape(num_layers=len(layers),
                              conv_elements=conv_shape[0] * conv_shape[1],
                              recurrent_elements=int(np.prod(recurrent_shape)),
                              conv_dtype=_TORCH_TO_PK[dtype],
                              recurrent_dtype=pk.DType.FLOAT32)
        storage = pk.KvStorage.create_state(shape, num_slots, device=pk_device,
                                            layer_group=self.state_group)
        self.storages.append(storage)
        conv_bytes = conv_shape[0] * conv_shape[1] * torch.finfo(dtype).bits // 8
        for local, layer in enumerate(layers):
            rows = torch.from_dlpack(storage.state_cache(local))  # uint8 [slots, bytes]
            conv = rows[:, :conv_bytes].view(dtype).unflatten(1, conv_shape)
            recurrent = rows[:, conv_bytes:].view(torch.float32).unflatten(1, recurrent_shape)
            self.states[layer] = (conv, recurrent)
            module = modules[layer]
            module.forward = functools.partial(_linear_attention_forward, type(module).forward,
                                               module, layer)

    # --- requests ---------------------------------------------------------------------------

    def add_request(self, prompt: Sequence[int], *, max_new_tokens: int, n: int = 1,
                    temperature: float = 0.0, seed: int = 0,
                    forced_tokens: Optional[Sequence[Sequence[int]]] = None,
                    return_logits: bool = False,
                    stop_token_ids: Optional[Sequence[int]] = None) -> int:
        """Queues a request; returns its id (a key of `completions` once it finishes).

        Args:
            prompt: token ids (at least one).
            max_new_tokens: tokens to generate per sample (>= 1).
            n: samples; samples 1..n-1 are forks of sample 0 after the prompt (they share its
                blocks; the first append of each copies the shared partial block).
            temperature: 0 for greedy; else sampling from softmax(logits / temperature)
                with a generator seeded by seed + sample index.
            forced_tokens: teacher forcing: n lists of max_new_tokens tokens, appended
                instead of the sampled ones (their logits are still computed and recorded).
            return_logits: keep the fp32 logits of every generated token.
            stop_token_ids: a sample ends at one of these (default: the model's eos).
        """
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("add_request: the prompt is empty; it needs at least one token")
        if max_new_tokens < 1:
            raise ValueError(f"add_request: max_new_tokens = {max_new_tokens}; must be >= 1")
        if n < 1:
            raise ValueError(f"add_request: n = {n}; must be >= 1")
        if temperature < 0:
            raise ValueError(f"add_request: temperature = {temperature}; must be >= 0")
        vocab = _text_config(self.model.config).vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"add_request: prompt token {bad[0]} is outside the vocabulary "
                             f"[0, {vocab})")
        forced = None
        if forced_tokens is not None:
            forced = [[int(t) for t in f] for f in forced_tokens]
            if len(forced) != n or any(len(f) < max_new_tokens for f in forced):
                raise ValueError(
                    f"add_request: forced_tokens needs {n} lists of >= {max_new_tokens} "
                    f"tokens, got {len(forced)} of lengths {[len(f) for f in forced]}")
        request = _Request(self._next_request, prompt, max_new_tokens, n, float(temperature),
                           seed, forced, return_logits,
                           frozenset(stop_token_ids) if stop_token_ids is not None
                           else self.default_stop)
        # The manager checks the prompt against the pools (and max_model_len) first: a
        # refused request leaves nothing behind.
        self.manager.add_sequence(self._next_seq, prompt)
        self._next_request += 1
        self.requests[request.id] = request
        seq = self._new_seq(request, 0)
        self.waiting.append(seq.id)
        return request.id

    def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                 **kwargs) -> list:
        """Runs the prompts (with add_request's keyword arguments) to completion; returns
        their Completions in prompt order."""
        ids = [self.add_request(p, max_new_tokens=max_new_tokens, **kwargs) for p in prompts]
        self.run()
        return [self.completions[i] for i in ids]

    def run(self, max_steps: int = 1_000_000):
        """Steps until every request has finished."""
        for _ in range(max_steps):
            if not self.has_unfinished():
                return
            self.step()
        raise RuntimeError(f"PagedEngine.run: requests still unfinished after {max_steps} "
                           "steps")

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def preempt(self, seq: int):
        """Preempts a running sequence by recompute (between steps): its blocks are freed
        (hashed ones stay cached) and it is re-admitted first, recomputing what the prefix
        cache no longer holds."""
        if seq not in self.running:
            raise KeyError(f"preempt: sequence {seq} is not running (running: {self.running})")
        self.manager.preempt(seq, pk.PreemptionMode.RECOMPUTE)
        self._requeue_victims()

    def _new_seq(self, request, sample):
        seq = _Seq(self._next_seq, request, sample)
        self._next_seq += 1
        if request.temperature > 0:
            seq.generator = torch.Generator(device="cpu").manual_seed(request.seed + sample)
        request.seqs.append(seq)
        self.seqs[seq.id] = seq
        return seq

    # --- one step ---------------------------------------------------------------------------

    def step(self):
        """One engine step: reserve a slot for every running sequence's next token
        (preempting when blocks run out), admit waiting sequences with their prefix hits,
        run the step's block copies, one forward pass over all new tokens, then sample,
        fork and finish."""
        decode = self._schedule_decode()
        prefill = self._admit()
        if not decode and not prefill:
            if self.waiting:
                seq = self.waiting[0]
                need = len(self.manager.sequence(seq).tokens)
                raise pk.ResourceExhausted(
                    f"PagedEngine: sequence {seq} ({need} tokens, "
                    f"{-(-need // self.block_size)} blocks) does not fit the pools of "
                    f"{self.manager.layer_group(0).num_blocks} blocks with nothing running; "
                    "raise num_blocks")
            return
        ops = self.manager.take_step_ops()
        for storage in self.storages:
            storage.run_step_ops(ops)
        scheduled = prefill + decode  # (seq, first new position, slots per group)
        logits = self._forward(scheduled, decode_only=not prefill, saves=ops.save_state)
        self._sample_and_fork(scheduled, logits, prefilled={s for s, _, _ in prefill})
        self.num_steps += 1
        if self.check:
            self.manager.check_invariants()

    def _schedule_decode(self):
        if not self.running:
            return []
        seqs = np.array(self.running, np.int64)
        batch = self.manager.allocate_slots_batch(seqs, 1, preempt=True)
        codes = batch.status.tolist()
        group_slots = [np.asarray(s) for s in batch.group_slots]
        scheduled = []
        for i, (seq, code) in enumerate(zip(seqs.tolist(), codes)):
            if code == pk.StatusCode.OK:
                view_len = len(self.manager.sequence(seq).tokens)
                scheduled.append((seq, view_len - 1, [s[i:i + 1] for s in group_slots]))
            elif (code == pk.StatusCode.RESOURCE_EXHAUSTED  # nobody left to preempt: itself
                  and self.manager.sequence(seq).state == pk.SequenceState.RUNNING):
                self.manager.preempt(seq, pk.PreemptionMode.RECOMPUTE)
        preempted = self._requeue_victims()
        return [s for s in scheduled if s[0] not in preempted]

    def _requeue_victims(self):
        victims = set(self.hooks.victims)
        for victim in reversed(self.hooks.victims):
            if victim in self.running:
                self.running.remove(victim)
                self.waiting.appendleft(victim)
                self.num_preempted += 1
        self.hooks.victims.clear()
        return victims

    def _admit(self):
        admitted, used, budget = [], 0, self.max_num_batched_tokens
        while self.waiting:
            seq = self.waiting[0]
            view = self.manager.sequence(seq)
            # A sequence that matched before but found no room keeps its claimed prefix.
            cached = (view.num_computed_tokens if len(view.block_table)
                      else self.manager.match_prefix(seq))
            num_new = len(view.tokens) - cached
            if budget and admitted and used + num_new > budget:
                break
            try:
                slots = self.manager.allocate_slots(seq, num_new)
            except pk.ResourceExhausted:
                break  # retried next step, after running sequences finish
            group_slots = [slots] + [self.manager.slot_mapping(g)
                                     for g in range(1, self.manager.num_groups())]
            self.waiting.popleft()
            self.running.append(seq)
            admitted.append((seq, cached, group_slots))
            used += num_new
        return admitted

    def _forward(self, scheduled, decode_only, saves):
        tokens, positions, indptr = [], [], [0]
        for seq, start, _ in scheduled:
            seq_tokens = self.manager.sequence(seq).tokens
            tokens.append(seq_tokens[start:])
            positions.append(np.arange(start, len(seq_tokens)))
            indptr.append(indptr[-1] + len(seq_tokens) - start)
        seqs = [seq for seq, _, _ in scheduled]
        device = self.device

        def put(array, dtype):
            return torch.from_numpy(np.ascontiguousarray(array, dtype)).to(device)

        num_groups = len(self.windows)  # the attention groups (a state group comes after)
        tables, lens, max_context_len = [], [], 0
        for g in range(num_groups):
            t = self.manager.build_block_tables(seqs, group=g)
            tables.append(put(t.block_table, np.int32))
            lens.append(put(t.context_lens, np.int32))
            max_context_len = max(max_context_len, int(t.context_lens.max()))
        step = _StepBatch(
            layers=self.layers, caches=self.caches, windows=self.windows,
            slots=[put(np.concatenate([s[2][g] for s in scheduled]), np.int64)
                   for g in range(num_groups)],
            block_tables=tables, context_lens=lens,
            qo_indptr=put(np.array(indptr), np.int32), num_tokens=indptr[-1],
            max_query_len=int(np.diff(indptr).max()), max_context_len=max_context_len,
            decode_only=decode_only, mla=self.mla, states=self.states,
            qo_indptr_host=indptr, starts=[start for _, start, _ in scheduled])
        if self.state_group is not None:
            step.state_slots = self.manager.write_state_slots(seqs, self.state_group)
            index = {seq: i for i, seq in enumerate(seqs)}
            for save in saves:
                if save.group != self.state_group:
                    continue
                i = index[save.seq]
                if save.src != step.state_slots[i]:
                    raise pk.InternalError(f"state checkpoint of sequence {save.seq} reads slot "
                                           f"{save.src}, the sequence holds {step.state_slots[i]}")
                step.saves.setdefault(i, []).append((save.position, save.dst))
        input_ids = put(np.concatenate(tokens), np.int64)[None]
        position_ids = put(np.concatenate(positions), np.int64)[None]
        last_rows = torch.tensor(indptr[1:], device=device) - 1
        token = _ACTIVE_STEP.set(step)
        try:
            with torch.inference_mode():
                out = self.model(input_ids=input_ids, position_ids=position_ids,
                                 use_cache=False, logits_to_keep=last_rows)
        finally:
            _ACTIVE_STEP.reset(token)
        return out.logits[0].float()  # [num_seqs, vocab]

    def _sample_and_fork(self, scheduled, logits, prefilled):
        seqs, rows = [], []
        for row, (seq_id, _, _) in enumerate(scheduled):
            seq = self.seqs[seq_id]
            request = seq.request
            seqs.append(seq)
            rows.append(row)
            # n > 1: the other samples fork from sample 0 once its prompt is computed.
            if seq_id in prefilled and seq.sample == 0 and not request.forked:
                request.forked = True
                for j in range(1, request.n):
                    child = self._new_seq(request, j)
                    self.manager.fork(seq_id, child.id)
                    self.running.append(child.id)
                    self.num_forks += 1
                    seqs.append(child)
                    rows.append(row)
        next_tokens = []
        for seq, row in zip(seqs, rows):
            request = seq.request
            row_logits = logits[row]
            if request.forced is not None:
                token = request.forced[seq.sample][len(seq.generated)]
            elif request.temperature > 0:
                probs = torch.softmax(row_logits / request.temperature, dim=-1)
                token = int(torch.multinomial(probs.cpu(), 1, generator=seq.generator))
            else:
                token = int(torch.argmax(row_logits))
            seq.generated.append(token)
            if request.return_logits:
                seq.logits.append(row_logits.cpu())
            next_tokens.append(token)
        result = self.manager.append_tokens_batch(np.array([s.id for s in seqs], np.int64),
                                                  np.array(next_tokens, np.int32))
        if not result.ok:
            raise RuntimeError(f"PagedEngine: append_tokens_batch failed: {result.errors}")
        for seq in seqs:
            request = seq.request
            if (len(seq.generated) >= request.max_new_tokens
                    or seq.generated[-1] in request.stop_token_ids):
                seq.done = True
                self.manager.free(seq.id)  # hashed blocks stay cached for later hits
                self.running.remove(seq.id)
                del self.seqs[seq.id]
                if all(s.done for s in request.seqs) and len(request.seqs) == request.n:
                    self.completions[request.id] = Completion(
                        request.id, request.prompt, [s.generated for s in request.seqs],
                        [torch.stack(s.logits) for s in request.seqs]
                        if request.return_logits else None)
