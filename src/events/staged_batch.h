// StagedBatch: one engine step's KV events in flat arrays, the form in which the scheduler
// thread hands them to the publisher thread.
//
// IMPLEMENTATION DETAILS
//   events      [e0: Stored GPU, 2 hashes, 32 tokens] [e1: Removed CPU, 1 hash] [e2: Cleared] ...
//               (each with its layer group, when the manager has more than one)
//   hashes      h(e0) h(e0) h(e1)                    every event's hashes, in order
//   tokens      t(e0) x 32                            BlockStored token ids, in order
//   extra_keys  k(e0) ...                             BlockStored extra keys, in order
// Adding an event appends to these vectors; cleared, they keep their capacity, so a
// recycled batch stages a step without allocating.
#ifndef PAGEDKV_EVENTS_STAGED_BATCH_H_
#define PAGEDKV_EVENTS_STAGED_BATCH_H_

#include <cstdint>
#include <span>
#include <vector>

#include "pagedkv/kv_events.h"
#include "pagedkv/types.h"

namespace pagedkv::internal {

enum class EventKind : uint8_t { kStored, kRemoved, kCleared };

struct StagedEvent {
  EventKind kind = EventKind::kCleared;
  Medium medium = Medium::kDevice;  // BlockStored, BlockRemoved: the tier of the blocks
  bool has_parent = false;          // BlockStored: parent is set
  bool has_group = false;           // BlockStored, BlockRemoved: group is set
  int32_t block_size = 0;           // BlockStored: tokens per block
  uint32_t num_hashes = 0;
  uint32_t num_tokens = 0;
  uint32_t num_extra_keys = 0;
  BlockHash parent;
  EventGroup group;  // the layer group, when has_group
};

// One staged event with its slices of the batch's arrays.
struct StagedEventView {
  const StagedEvent& event;
  std::span<const BlockHash> hashes;
  std::span<const TokenId> tokens;
  std::span<const uint64_t> extra_keys;
};

struct StagedBatch {
  int64_t seq = 0;         // sequence number on the wire
  double timestamp = 0.0;  // seconds since the Unix epoch, when the step was handed off
  std::vector<StagedEvent> events;
  std::vector<BlockHash> hashes;
  std::vector<TokenId> tokens;
  std::vector<uint64_t> extra_keys;

  void add(const KvEvent& event);
  void add_stored(const BlockHash* parent, std::span<const BlockHash> block_hashes,
                  std::span<const TokenId> token_ids, int32_t block_size,
                  std::span<const uint64_t> keys, Medium medium, const EventGroup* group = nullptr);
  void add_removed(std::span<const BlockHash> block_hashes, Medium medium,
                   const EventGroup* group = nullptr);
  void add_cleared();
  void clear();
  // Reserves the sizes of `other`, so that staging a similar step allocates once per array.
  void reserve_like(const StagedBatch& other);
  bool empty() const { return events.empty(); }

  // Calls f(StagedEventView) for each event, in order.
  template <typename F>
  void for_each(F&& f) const {
    size_t h = 0, t = 0, k = 0;
    for (const StagedEvent& e : events) {
      f(StagedEventView{e, std::span(hashes).subspan(h, e.num_hashes),
                        std::span(tokens).subspan(t, e.num_tokens),
                        std::span(extra_keys).subspan(k, e.num_extra_keys)});
      h += e.num_hashes;
      t += e.num_tokens;
      k += e.num_extra_keys;
    }
  }
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_EVENTS_STAGED_BATCH_H_
