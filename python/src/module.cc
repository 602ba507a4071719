// The nanobind module pagedkv._pagedkv. python/pagedkv/__init__.py re-exports it.
#include "bindings.h"

NB_MODULE(_pagedkv, m) {
  m.doc() =
      "pagedkv: KV-cache allocator and paged-attention kernels for LLM serving engines "
      "(the compiled part of the pagedkv package)";
  using namespace pagedkv::python;
  import_numpy();
  bind_errors(m);
  bind_types(m);
  bind_block_pool(m);
  bind_kv_cache_manager(m);
  bind_kv_storage(m);
  bind_kv_cache_config(m);
  bind_kernels(m);
#ifdef PAGEDKV_PYTHON_HAVE_PLANNER
  bind_capacity_plan(m);
#endif
}
