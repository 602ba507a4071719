// A downstream project's view of pagedkv: only installed headers and the exported target.
#include <cstdio>

#include "pagedkv/kv_cache_manager.h"

int main() {
  auto manager = pagedkv::KvCacheManager::create(
      {.block_size = 4, .layer_groups = pagedkv::full_attention(8)});
  if (!manager.ok()) return 1;
  const int32_t prompt[] = {1, 2, 3, 4, 5};
  if (!manager->add_sequence(1, prompt).ok()) return 1;
  auto slots = manager->allocate_slots(1, 5);
  if (!slots.ok() || slots->size() != 5) return 1;
  std::printf("consumer: %d blocks in use\n", manager->stats().used_blocks);
  return manager->check_invariants().ok() ? 0 : 1;
}
