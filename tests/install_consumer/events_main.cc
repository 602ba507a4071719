// A downstream project's view of pagedkv::events and pagedkv::metrics.
#include <cstdio>

#include "pagedkv/kv_cache_metrics.h"
#include "pagedkv/kv_event_publisher.h"

int main() {
  auto publisher = pagedkv::KvEventPublisher::create({.endpoint = "tcp://127.0.0.1:*"});
  auto metrics = pagedkv::KvCacheMetrics::create({});
  if (!publisher.ok() || !metrics.ok()) return 1;
  auto manager = pagedkv::KvCacheManager::create({.block_size = 2,
                                                  .event_sink = publisher->get(),
                                                  .layer_groups = pagedkv::full_attention(8)});
  if (!manager.ok()) return 1;
  const int32_t prompt[] = {1, 2, 3, 4, 5};
  if (!manager->add_sequence(1, prompt).ok() || !manager->allocate_slots(1, 5).ok()) return 1;
  (*publisher)->end_step();
  (*metrics)->update(manager->stats());
  std::printf("events_consumer: seq %lld next, %zu bytes of metrics\n",
              static_cast<long long>((*publisher)->stats().next_seq), (*metrics)->text().size());
  return (*publisher)->stats().next_seq == 1 ? 0 : 1;
}
