"""Integrations of pagedkv with model frameworks and engines.

Each submodule imports its framework when it is imported itself, so `import pagedkv` never
needs them:

- `pagedkv.integrations.transformers`: Hugging Face transformers models generate on
  pagedkv's paged cache, scheduler and kernels (needs torch and transformers; see
  docs/transformers.md).
- `pagedkv.integrations.vllm`: vLLM 0.33.0's own scheduler with its KV cache on pagedkv's
  manager (`PagedKVScheduler` through `SchedulerConfig.scheduler_cls`; needs vLLM 0.33.0;
  see docs/vllm.md).
"""
