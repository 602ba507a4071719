// File: pagedkv/kv_events.h
//
// KV cache events, so that a KV-aware router can follow what each engine holds:
//   BlockStored       full blocks entered the prefix index of a medium,
//   BlockRemoved      cached blocks left it (evicted, or moved to the other medium),
//   AllBlocksCleared  the prefix index was emptied in every medium (reset_prefix_cache()).
// The medium says which tier holds the blocks, as vLLM's "medium" field does: device
// memory, or the host tier (an evicted device block demoted to host memory: BlockRemoved
// on the device, BlockStored on the host; promoted back: the reverse).
// On the events of a manager with more than one layer group (a hybrid model), `group`
// names the group whose pool the blocks are in: each group has pools of its own, and the
// same hash (the same tokens) is cached in every group that holds it. A manager with one
// group leaves it unset (docs/events.md, "Layer groups").
// The pool calls the sink synchronously from the scheduler thread; a sink must not call
// back into the manager.
//
// Example (`options` are the KvCacheManager::Options the manager is created with):
//   KvEventBuffer events;
//   options.event_sink = &events;
//   // ... manager calls ...
//   for (const KvEvent& e : events.take()) forward_to_router(e);
#ifndef PAGEDKV_KV_EVENTS_H_
#define PAGEDKV_KV_EVENTS_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <variant>
#include <vector>

#include "pagedkv/layer_group.h"
#include "pagedkv/types.h"

namespace pagedkv {

// Where cached blocks live: device memory ("GPU" on the wire) or the host tier ("CPU").
enum class Medium : uint8_t { kDevice, kHost };

// The layer group an event is about: vLLM's group_idx, kv_cache_spec_kind and
// kv_cache_spec_sliding_window on the wire.
struct EventGroup {
  int32_t index = 0;  // the group's index in the manager, [0, num_groups())
  AttentionKind kind = AttentionKind::kFull;
  int32_t window = 0;  // tokens: > 0 for the windowed kinds, 0 for kFull
  bool operator==(const EventGroup&) const = default;
};

struct BlockStored {
  std::vector<BlockHash> block_hashes;   // in table order
  std::optional<BlockHash> parent_hash;  // hash of the block before the first, if any
  std::vector<TokenId> token_ids;        // block_size tokens per stored block
  int32_t block_size = 0;                // tokens per block
  std::vector<uint64_t> extra_keys;      // the sequence's extra keys (salt, adapter, ...)
  Medium medium = Medium::kDevice;
  std::optional<EventGroup> group = std::nullopt;  // set by managers with more than one layer group
};

struct BlockRemoved {
  std::vector<BlockHash> block_hashes;
  Medium medium = Medium::kDevice;
  std::optional<EventGroup> group = std::nullopt;  // as in BlockStored
};

struct AllBlocksCleared {};

using KvEvent = std::variant<BlockStored, BlockRemoved, AllBlocksCleared>;

// Receives events as they happen.
class KvEventSink {
 public:
  virtual ~KvEventSink() = default;
  virtual void on_event(const KvEvent& event) = 0;
};

// A sink that keeps events until they are taken.
class KvEventBuffer : public KvEventSink {
 public:
  void on_event(const KvEvent& event) override { events_.push_back(event); }
  // Returns the events received since the last call, oldest first.
  std::vector<KvEvent> take() { return std::exchange(events_, {}); }

 private:
  std::vector<KvEvent> events_;
};

}  // namespace pagedkv

#endif  // PAGEDKV_KV_EVENTS_H_
