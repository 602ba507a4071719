#include "studies/belady.h"

#include <iterator>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pagedkv::sim {

absl::StatusOr<ReplayResult> replay_belady(const BlockStreams& streams, int64_t capacity) {
  if (capacity < 1) {
    return absl::InvalidArgumentError(absl::StrCat("Belady capacity ", capacity, " must be >= 1"));
  }
  // Dense ids and the flattened reference stream.
  absl::flat_hash_map<int64_t, int32_t> dense;
  std::vector<int32_t> refs;
  for (const auto& s : streams) {
    for (int64_t id : s) {
      auto [it, inserted] = dense.try_emplace(id, static_cast<int32_t>(dense.size()));
      refs.push_back(it->second);
    }
  }
  // next_use[t]: position of the next reference to refs[t], or "never".
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> next_use(refs.size());
  {
    std::vector<int64_t> last(dense.size(), kNever);
    for (int64_t t = static_cast<int64_t>(refs.size()) - 1; t >= 0; --t) {
      next_use[t] = last[refs[t]];
      last[refs[t]] = t;
    }
  }
  ReplayResult result{.capacity = capacity};
  // Cached blocks ordered by next use; key[id] is the id's entry, or kAbsent.
  constexpr int64_t kAbsent = -1;
  std::set<std::pair<int64_t, int32_t>> cache;
  std::vector<int64_t> key(dense.size(), kAbsent);
  int64_t t = 0;
  for (const auto& s : streams) {
    const int64_t n = static_cast<int64_t>(s.size());
    int64_t hits = 0;
    while (hits < n && key[refs[t + hits]] != kAbsent) ++hits;
    for (int64_t i = 0; i < n; ++i, ++t) {
      const int32_t id = refs[t];
      if (key[id] != kAbsent) {
        cache.erase({key[id], id});
      } else if (static_cast<int64_t>(cache.size()) >= capacity) {
        auto farthest = std::prev(cache.end());
        if (farthest->first <= next_use[t]) continue;  // bypass: this block is needed last
        key[farthest->second] = kAbsent;
        cache.erase(farthest);
        ++result.evictions;
      }
      key[id] = next_use[t];
      cache.emplace(next_use[t], id);
    }
    result.total_blocks += n;
    result.hit_blocks += hits;
  }
  return result;
}

}  // namespace pagedkv::sim
