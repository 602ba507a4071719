#include "hybrid_eviction.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pagedkv::sim {
namespace {

constexpr int32_t kNone = -1;

int64_t div_ceil(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The first table entry a token at `pos` needs in a group of `spec`'s kind.
int32_t first_needed(const LayerGroup& spec, int64_t pos, int32_t block_size) {
  return static_cast<int32_t>(first_attended(spec.kind, spec.window, pos) / block_size);
}

// Doubly linked lists over block ids with sentinels (node capacity + l is list l's).
class BlockLists {
 public:
  BlockLists(int32_t capacity, int32_t num_lists)
      : n_(capacity), prev_(capacity + num_lists), next_(capacity + num_lists) {
    for (int32_t l = 0; l < num_lists; ++l) prev_[n_ + l] = next_[n_ + l] = n_ + l;
  }
  bool empty(int32_t list) const { return next_[n_ + list] == n_ + list; }
  int32_t front(int32_t list) const { return next_[n_ + list]; }
  void push_back(int32_t list, int32_t b) {
    const int32_t sentinel = n_ + list;
    const int32_t last = prev_[sentinel];
    prev_[b] = last;
    next_[b] = sentinel;
    next_[last] = b;
    prev_[sentinel] = b;
  }
  void remove(int32_t b) {
    next_[prev_[b]] = next_[b];
    prev_[next_[b]] = prev_[b];
  }

 private:
  int32_t n_;
  std::vector<int32_t> prev_;
  std::vector<int32_t> next_;
};

// How a free block was last released: behind its sequence's window (mid-prompt), or when
// its sequence was freed.
enum Origin : uint8_t { kReleasedMid = 0, kReleasedAtFree = 1 };

// A pool of blocks holding keys (a block id's content: an id, or for vLLM's shared pool a
// (KV cache group, id) pair), with the free queue and index of one of the two designs.
//   kPagedkv: BlockPool. List 0 holds clean blocks (popped first), lists 1.. cached ones
//     by eviction class (list 1 is evicted first), each in LRU order. A key's blocks:
//     the indexed one, then its standbys, most recent first; an identical block (same
//     parent content) becomes a standby, one with other parent contents is refused and
//     stays clean. Each allocation gives a block a fresh content key; a standby takes the
//     indexed block's.
//   kVllm: vLLM's BlockPool. One queue (list 1) for every free block, cached or not; a
//     key's blocks in insertion order, the first returned; nothing is verified.
class PoolModel {
 public:
  enum class Design : uint8_t { kPagedkv, kVllm };
  static constexpr int32_t kCleanList = 0;

  PoolModel(int32_t capacity, int64_t num_keys, Design design, int32_t num_classes,
            bool clean_first = true)
      : design_(design),
        clean_first_(design == Design::kPagedkv || clean_first),
        lists_(capacity, 1 + num_classes),
        num_classes_(num_classes),
        head_(static_cast<size_t>(num_keys), kNone),
        key_(capacity, kNone),
        ref_(capacity, 0),
        content_(capacity, 0),
        parent_(capacity, 0),
        chain_next_(capacity, kNone),
        chain_prev_(capacity, kNone),
        origin_(capacity, kReleasedMid),
        released_at_(capacity, 0),
        free_(capacity) {
    // All blocks start free and clean, in id order.
    for (int32_t b = 0; b < capacity; ++b) lists_.push_back(clean_first_ ? kCleanList : 1, b);
  }

  int32_t num_free() const { return free_; }
  int64_t evictions() const { return evictions_; }
  // The block the lookup of `key` returns, or kNone.
  int32_t lookup(int64_t key) const { return head_[static_cast<size_t>(key)]; }
  uint64_t content_key(int32_t b) const { return content_[b]; }
  uint64_t parent_key(int32_t b) const { return parent_[b]; }
  void set_now(int32_t request) { now_ = request; }

  // Per key, the request at which its last block left the pool (kNone: never) and how
  // that block had been released; the mean age of evicted blocks.
  void keep_eviction_log(int64_t num_keys) {
    evicted_at_.assign(static_cast<size_t>(num_keys), kNone);
    evicted_origin_.assign(static_cast<size_t>(num_keys), kReleasedMid);
  }
  int32_t evicted_at(int64_t key) const { return evicted_at_[static_cast<size_t>(key)]; }
  Origin evicted_origin(int64_t key) const { return evicted_origin_[static_cast<size_t>(key)]; }
  int64_t evictions_by_origin(Origin o) const { return evictions_by_origin_[o]; }
  double mean_eviction_age() const {
    return evictions_ == 0 ? 0.0 : static_cast<double>(age_sum_) / static_cast<double>(evictions_);
  }

  // A hit takes a reference; a free block leaves the queue.
  void touch(int32_t b) {
    if (ref_[b]++ == 0) {
      lists_.remove(b);
      --free_;
    }
  }

  // One block from the head of the queue (clean ones first for pagedkv), evicting the
  // key it held. Needs num_free() > 0.
  int32_t allocate() {
    int32_t list = 1;
    if (clean_first_ && !lists_.empty(kCleanList)) {
      list = kCleanList;
    } else {
      while (lists_.empty(list)) ++list;
    }
    const int32_t b = lists_.front(list);
    lists_.remove(b);
    --free_;
    if (key_[b] != kNone) evict(b);
    ref_[b] = 1;
    content_[b] = ++next_content_;
    return b;
  }

  // Enters the full block `b` under `key`, cached after parent contents `parent`.
  // pagedkv: a key held by blocks cached after other parent contents refuses `b` (it stays
  // clean), or with replace_stale gives up those blocks (they become clean) for `b`.
  void cache(int32_t b, int64_t key, uint64_t parent) {
    int32_t& head = head_[static_cast<size_t>(key)];
    if (head != kNone && design_ == Design::kPagedkv && parent_[head] != parent) {
      ++refusals_;
      if (!replace_stale_) return;
      while (head != kNone) uncache(head);
    }
    if (head == kNone) {
      head = b;
    } else if (design_ == Design::kPagedkv) {
      content_[b] = content_[head];  // a standby: children verify after it too
      link_after(head, b);
    } else {
      int32_t last = head;
      while (chain_next_[last] != kNone) last = chain_next_[last];
      link_after(last, b);
    }
    key_[b] = key;
    parent_[b] = parent;
    if (track_children_) children_[parent].push_back(b);
  }

  // Takes `b` out of the index: its K/V can never be shared again. A free one becomes
  // clean (reused first).
  void uncache(int32_t b) {
    if (key_[b] == kNone) return;
    unindex(b);
    ++uncached_;
    if (ref_[b] == 0 && clean_first_) {
      lists_.remove(b);
      lists_.push_back(kCleanList, b);
    }
  }

  // Options of the proposed rule: replace_stale (above); report the content keys whose
  // last block leaves the index into `died`; track the blocks cached after each parent
  // content so that uncache_children() finds them.
  void set_replace_stale(bool on) { replace_stale_ = on; }
  void report_deaths(std::vector<uint64_t>* died) { died_ = died; }
  void track_children() { track_children_ = true; }
  // Uncaches every block cached after parent contents `parent`.
  void uncache_children(uint64_t parent) {
    auto it = children_.find(parent);
    if (it == children_.end()) return;
    const std::vector<int32_t> blocks = std::move(it->second);
    children_.erase(it);
    for (int32_t b : blocks) {
      if (key_[b] != kNone && parent_[b] == parent) uncache(b);
    }
  }
  int64_t refusals() const { return refusals_; }
  int64_t uncached() const { return uncached_; }

  // Drops a reference; a block reaching 0 joins the queue: a cached one the tail of list
  // `cls` (pagedkv) or of the one queue (vLLM), a clean one pagedkv's clean list.
  void release(int32_t b, int32_t cls, Origin origin) {
    if (--ref_[b] > 0) return;
    ++free_;
    origin_[b] = origin;
    released_at_[b] = now_;
    if (key_[b] == kNone && clean_first_) {
      lists_.push_back(kCleanList, b);
    } else {
      lists_.push_back(design_ == Design::kVllm ? 1 : std::min(cls, num_classes_), b);
    }
  }

 private:
  void link_after(int32_t at, int32_t b) {
    chain_next_[b] = chain_next_[at];
    chain_prev_[b] = at;
    if (chain_next_[at] != kNone) chain_prev_[chain_next_[at]] = b;
    chain_next_[at] = b;
  }

  // Takes the popped block `b` out of its key's blocks.
  void evict(int32_t b) {
    const int64_t key = key_[b];
    ++evictions_;
    ++evictions_by_origin_[origin_[b]];
    age_sum_ += now_ - released_at_[b];
    if (unindex(b) && !evicted_at_.empty()) {
      evicted_at_[static_cast<size_t>(key)] = now_;
      evicted_origin_[static_cast<size_t>(key)] = origin_[b];
    }
  }

  // Takes `b` out of its key's blocks; true when no block holds the key (and, pagedkv,
  // its content) any more.
  bool unindex(int32_t b) {
    const int64_t key = key_[b];
    int32_t& head = head_[static_cast<size_t>(key)];
    const int32_t next = chain_next_[b];
    if (head == b) {
      head = next;
    } else {
      chain_next_[chain_prev_[b]] = next;
    }
    if (next != kNone) chain_prev_[next] = chain_prev_[b];
    chain_next_[b] = chain_prev_[b] = kNone;
    key_[b] = kNone;
    if (track_children_) {
      auto it = children_.find(parent_[b]);
      if (it != children_.end()) std::erase(it->second, b);
    }
    if (head != kNone) return false;
    if (died_ != nullptr) died_->push_back(content_[b]);
    return true;
  }

  Design design_;
  bool clean_first_;  // clean blocks in a list of their own, reused first
  BlockLists lists_;
  int32_t num_classes_;
  std::vector<int32_t> head_;  // per key: the block a lookup returns
  std::vector<int64_t> key_;   // per block: its key, or kNone (clean)
  std::vector<int32_t> ref_;
  std::vector<uint64_t> content_;  // pagedkv content keys
  std::vector<uint64_t> parent_;   // the parent content a block was cached after
  std::vector<int32_t> chain_next_;
  std::vector<int32_t> chain_prev_;
  std::vector<Origin> origin_;
  std::vector<int32_t> released_at_;
  int32_t free_;
  uint64_t next_content_ = 0;
  int32_t now_ = 0;
  int64_t evictions_ = 0;
  int64_t evictions_by_origin_[2] = {};
  int64_t age_sum_ = 0;
  std::vector<int32_t> evicted_at_;
  std::vector<Origin> evicted_origin_;
  bool replace_stale_ = false;
  bool track_children_ = false;
  std::vector<uint64_t>* died_ = nullptr;
  absl::flat_hash_map<uint64_t, std::vector<int32_t>> children_;
  int64_t refusals_ = 0;
  int64_t uncached_ = 0;
};

absl::Status check_groups(std::span<const LayerGroup> groups, int32_t chunk_tokens,
                          const char* caller) {
  if (std::none_of(groups.begin(), groups.end(),
                   [](const LayerGroup& g) { return g.kind == AttentionKind::kFull; })) {
    return absl::InvalidArgumentError(absl::StrCat(caller, ": needs a full-attention group"));
  }
  for (const LayerGroup& g : groups) {
    if (g.kind != AttentionKind::kFull && g.window <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(caller, ": a windowed group needs a window"));
    }
  }
  if (chunk_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(caller, ": chunk_tokens ", chunk_tokens, " must be >= 0"));
  }
  return absl::OkStatus();
}

// The hit points of the requests replayed so far (for CutAnalysis).
class HitPoints {
 public:
  explicit HitPoints(int32_t num_ids) : kind_(static_cast<size_t>(num_ids), HitPoint::kNone) {}
  // The kind of the hit point whose last block is `id` (hold > 0).
  HitPoint at(int32_t id) const {
    const HitPoint k = kind_[static_cast<size_t>(id)];
    return k == HitPoint::kNone ? HitPoint::kNewBranch : k;
  }
  void record(const HitRequest& r, int32_t hold) {
    if (hold > 0 && kind_[static_cast<size_t>(r.ids[hold - 1])] == HitPoint::kNone) {
      kind_[static_cast<size_t>(r.ids[hold - 1])] = HitPoint::kKnownBranch;
    }
    if (!r.ids.empty()) kind_[static_cast<size_t>(r.ids.back())] = HitPoint::kPromptEnd;
  }

 private:
  std::vector<HitPoint> kind_;
};

// --- pagedkv ------------------------------------------------------------------------------

struct PagedGroup {
  LayerGroup spec;
  bool windowed = false;
  PoolModel pool;
  std::vector<int32_t> table = {};  // the replayed request's entries; kNone released
  int32_t first_held = 0;
  // match_prefix() scratch.
  std::vector<int32_t> found = {};
  std::vector<uint64_t> keys = {};  // full groups: content keys along the chain
  std::vector<int8_t> state = {};   // windowed: 0 unknown, 1 found, 2 missing
  // kRetainHitPoints: entry i completes a retained hit point.
  std::vector<uint8_t> retained = {};
};

class PagedkvReplay {
 public:
  PagedkvReplay(const HitStreams& streams, std::span<const LayerGroup> groups,
                const HybridReplayOptions& options, CutAnalysis* analysis)
      : streams_(streams), options_(options), analysis_(analysis), points_(streams.num_ids) {
    const int32_t classes =
        options.rule == WindowRule::kLru
            ? 1
            : (options.checkpoint_tokens > 0 ? 2 + std::max(options.checkpoint_levels, 1) : 2);
    for (const LayerGroup& spec : groups) {
      PagedGroup g{.spec = spec,
                   .windowed = spec.kind != AttentionKind::kFull,
                   .pool = PoolModel(spec.num_blocks, streams.num_ids, PoolModel::Design::kPagedkv,
                                     classes)};
      if (analysis != nullptr) g.pool.keep_eviction_log(streams.num_ids);
      groups_.push_back(std::move(g));
    }
    for (size_t i = 0; i < groups_.size(); ++i) {
      if (!groups_[i].windowed) {
        anchor_ = static_cast<int32_t>(i);
        break;
      }
    }
    for (PagedGroup& g : groups_) {
      g.pool.set_replace_stale(options.replace_stale);
      if (options.uncache_dead_windows && g.windowed) g.pool.track_children();
    }
    if (options.uncache_dead_windows) groups_[anchor_].pool.report_deaths(&died_);
    if (options.anchor_cached_first) offer_order_.push_back(&groups_[anchor_]);
    for (PagedGroup& g : groups_) {
      if (!options.anchor_cached_first || &g != &groups_[anchor_]) offer_order_.push_back(&g);
    }
  }

  absl::StatusOr<HitReplayResult> run() {
    HitReplayResult result;
    const int32_t bs = streams_.block_size;
    std::vector<int64_t> lost_by_cut;
    for (size_t r = 0; r < streams_.requests.size(); ++r) {
      const HitRequest& req = streams_.requests[r];
      for (PagedGroup& g : groups_) g.pool.set_now(static_cast<int32_t>(r));
      const int32_t max_hit = (req.num_tokens - 1) / bs;
      // The full groups' chains, then the windowed groups in turn until they agree.
      int32_t p = max_hit;
      for (PagedGroup& g : groups_) {
        if (!g.windowed) p = std::min(p, match_chain(g, req, max_hit));
      }
      const int32_t hold = p;
      for (PagedGroup& g : groups_) {
        if (g.windowed) g.state.assign(static_cast<size_t>(max_hit), 0);
      }
      for (bool changed = true; changed && p > 0;) {
        changed = false;
        for (PagedGroup& g : groups_) {
          if (!g.windowed) continue;
          const int32_t q = window_hit(g, req, p);
          changed |= q < p;
          p = q;
        }
      }
      const int32_t hit = p;
      if (analysis_ != nullptr) analyze(req, hold, hit, static_cast<int32_t>(r), lost_by_cut);
      points_.record(req, hold);
      result.prompt_tokens += req.num_tokens;
      result.hit_tokens += int64_t{hit} * bs;
      result.full_hold_tokens += int64_t{hold} * bs;
      result.cut_hits += hit < hold;
      mark_retained(req, hold, hit);
      claim(hit);
      // The rest of the prompt, chunk after chunk (one step each).
      for (int64_t c = int64_t{hit} * bs; c < req.num_tokens;) {
        const int64_t left = req.num_tokens - c;
        const int64_t n =
            options_.chunk_tokens > 0 ? std::min<int64_t>(options_.chunk_tokens, left) : left;
        if (absl::Status s = compute(req, c, n, static_cast<int32_t>(r)); !s.ok()) return s;
        c += n;
      }
      free_sequence();
    }
    result.requests = static_cast<int64_t>(streams_.requests.size());
    for (const PagedGroup& g : groups_) {
      result.evictions.push_back(g.pool.evictions());
      result.refused.push_back(g.pool.refusals());
    }
    if (analysis_ != nullptr) finish_analysis(lost_by_cut);
    return result;
  }

 private:
  // A full group's verified chain from block 0, up to max_blocks.
  int32_t match_chain(PagedGroup& g, const HitRequest& req, int32_t max_blocks) {
    g.found.resize(static_cast<size_t>(max_blocks));
    g.keys.resize(static_cast<size_t>(max_blocks));
    uint64_t parent = 0;
    int32_t i = 0;
    for (; i < max_blocks; ++i) {
      const int32_t b = g.pool.lookup(req.ids[i]);
      if (b == kNone || g.pool.parent_key(b) != parent) break;
      g.found[i] = b;
      g.keys[i] = parent = g.pool.content_key(b);
    }
    return i;
  }

  // Whether windowed entry i is cached after the anchor's block i - 1.
  bool window_entry(PagedGroup& g, const HitRequest& req, int32_t i) {
    if (g.state[i] != 0) return g.state[i] == 1;
    const uint64_t parent = i == 0 ? 0 : groups_[anchor_].keys[i - 1];
    const int32_t b = g.pool.lookup(req.ids[i]);
    const bool ok = b != kNone && g.pool.parent_key(b) == parent;
    if (ok) {
      if (g.found.size() < g.state.size()) g.found.resize(g.state.size());
      g.found[i] = b;
    }
    g.state[i] = ok ? 1 : 2;
    return ok;
  }

  // The longest hit of at most p blocks whose window g holds.
  int32_t window_hit(PagedGroup& g, const HitRequest& req, int32_t p) {
    const int32_t bs = streams_.block_size;
    int32_t q = p;
    while (q > 0) {
      const int32_t first = first_needed(g.spec, int64_t{q} * bs, bs);
      int32_t missing = kNone;
      for (int32_t i = q - 1; i >= first; --i) {
        if (!window_entry(g, req, i)) {
          missing = i;
          break;
        }
      }
      if (missing == kNone) return q;
      q = missing;
    }
    return 0;
  }

  // kRetainHitPoints: the class of each windowed entry, the highest of the retained hit
  // points it completes: top_class() a branch point (the full groups' chain end at this
  // match, and the hit), below it the checkpoints (every checkpoint_tokens, then each finer
  // level of checkpoint_levels at half the spacing, one class lower), 1 none (evicted first).
  void mark_retained(const HitRequest& req, int32_t hold, int32_t hit) {
    if (options_.rule != WindowRule::kRetainHitPoints) return;
    const int32_t bs = streams_.block_size;
    const auto n = static_cast<int32_t>(req.ids.size());
    const auto top = static_cast<uint8_t>(top_class());
    std::vector<std::pair<int32_t, uint8_t>> points = {{hold, top}, {hit, top}};
    int64_t spacing = options_.checkpoint_tokens;
    for (int32_t level = 0; spacing >= bs && level < options_.checkpoint_levels;
         ++level, spacing /= 2) {
      for (int64_t t = spacing; t <= int64_t{n} * bs; t += spacing) {
        points.emplace_back(static_cast<int32_t>(t / bs), static_cast<uint8_t>(top - 1 - level));
      }
    }
    for (PagedGroup& g : groups_) {
      if (!g.windowed) continue;
      g.retained.assign(static_cast<size_t>(div_ceil(req.num_tokens, bs)), 1);
      for (const auto& [point, cls] : points) {
        if (point <= 0) continue;
        for (int32_t i = first_needed(g.spec, int64_t{point} * bs, bs); i < point; ++i) {
          g.retained[i] = std::max(g.retained[i], cls);
        }
      }
    }
  }

  int32_t top_class() const {
    return options_.checkpoint_tokens > 0 ? 2 + std::max(options_.checkpoint_levels, 1) : 2;
  }

  // The eviction class of an entry released now: 1 (evicted first) to top_class().
  int32_t class_of(const PagedGroup& g, int32_t i) const {
    if (options_.rule == WindowRule::kLru || !g.windowed) return top_class();
    return static_cast<size_t>(i) < g.retained.size() ? g.retained[i] : 1;
  }

  void claim(int32_t hit) {
    const int32_t bs = streams_.block_size;
    for (PagedGroup& g : groups_) {
      const int32_t first = g.windowed ? first_needed(g.spec, int64_t{hit} * bs, bs) : 0;
      g.table.assign(static_cast<size_t>(hit), kNone);
      g.first_held = first;
      for (int32_t i = first; i < hit; ++i) {
        g.pool.touch(g.found[i]);
        g.table[i] = g.found[i];
      }
    }
  }

  // allocate_slots() of n tokens after c computed ones, then the step ends.
  absl::Status compute(const HitRequest& req, int64_t c, int64_t n, int32_t r) {
    const int32_t bs = streams_.block_size;
    const int64_t total = div_ceil(c + n, bs);
    for (PagedGroup& g : groups_) {
      if (g.windowed) {
        const int32_t end =
            std::min(first_needed(g.spec, c, bs), static_cast<int32_t>(g.table.size()));
        for (int32_t i = g.first_held; i < end; ++i) {
          g.pool.release(g.table[i], class_of(g, i), kReleasedMid);
          g.table[i] = kNone;
        }
        g.first_held = std::max(g.first_held, end);
      }
      const int64_t need = total - static_cast<int64_t>(g.table.size());
      if (need > g.pool.num_free()) {
        return absl::InvalidArgumentError(
            absl::StrCat("pagedkv model: request ", r, " needs ", need, " blocks in a ",
                         attention_kind_name(g.spec.kind), " pool of ", g.spec.num_blocks, " with ",
                         g.pool.num_free(), " free"));
      }
      for (int64_t k = 0; k < need; ++k) g.table.push_back(g.pool.allocate());
    }
    bury_dead_windows();
    // The blocks these tokens fill are cached (offer_computed_blocks()): group after group,
    // a windowed group after the anchor's blocks as they are when its turn comes (the
    // anchor's first with anchor_cached_first).
    const PagedGroup& anchor = groups_[anchor_];
    for (PagedGroup* group : offer_order_) {
      PagedGroup& g = *group;
      const PagedGroup& parent_group = g.windowed ? anchor : g;
      for (int64_t i = c / bs; i < (c + n) / bs; ++i) {
        const uint64_t parent =
            i == 0 ? 0 : parent_group.pool.content_key(parent_group.table[i - 1]);
        g.pool.cache(g.table[i], req.ids[i], parent);
      }
    }
    bury_dead_windows();
    return absl::OkStatus();
  }

  // uncache_dead_windows: the windowed blocks cached after anchor contents that left.
  void bury_dead_windows() {
    if (died_.empty()) return;
    const std::vector<uint64_t> died = std::move(died_);
    died_.clear();
    for (PagedGroup& g : groups_) {
      if (!g.windowed) continue;
      for (uint64_t content : died) g.pool.uncache_children(content);
    }
  }

  // free(): each group's held entries, tail first.
  void free_sequence() {
    for (PagedGroup& g : groups_) {
      for (auto i = static_cast<int32_t>(g.table.size()) - 1; i >= g.first_held; --i) {
        g.pool.release(g.table[i], class_of(g, i), kReleasedAtFree);
      }
      g.table.clear();
      g.first_held = 0;
    }
  }

  void analyze(const HitRequest& req, int32_t hold, int32_t hit, int32_t r,
               std::vector<int64_t>& lost_by_cut) {
    if (hold == 0) return;
    const int32_t bs = streams_.block_size;
    const auto kind = static_cast<size_t>(points_.at(req.ids[hold - 1]));
    if (seen_points_.empty()) seen_points_.assign(static_cast<size_t>(streams_.num_ids), 0);
    if (!std::exchange(seen_points_[static_cast<size_t>(req.ids[hold - 1])], 1)) {
      ++analysis_->distinct_points;
    }
    ++analysis_->hits_by_point[kind];
    analysis_->hold_tokens_by_point[kind] += int64_t{hold} * bs;
    if (hit == hold) return;
    const int64_t lost = int64_t{hold - hit} * bs;
    ++analysis_->cut_hits;
    analysis_->lost_tokens += lost;
    ++analysis_->cuts_by_point[kind];
    analysis_->lost_tokens_by_point[kind] += lost;
    // The missing entry nearest the hold point in the first windowed group that lacks one.
    for (PagedGroup& g : groups_) {
      if (!g.windowed) continue;
      const int32_t first = first_needed(g.spec, int64_t{hold} * bs, bs);
      for (int32_t i = hold - 1; i >= first; --i) {
        if (window_entry(g, req, i)) continue;
        const int32_t at = g.pool.evicted_at(req.ids[i]);
        if (at == kNone) {
          ++analysis_->missing_never_cached;
        } else {
          ++(g.pool.evicted_origin(req.ids[i]) == kReleasedMid
                 ? analysis_->missing_released_mid
                 : analysis_->missing_released_at_free);
          lost_by_cut.push_back(r - at);
        }
        return;
      }
    }
  }

  void finish_analysis(std::vector<int64_t>& ages) {
    if (!ages.empty()) {
      std::nth_element(ages.begin(), ages.begin() + static_cast<std::ptrdiff_t>(ages.size() / 2),
                       ages.end());
      analysis_->median_requests_since_eviction = ages[ages.size() / 2];
    }
    for (const PagedGroup& g : groups_) {
      if (g.windowed) {
        analysis_->window_evictions_mid = g.pool.evictions_by_origin(kReleasedMid);
        analysis_->window_evictions_at_free = g.pool.evictions_by_origin(kReleasedAtFree);
        analysis_->window_mean_age_requests = g.pool.mean_eviction_age();
        break;
      }
    }
    analysis_->full_mean_age_requests = groups_[anchor_].pool.mean_eviction_age();
  }

  const HitStreams& streams_;
  const HybridReplayOptions& options_;
  CutAnalysis* analysis_;
  HitPoints points_;
  std::vector<PagedGroup> groups_;
  int32_t anchor_ = 0;
  std::vector<uint64_t> died_;            // anchor contents that left its pool, not yet buried
  std::vector<PagedGroup*> offer_order_;  // the order in which groups cache their blocks
  std::vector<uint8_t> seen_points_;      // CutAnalysis::distinct_points
};

// --- vLLM -----------------------------------------------------------------------------------

class VllmReplay {
 public:
  VllmReplay(const HitStreams& streams, int32_t num_blocks, std::span<const LayerGroup> groups,
             int32_t chunk_tokens, bool clean_first)
      : streams_(streams),
        groups_(groups.begin(), groups.end()),
        chunk_tokens_(chunk_tokens),
        pool_(num_blocks, int64_t{streams.num_ids} * static_cast<int64_t>(groups.size()),
              PoolModel::Design::kVllm, 1, clean_first),
        tables_(groups.size()) {
    // HybridKVCacheCoordinator.verify_and_split_kv_cache_groups(): groups of one spec are
    // looked up together, full attention first.
    for (size_t g = 0; g < groups_.size(); ++g) {
      auto same = [&](const std::vector<int32_t>& spec) {
        const LayerGroup& s = groups_[spec[0]];
        return s.kind == groups_[g].kind && s.window == groups_[g].window;
      };
      auto it = std::find_if(specs_.begin(), specs_.end(), same);
      if (it == specs_.end()) {
        specs_.push_back({static_cast<int32_t>(g)});
      } else {
        it->push_back(static_cast<int32_t>(g));
      }
    }
    std::stable_sort(specs_.begin(), specs_.end(), [&](const auto& a, const auto& b) {
      return (groups_[a[0]].kind == AttentionKind::kFull) >
             (groups_[b[0]].kind == AttentionKind::kFull);
    });
  }

  absl::StatusOr<HitReplayResult> run() {
    HitReplayResult result;
    const int32_t bs = streams_.block_size;
    for (size_t r = 0; r < streams_.requests.size(); ++r) {
      const HitRequest& req = streams_.requests[r];
      const int32_t max_hit = (req.num_tokens - 1) / bs;
      // find_longest_cache_hit(): full attention left to right first (one lookup); the
      // other specs right to left; a round that shortens the hit starts another, except
      // for one full and one other spec ("simple hybrid").
      int32_t hit = max_hit;
      int32_t hold = max_hit;
      const bool simple = specs_.size() == 2 && groups_[specs_[0][0]].kind == AttentionKind::kFull;
      bool full_done = false;
      while (true) {
        int32_t curr = hit;
        for (const std::vector<int32_t>& spec : specs_) {
          const LayerGroup& s = groups_[spec[0]];
          if (s.kind == AttentionKind::kFull) {
            if (!full_done) hold = std::min(hold, full_hit(spec, req, max_hit));
            curr = std::min(curr, hold);
          } else {
            curr = sliding_hit(spec, req, curr);
          }
        }
        full_done = true;
        if (curr >= hit) break;
        hit = curr;
        if (simple) break;
      }
      result.prompt_tokens += req.num_tokens;
      result.hit_tokens += int64_t{hit} * bs;
      result.full_hold_tokens += int64_t{hold} * bs;
      result.cut_hits += hit < hold;
      // allocate_slots(): touch the hit's blocks (a windowed group's in its window).
      for (size_t g = 0; g < groups_.size(); ++g) {
        std::vector<int32_t>& t = tables_[g];
        t.assign(static_cast<size_t>(hit), kNone);
        const int32_t skipped =
            static_cast<int32_t>(skipped_tokens(groups_[g], int64_t{hit} * bs) / bs);
        for (int32_t i = skipped; i < hit; ++i) {
          t[i] = pool_.lookup(key(g, req.ids[i]));
          pool_.touch(t[i]);
        }
        cached_[g] = hit;
      }
      for (int64_t c = int64_t{hit} * bs; c < req.num_tokens;) {
        const int64_t left = req.num_tokens - c;
        const int64_t n = chunk_tokens_ > 0 ? std::min<int64_t>(chunk_tokens_, left) : left;
        if (absl::Status s = compute(req, c, n, static_cast<int32_t>(r)); !s.ok()) return s;
        c += n;
      }
      // free(): group after group, each tail first.
      for (size_t g = 0; g < groups_.size(); ++g) {
        std::vector<int32_t>& t = tables_[g];
        for (auto i = static_cast<int32_t>(t.size()) - 1; i >= 0; --i) {
          if (t[i] != kNone) pool_.release(t[i], 1, kReleasedAtFree);
        }
        t.clear();
      }
    }
    result.requests = static_cast<int64_t>(streams_.requests.size());
    result.evictions.push_back(pool_.evictions());
    return result;
  }

 private:
  int64_t key(size_t g, int32_t id) const {
    return static_cast<int64_t>(g) * streams_.num_ids + id;
  }

  // get_num_skipped_tokens(): tokens before the window of the token at `pos`.
  static int64_t skipped_tokens(const LayerGroup& g, int64_t pos) {
    return g.kind == AttentionKind::kSlidingWindow ? std::max<int64_t>(0, pos - g.window + 1) : 0;
  }

  bool cached_in_all(const std::vector<int32_t>& spec, int32_t id) const {
    return std::all_of(spec.begin(), spec.end(), [&](int32_t g) {
      return pool_.lookup(key(static_cast<size_t>(g), id)) != kNone;
    });
  }

  // FullAttentionManager.find_longest_cache_hit().
  int32_t full_hit(const std::vector<int32_t>& spec, const HitRequest& req,
                   int32_t max_blocks) const {
    int32_t i = 0;
    while (i < max_blocks && cached_in_all(spec, req.ids[i])) ++i;
    return i;
  }

  // SlidingWindowManager.find_longest_cache_hit() with max_length = p blocks.
  int32_t sliding_hit(const std::vector<int32_t>& spec, const HitRequest& req, int32_t p) const {
    const int32_t bs = streams_.block_size;
    const auto need = static_cast<int32_t>(div_ceil(groups_[spec[0]].window - 1, bs));
    int32_t run = 0;
    for (int32_t i = p - 1; i >= 0; --i) {
      if (cached_in_all(spec, req.ids[i])) {
        if (++run >= need) return i + run;
      } else {
        run = 0;
      }
    }
    return run;
  }

  absl::Status compute(const HitRequest& req, int64_t c, int64_t n, int32_t r) {
    const int32_t bs = streams_.block_size;
    // remove_skipped_blocks(num_computed_tokens), group after group, last block first.
    for (size_t g = 0; g < groups_.size(); ++g) {
      std::vector<int32_t>& t = tables_[g];
      const auto skipped = static_cast<int32_t>(
          std::min<int64_t>(skipped_tokens(groups_[g], c) / bs, static_cast<int64_t>(t.size())));
      for (int32_t i = skipped - 1; i >= 0 && t[i] != kNone; --i) {
        pool_.release(t[i], 1, kReleasedMid);
        t[i] = kNone;
      }
    }
    const int64_t total = div_ceil(c + n, bs);
    int64_t need = 0;
    for (const std::vector<int32_t>& t : tables_) need += total - static_cast<int64_t>(t.size());
    if (need > pool_.num_free()) {
      return absl::InvalidArgumentError(absl::StrCat("vLLM model: request ", r, " needs ", need,
                                                     " blocks, ", pool_.num_free(), " free"));
    }
    for (std::vector<int32_t>& t : tables_) {
      while (static_cast<int64_t>(t.size()) < total) t.push_back(pool_.allocate());
    }
    // cache_blocks(): the full blocks, group after group.
    const auto full = static_cast<int32_t>((c + n) / bs);
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (int32_t i = cached_[g]; i < full; ++i) pool_.cache(tables_[g][i], key(g, req.ids[i]), 0);
      cached_[g] = std::max(cached_[g], full);
    }
    return absl::OkStatus();
  }

  const HitStreams& streams_;
  std::vector<LayerGroup> groups_;
  int32_t chunk_tokens_;
  PoolModel pool_;
  std::vector<std::vector<int32_t>> tables_;
  std::vector<int32_t> cached_ = std::vector<int32_t>(groups_.size(), 0);
  std::vector<std::vector<int32_t>> specs_;
};

}  // namespace

int64_t HitStreams::prompt_tokens() const {
  int64_t n = 0;
  for (const HitRequest& r : requests) n += r.num_tokens;
  return n;
}

absl::StatusOr<HitStreams> hit_streams(const Trace& trace, int32_t block_size) {
  if (block_size <= 0 || kMooncakeBlockTokens % block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("hit_streams: block size ", block_size,
                                                   " must divide ", kMooncakeBlockTokens));
  }
  const int32_t per_trace_block = kMooncakeBlockTokens / block_size;
  HitStreams streams;
  streams.block_size = block_size;
  absl::flat_hash_map<std::pair<int64_t, int32_t>, int32_t> dense;
  for (size_t r = 0; r < trace.requests.size(); ++r) {
    const Request& req = trace.requests[r];
    if (req.hash_ids.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(trace.name, " request ", r, ": no hash_ids (a Mooncake trace is needed)"));
    }
    HitRequest& out = streams.requests.emplace_back();
    out.num_tokens = req.input_length;
    const int32_t n = req.input_length / block_size;
    out.ids.reserve(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
      const auto j = static_cast<size_t>(i / per_trace_block);
      if (j >= req.hash_ids.size()) {
        return absl::InvalidArgumentError(absl::StrCat(trace.name, " request ", r, ": ",
                                                       req.hash_ids.size(), " hash_ids for ",
                                                       req.input_length, " tokens"));
      }
      const auto [it, inserted] = dense.try_emplace(std::pair(req.hash_ids[j], i % per_trace_block),
                                                    static_cast<int32_t>(dense.size()));
      out.ids.push_back(it->second);
    }
  }
  streams.num_ids = static_cast<int32_t>(dense.size());
  return streams;
}

absl::StatusOr<HitReplayResult> replay_pagedkv_model(const HitStreams& streams,
                                                     std::span<const LayerGroup> groups,
                                                     const HybridReplayOptions& options,
                                                     CutAnalysis* analysis) {
  if (absl::Status s = check_groups(groups, options.chunk_tokens, "pagedkv model"); !s.ok()) {
    return s;
  }
  if (analysis != nullptr) *analysis = CutAnalysis{};
  PagedkvReplay replay(streams, groups, options, analysis);
  return replay.run();
}

absl::StatusOr<HitReplayResult> replay_vllm_model(const HitStreams& streams, int32_t num_blocks,
                                                  std::span<const LayerGroup> groups,
                                                  int32_t chunk_tokens, bool clean_first) {
  if (absl::Status s = check_groups(groups, chunk_tokens, "vLLM model"); !s.ok()) return s;
  if (num_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("vLLM model: ", num_blocks, " blocks"));
  }
  for (const LayerGroup& g : groups) {
    if (g.kind == AttentionKind::kChunkedLocal) {
      return absl::InvalidArgumentError("vLLM model: chunked local attention is not modelled");
    }
  }
  VllmReplay replay(streams, num_blocks, groups, chunk_tokens, clean_first);
  return replay.run();
}

}  // namespace pagedkv::sim
