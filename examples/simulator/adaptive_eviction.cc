#include "adaptive_eviction.h"

#include <algorithm>
#include <cassert>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "fmt/format.h"
#include "lru_lists.h"

namespace pagedkv::sim {
namespace {

// The prefix-aware ARC of adaptive_eviction.h over dense ids.
class PrefixArc {
 public:
  PrefixArc(int32_t num_ids, int32_t capacity)
      : capacity_(capacity), blocks_(num_ids), lists_(num_ids, kNumLists) {
    result_.replay.capacity = capacity;
  }

  // One request (at most capacity blocks): pin the cached prefix, cache the misses, then
  // release every block tail to head, so the head ends up the most recently used.
  void replay(const std::vector<int32_t>& ids) {
    const int32_t n = static_cast<int32_t>(ids.size());
    int32_t hits = 0;
    for (; hits < n && cached(ids[hits]); ++hits) {
      pin(ids[hits]);
      set_list(ids[hits], kFrequent);  // a second use
    }
    for (int32_t i = hits; i < n; ++i) {
      if (cached(ids[i])) {
        pin(ids[i]);  // off the cached prefix (never on prefix-closed traces): kept as is
      } else {
        admit(ids[i], i == 0 ? kNoParent : ids[i - 1]);
      }
    }
    for (int32_t i = n - 1; i >= 0; --i) {
      const int32_t id = ids[i];
      if (blocks_[id].place == kListed)
        lists_.remove(blocks_[id].list, id);  // a repeat within the request
      if (i + 1 < n && blocks_[ids[i + 1]].list == kFrequent) set_list(id, kFrequent);
      lists_.push_back(blocks_[id].list, id);
      blocks_[id].place = kListed;
    }
    result_.replay.total_blocks += n;
    result_.replay.hit_blocks += hits;
  }

  AdaptiveReplayResult result() const {
    AdaptiveReplayResult r = result_;
    r.final_target = target_;
    return r;
  }

 private:
  // The four lists (kNone: an id in none of them).
  enum List : int8_t { kRecent, kFrequent, kRecentGhost, kFrequentGhost, kNumLists, kNone };
  // Where a cached block is: on its list, held by the request being replayed (off every
  // list, so making room cannot evict it), or parked (a non-leaf taken off its list's LRU
  // end until its last cached child goes).
  enum Place : int8_t { kListed, kPinned, kParked };
  static constexpr int32_t kNoParent = -1;
  struct Block {
    List list = kNone;
    Place place = kListed;  // of a cached block
    int32_t parent = kNoParent;
    int32_t cached_children = 0;
  };

  bool cached(int32_t id) const {
    return blocks_[id].list == kRecent || blocks_[id].list == kFrequent;
  }
  int32_t cached_size() const { return cached_in(kRecent) + cached_in(kFrequent); }
  // Blocks of T1 or T2, wherever they are (listed, pinned or parked).
  int32_t cached_in(List list) const { return cached_count_[list]; }
  int32_t ghosts(List list) const { return lists_.size(list); }

  void pin(int32_t id) {
    if (blocks_[id].place == kListed) lists_.remove(blocks_[id].list, id);
    blocks_[id].place = kPinned;
  }

  // Moves a cached or ghost id to `list`, counting cached blocks per list (the ghost lists
  // hold their ids, cached blocks may be off theirs).
  void set_list(int32_t id, List list) {
    if (cached(id)) --cached_count_[blocks_[id].list];
    blocks_[id].list = list;
    if (cached(id)) ++cached_count_[list];
  }

  // A miss: adapt the target on a ghost hit, make room, cache the block pinned.
  void admit(int32_t id, int32_t parent) {
    const List ghost = blocks_[id].list;
    if (ghost == kRecentGhost) {
      ++result_.recent_ghost_hits;
      target_ = std::min<double>(
          capacity_, target_ + std::max(1.0, 1.0 * ghosts(kFrequentGhost) / ghosts(kRecentGhost)));
    } else if (ghost == kFrequentGhost) {
      ++result_.frequent_ghost_hits;
      target_ = std::max(
          0.0, target_ - std::max(1.0, 1.0 * ghosts(kRecentGhost) / ghosts(kFrequentGhost)));
    }
    if (ghost != kNone) {
      lists_.remove(ghost, id);
      blocks_[id].list = kNone;
    }
    if (cached_size() == capacity_) evict_one(ghost == kFrequentGhost);
    set_list(id, ghost == kNone ? kRecent : kFrequent);
    blocks_[id].place = kPinned;
    blocks_[id].parent = parent;
    if (parent != kNoParent) ++blocks_[parent].cached_children;
    trim_ghosts();
  }

  // ARC's REPLACE: from T1 when it is over its target, else from T2; from the other list
  // when the chosen one has no evictable leaf.
  void evict_one(bool frequent_ghost_hit) {
    const int32_t recent = cached_in(kRecent);
    const bool from_recent =
        recent > 0 && (recent > target_ || (frequent_ghost_hit && recent == target_));
    int32_t victim = take_leaf(from_recent ? kRecent : kFrequent);
    if (victim == kNoParent) victim = take_leaf(from_recent ? kFrequent : kRecent);
    // Unpinned cached blocks always include a leaf: every descendant of an unpinned block
    // is unpinned (a request pins a whole prefix), and requests fit the pool.
    assert(victim != kNoParent);
    const List ghost = blocks_[victim].list == kRecent ? kRecentGhost : kFrequentGhost;
    set_list(victim, ghost);
    lists_.push_back(ghost, victim);
    ++result_.replay.evictions;
    const int32_t parent = blocks_[victim].parent;
    if (parent != kNoParent && --blocks_[parent].cached_children == 0 &&
        blocks_[parent].place == kParked) {
      lists_.push_front(blocks_[parent].list, parent);  // back to the LRU end it was taken from
      blocks_[parent].place = kListed;
    }
  }

  // The least recently used leaf of `list`, taken off it, parking the non-leaves in front
  // of it; kNoParent when there is none.
  int32_t take_leaf(List list) {
    while (lists_.size(list) > 0) {
      const int32_t id = lists_.front(list);
      lists_.remove(list, id);
      if (blocks_[id].cached_children == 0) return id;
      blocks_[id].place = kParked;
      ++result_.parked;
    }
    return kNoParent;
  }

  // ARC's directory bounds: |T1| + |B1| <= C, and all four lists <= 2C.
  void trim_ghosts() {
    while (ghosts(kRecentGhost) > 0 && cached_in(kRecent) + ghosts(kRecentGhost) > capacity_) {
      drop_ghost(kRecentGhost);
    }
    while (cached_size() + ghosts(kRecentGhost) + ghosts(kFrequentGhost) > 2 * capacity_) {
      drop_ghost(ghosts(kFrequentGhost) > 0 ? kFrequentGhost : kRecentGhost);
    }
  }

  void drop_ghost(List ghost) {
    const int32_t id = lists_.front(ghost);
    lists_.remove(ghost, id);
    blocks_[id].list = kNone;
  }

  int32_t capacity_;
  double target_ = 0;                 // p: the size T1 aims at
  std::vector<Block> blocks_;         // by id
  int32_t cached_count_[2] = {0, 0};  // T1 and T2 blocks, listed or not
  LruLists lists_;
  AdaptiveReplayResult result_;
};

}  // namespace

absl::StatusOr<AdaptiveReplayResult> replay_adaptive(const BlockStreams& streams,
                                                     int32_t capacity) {
  if (capacity < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("adaptive capacity ", capacity, " must be >= 1"));
  }
  int32_t num_ids = 0;
  const std::vector<std::vector<int32_t>> requests = dense_streams(streams, &num_ids);
  PrefixArc arc(num_ids, capacity);
  for (size_t r = 0; r < requests.size(); ++r) {
    const int32_t n = static_cast<int32_t>(requests[r].size());
    if (n > capacity) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", r, " has ", n, " blocks, more than the pool's ", capacity));
    }
    arc.replay(requests[r]);
  }
  return arc.result();
}

double PolicyRow::gap_closed() const {
  const int64_t gap = belady.hit_blocks - lru.hit_blocks;
  return gap == 0 ? 0.0 : static_cast<double>(adaptive.replay.hit_blocks - lru.hit_blocks) / gap;
}

absl::StatusOr<std::vector<PolicyRow>> policy_study(const BlockStreams& streams,
                                                    const std::vector<int32_t>& capacities) {
  std::vector<PolicyRow> rows;
  for (int32_t capacity : capacities) {
    absl::StatusOr<ReplayResult> lru = replay_block_pool(streams, capacity);
    if (!lru.ok()) return lru.status();
    absl::StatusOr<AdaptiveReplayResult> adaptive = replay_adaptive(streams, capacity);
    if (!adaptive.ok()) return adaptive.status();
    absl::StatusOr<ReplayResult> library =
        replay_block_pool(streams, capacity, EvictionPolicy::kAdaptive);
    if (!library.ok()) return library.status();
    absl::StatusOr<ReplayResult> belady = replay_belady(streams, capacity);
    if (!belady.ok()) return belady.status();
    rows.push_back({.capacity = capacity,
                    .lru = *lru,
                    .adaptive = *adaptive,
                    .library_adaptive = *library,
                    .belady = *belady});
  }
  return rows;
}

std::string format_policy_table(const std::vector<PolicyRow>& rows) {
  std::string out =
      fmt::format("{:>11} {:>8} {:>8} {:>9} {:>8} {:>10} {:>11} {:>9} {:>9} {:>8} {:>8}\n",
                  "pool blocks", "LRU", "adaptive", "BlockPool", "Belady", "x LRU", "gap closed",
                  "B1 hits", "B2 hits", "parked", "final p");
  for (const PolicyRow& row : rows) {
    const AdaptiveReplayResult& a = row.adaptive;
    const double lru = row.lru.hit_rate();
    out += fmt::format(
        "{:>11} {:>8.4f} {:>8.4f} {:>9.4f} {:>8.4f} {:>10.3f} {:>11.3f} {:>9} {:>9} {:>8} "
        "{:>8.0f}\n",
        row.capacity, lru, a.replay.hit_rate(), row.library_adaptive.hit_rate(),
        row.belady.hit_rate(), lru > 0 ? a.replay.hit_rate() / lru : 0.0, row.gap_closed(),
        a.recent_ghost_hits, a.frequent_ghost_hits, a.parked, a.final_target);
  }
  return out;
}

namespace {
double saved(const TieredReplayResult& all, const TieredReplayResult& reused) {
  return all.demotions == 0 ? 0.0 : 1.0 - static_cast<double>(reused.demotions) / all.demotions;
}
}  // namespace

double AdmissionRow::demotions_saved() const { return saved(demote_all, demote_reused); }
double AdmissionRow::manager_demotions_saved() const { return saved(manager_all, manager_reused); }

absl::StatusOr<AdmissionRow> admission_study(const BlockStreams& streams, int32_t device_blocks,
                                             int32_t host_blocks) {
  AdmissionRow row;
  for (auto [admission, result] : {std::pair{HostAdmission::kAll, &row.demote_all},
                                   std::pair{HostAdmission::kReused, &row.demote_reused}}) {
    absl::StatusOr<TieredReplayResult> tiered =
        replay_tiered_lru(streams, device_blocks, host_blocks, 0, admission);
    if (!tiered.ok()) return tiered.status();
    *result = *tiered;
  }
  for (auto [admission, result] : {std::pair{HostAdmission::kAll, &row.manager_all},
                                   std::pair{HostAdmission::kReused, &row.manager_reused}}) {
    absl::StatusOr<TieredReplayResult> tiered =
        replay_tiered_manager(streams, device_blocks, host_blocks, admission);
    if (!tiered.ok()) return tiered.status();
    *result = *tiered;
  }
  return row;
}

std::string format_admission_table(const AdmissionRow& row) {
  std::string out = fmt::format("{:>24} {:>8} {:>8} {:>8} {:>9} {:>9} {:>10} {:>10}\n",
                                "host admission", "dev hit", "host hit", "combined", "demoted",
                                "undemoted", "promoted", "host drops");
  for (auto [name, t] : {std::pair{"demote all (model)", &row.demote_all},
                         std::pair{"demote reused (model)", &row.demote_reused},
                         std::pair{"kAll (KvCacheManager)", &row.manager_all},
                         std::pair{"kReused (KvCacheManager)", &row.manager_reused}}) {
    out += fmt::format("{:>24} {:>8.4f} {:>8.4f} {:>8.4f} {:>9} {:>9} {:>10} {:>10}\n", name,
                       t->device_hit_rate(), t->host_hit_rate(), t->hit_rate(), t->demotions,
                       t->undemoted, t->promotions(), t->host_evictions);
  }
  auto change = [](const TieredReplayResult& all, const TieredReplayResult& reused) {
    return all.hit_rate() > 0 ? 100 * (reused.hit_rate() - all.hit_rate()) / all.hit_rate() : 0.0;
  };
  out += fmt::format(
      "demotions saved {:.1f} % (model), {:.1f} % (KvCacheManager); combined hit rate {:+.2f} % "
      "(model), {:+.2f} % (KvCacheManager) of demote-all's\n",
      100 * row.demotions_saved(), 100 * row.manager_demotions_saved(),
      change(row.demote_all, row.demote_reused), change(row.manager_all, row.manager_reused));
  return out;
}

}  // namespace pagedkv::sim
