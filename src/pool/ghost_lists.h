// Internal: ghost lists, the keys of cached blocks that recently left a cache, each list in
// the order of its adds. A block computed again while its key is a ghost was reused,
// though it left the cache in between. The adaptive eviction policy keeps two (ARC's B1
// and B2, adaptive_eviction.h), the host tier's admission rule one (cache/ghost_list.h);
// their owners bound their sizes.
//
// IMPLEMENTATION DETAILS
//   live_ maps each ghost to a tag, the sequence number of its latest add and its list
//   (seq << 8 | list); order_[l] holds list l's adds, oldest first. An entry whose tag is
//   not its key's in live_ is stale (the key was taken or added again since): skipped when
//   it reaches the front, and dropped when an order holds more than twice its list's
//   ghosts (and 64), so each add is O(1) amortized.
#ifndef PAGEDKV_POOL_GHOST_LISTS_H_
#define PAGEDKV_POOL_GHOST_LISTS_H_

#include <cstdint>
#include <deque>
#include <iterator>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pagedkv::internal {

template <typename Key, int kLists>
class GhostLists {
  static_assert(kLists >= 1 && kLists <= 256);

 public:
  // Makes `key` the most recent ghost of `list`, taking it out of any list it was in.
  void add(const Key& key, int list) {
    const uint64_t tag = next_seq_++ << 8 | static_cast<uint64_t>(list);
    const auto [it, added] = live_.try_emplace(key, tag);
    if (!added) {  // a ghost already (in ARC's lists only by a 64-bit key collision): it moves
      --count_[list_of(it->second)];
      it->second = tag;
    }
    ++count_[list];
    std::deque<Entry>& order = order_[list];
    order.push_back({key, tag});
    if (std::ssize(order) > 2 * int64_t{count_[list]} + 64) {
      std::erase_if(order, [this](const Entry& e) { return !is_live(e); });
    }
  }

  // Removes `key`; the list it was in, or nullopt when it was no ghost.
  std::optional<int> take(const Key& key) {
    const auto it = live_.find(key);
    if (it == live_.end()) return std::nullopt;
    const int list = list_of(it->second);
    --count_[list];
    live_.erase(it);
    return list;
  }

  int32_t size(int list) const { return count_[list]; }

  // Removes the oldest ghost of `list`, which holds one.
  void pop_oldest(int list) {
    std::deque<Entry>& order = order_[list];
    while (!is_live(order.front())) order.pop_front();
    live_.erase(order.front().key);
    order.pop_front();
    --count_[list];
  }

  void clear() {
    live_.clear();
    for (int l = 0; l < kLists; ++l) {
      order_[l].clear();
      count_[l] = 0;
    }
  }

  // Every ghost counted in its list and live exactly once in that list's order.
  absl::Status check_invariants() const {
    for (int l = 0; l < kLists; ++l) {
      int64_t live = 0;
      for (const Entry& e : order_[l]) live += is_live(e) && list_of(e.tag) == l;
      int64_t held = 0;
      for (const auto& [key, tag] : live_) held += list_of(tag) == l;
      if (live != count_[l] || held != count_[l]) {
        return absl::InternalError(absl::StrCat("ghost list ", l, " counts ", count_[l],
                                                " ghosts, holds ", held, ", ", live,
                                                " live in its order"));
      }
    }
    return absl::OkStatus();
  }

 private:
  struct Entry {
    Key key;
    uint64_t tag = 0;
  };
  static int list_of(uint64_t tag) { return static_cast<int>(tag & 0xff); }
  bool is_live(const Entry& e) const {
    const auto it = live_.find(e.key);
    return it != live_.end() && it->second == e.tag;
  }

  uint64_t next_seq_ = 0;
  absl::flat_hash_map<Key, uint64_t> live_;  // ghost -> tag of its latest add
  std::deque<Entry> order_[kLists];          // adds per list, oldest first
  int32_t count_[kLists] = {};               // ghosts per list
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_POOL_GHOST_LISTS_H_
