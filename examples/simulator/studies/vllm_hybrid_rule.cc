#include "studies/vllm_hybrid_rule.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pagedkv::sim {
namespace {

constexpr int32_t kNone = -1;

int64_t div_ceil(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Doubly linked queues over block ids with sentinels (node capacity + q is queue q's).
class BlockQueues {
 public:
  BlockQueues(int32_t capacity, int32_t num_queues)
      : n_(capacity), prev_(capacity + num_queues), next_(capacity + num_queues) {
    for (int32_t q = 0; q < num_queues; ++q) prev_[n_ + q] = next_[n_ + q] = n_ + q;
  }
  bool empty(int32_t queue) const { return next_[n_ + queue] == n_ + queue; }
  int32_t front(int32_t queue) const { return next_[n_ + queue]; }
  void push_back(int32_t queue, int32_t b) {
    const int32_t sentinel = n_ + queue;
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

// vLLM's BlockPool over blocks holding keys ((KV cache group, block identity) pairs): the
// free queue, popped from its head, and cached_block_hash_to_block, each key's blocks in
// insertion order (a lookup returns the first). With clean_first, freed blocks without a
// key wait in a queue of their own that is popped first.
class VllmBlockPool {
 public:
  VllmBlockPool(int32_t capacity, int64_t num_keys, bool clean_first)
      : clean_first_(clean_first),
        queues_(capacity, 2),
        first_(static_cast<size_t>(num_keys), kNone),
        key_(capacity, kNone),
        ref_(capacity, 0),
        next_copy_(capacity, kNone),
        free_(capacity) {
    for (int32_t b = 0; b < capacity; ++b) queues_.push_back(queue_for(b), b);
  }

  int32_t num_free() const { return free_; }
  int64_t evictions() const { return evictions_; }
  // The block get_cached_block() returns for `key`, or kNone.
  int32_t lookup(int64_t key) const { return first_[static_cast<size_t>(key)]; }

  // A hit takes a reference; a free block leaves the queue.
  void touch(int32_t b) {
    if (ref_[b]++ == 0) {
      queues_.remove(b);
      --free_;
    }
  }

  // get_new_blocks() of one block: the queue's head, evicting the key it held. Needs
  // num_free() > 0.
  int32_t allocate() {
    const int32_t queue = clean_first_ && !queues_.empty(kCleanQueue) ? kCleanQueue : kQueue;
    const int32_t b = queues_.front(queue);
    queues_.remove(b);
    --free_;
    if (key_[b] != kNone) evict(b);
    ref_[b] = 1;
    return b;
  }

  // Enters block `b` under `key`, after the key's other blocks.
  void cache(int32_t b, int64_t key) {
    int32_t* link = &first_[static_cast<size_t>(key)];
    while (*link != kNone) link = &next_copy_[*link];
    *link = b;
    key_[b] = key;
  }

  // Drops a reference; a block reaching 0 joins the tail of its queue.
  void release(int32_t b) {
    if (--ref_[b] > 0) return;
    ++free_;
    queues_.push_back(queue_for(b), b);
  }

 private:
  static constexpr int32_t kCleanQueue = 0, kQueue = 1;

  int32_t queue_for(int32_t b) const {
    return clean_first_ && key_[b] == kNone ? kCleanQueue : kQueue;
  }

  // Takes the popped block `b` out of its key's blocks.
  void evict(int32_t b) {
    int32_t* link = &first_[static_cast<size_t>(key_[b])];
    while (*link != b) link = &next_copy_[*link];
    *link = next_copy_[b];
    next_copy_[b] = kNone;
    key_[b] = kNone;
    ++evictions_;
  }

  bool clean_first_;
  BlockQueues queues_;
  std::vector<int32_t> first_;      // per key: the block a lookup returns
  std::vector<int64_t> key_;        // per block: its key, or kNone
  std::vector<int32_t> ref_;        // per block
  std::vector<int32_t> next_copy_;  // per block: the next block holding its key
  int32_t free_;
  int64_t evictions_ = 0;
};

// The replay of replay_vllm_hybrid_rule().
class VllmReplay {
 public:
  VllmReplay(const HitStreams& streams, int32_t num_blocks, std::span<const LayerGroup> groups,
             int32_t chunk_tokens, bool clean_first)
      : streams_(streams),
        groups_(groups.begin(), groups.end()),
        chunk_tokens_(chunk_tokens),
        pool_(num_blocks, int64_t{streams.num_ids} * static_cast<int64_t>(groups.size()),
              clean_first),
        tables_(groups.size()),
        cached_(groups.size(), 0) {
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

  absl::StatusOr<PrefixHits> run() {
    PrefixHits result;
    const int32_t bs = streams_.block_size;
    for (size_t r = 0; r < streams_.requests.size(); ++r) {
      const HitRequest& req = streams_.requests[r];
      const auto [hit, hold] = find_longest_cache_hit(req);
      result.prompt_tokens += req.num_tokens;
      result.hit_tokens += int64_t{hit} * bs;
      result.full_hold_tokens += int64_t{hold} * bs;
      result.hits += hit > 0 ? 1 : 0;
      result.cut_hits += hit < hold ? 1 : 0;
      touch_hit(req, hit);
      for (int64_t c = int64_t{hit} * bs; c < req.num_tokens;) {
        const int64_t left = req.num_tokens - c;
        const int64_t n = chunk_tokens_ > 0 ? std::min<int64_t>(chunk_tokens_, left) : left;
        if (absl::Status s = compute(req, c, n, static_cast<int32_t>(r)); !s.ok()) return s;
        c += n;
      }
      free_tables();
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

  // The coordinator's find_longest_cache_hit(): full attention left to right first (one
  // lookup); the other specs right to left; a round that shortens the hit starts another,
  // except for one full and one other spec ("simple hybrid"). Returns (hit, what the full
  // groups hold), in blocks.
  std::pair<int32_t, int32_t> find_longest_cache_hit(const HitRequest& req) const {
    const int32_t max_hit = (req.num_tokens - 1) / streams_.block_size;
    int32_t hit = max_hit;
    int32_t hold = max_hit;
    const bool simple = specs_.size() == 2 && groups_[specs_[0][0]].kind == AttentionKind::kFull;
    bool full_done = false;
    while (true) {
      int32_t curr = hit;
      for (const std::vector<int32_t>& spec : specs_) {
        if (groups_[spec[0]].kind == AttentionKind::kFull) {
          if (!full_done) hold = std::min(hold, full_hit(spec, req, max_hit));
          curr = std::min(curr, hold);
        } else {
          curr = sliding_hit(spec, req, curr);
        }
      }
      full_done = true;
      if (curr == hit || simple) return {curr, hold};
      hit = curr;
    }
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

  // allocate_slots() of the hit: touch its blocks (a windowed group only those in the
  // window of the next token).
  void touch_hit(const HitRequest& req, int32_t hit) {
    const int32_t bs = streams_.block_size;
    for (size_t g = 0; g < groups_.size(); ++g) {
      std::vector<int32_t>& t = tables_[g];
      t.assign(static_cast<size_t>(hit), kNone);
      const auto skipped = static_cast<int32_t>(skipped_tokens(groups_[g], int64_t{hit} * bs) / bs);
      for (int32_t i = skipped; i < hit; ++i) {
        t[i] = pool_.lookup(key(g, req.ids[i]));
        pool_.touch(t[i]);
      }
      cached_[g] = hit;
    }
  }

  // One chunk of `n` tokens after the first `c`.
  absl::Status compute(const HitRequest& req, int64_t c, int64_t n, int32_t r) {
    const int32_t bs = streams_.block_size;
    // remove_skipped_blocks(num_computed_tokens), group after group, last block first.
    for (size_t g = 0; g < groups_.size(); ++g) {
      std::vector<int32_t>& t = tables_[g];
      const auto skipped = static_cast<int32_t>(
          std::min<int64_t>(skipped_tokens(groups_[g], c) / bs, static_cast<int64_t>(t.size())));
      for (int32_t i = skipped - 1; i >= 0 && t[i] != kNone; --i) {
        pool_.release(t[i]);
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
      for (int32_t i = cached_[g]; i < full; ++i) pool_.cache(tables_[g][i], key(g, req.ids[i]));
      cached_[g] = std::max(cached_[g], full);
    }
    return absl::OkStatus();
  }

  // free(): group after group, each tail first.
  void free_tables() {
    for (std::vector<int32_t>& t : tables_) {
      for (auto i = static_cast<int32_t>(t.size()) - 1; i >= 0; --i) {
        if (t[i] != kNone) pool_.release(t[i]);
      }
      t.clear();
    }
  }

  const HitStreams& streams_;
  std::vector<LayerGroup> groups_;
  int32_t chunk_tokens_;
  VllmBlockPool pool_;
  std::vector<std::vector<int32_t>> tables_;  // per group: the replayed request's blocks
  std::vector<int32_t> cached_;               // per group: its full blocks cached so far
  std::vector<std::vector<int32_t>> specs_;   // groups looked up together, full first
};

absl::Status check_groups(std::span<const LayerGroup> groups, int32_t chunk_tokens) {
  if (std::none_of(groups.begin(), groups.end(),
                   [](const LayerGroup& g) { return g.kind == AttentionKind::kFull; })) {
    return absl::InvalidArgumentError("vLLM model: needs a full-attention group");
  }
  for (const LayerGroup& g : groups) {
    if (g.kind == AttentionKind::kChunkedLocal) {
      return absl::InvalidArgumentError("vLLM model: chunked local attention is not modelled");
    }
    if (g.kind != AttentionKind::kFull && g.window <= 0) {
      return absl::InvalidArgumentError("vLLM model: a windowed group needs a window");
    }
  }
  if (chunk_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("vLLM model: chunk_tokens ", chunk_tokens, " must be >= 0"));
  }
  return absl::OkStatus();
}

}  // namespace

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

absl::StatusOr<PrefixHits> replay_vllm_hybrid_rule(const HitStreams& streams, int32_t num_blocks,
                                                   std::span<const LayerGroup> groups,
                                                   int32_t chunk_tokens, bool clean_first) {
  if (absl::Status s = check_groups(groups, chunk_tokens); !s.ok()) return s;
  if (num_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("vLLM model: ", num_blocks, " blocks"));
  }
  VllmReplay replay(streams, num_blocks, groups, chunk_tokens, clean_first);
  return replay.run();
}

}  // namespace pagedkv::sim
