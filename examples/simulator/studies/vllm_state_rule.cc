#include "studies/vllm_state_rule.h"

#include <algorithm>
#include <iterator>
#include <list>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tokens.h"

namespace pagedkv::sim {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Entries with a key and a cost in an LRU order; several entries may share a key (vLLM
// keeps identical blocks as separate copies). The caller evicts from the front.
template <typename Key>
class KeyedLru {
 public:
  struct Entry {
    Key key;
    int64_t cost;
  };
  using Iter = typename std::list<Entry>::iterator;

  bool contains(const Key& key) const { return copies_.contains(key); }
  int64_t bytes() const { return bytes_; }
  bool empty() const { return order_.empty(); }

  // Appends a copy at the most recent end.
  void push(const Key& key, int64_t cost) {
    order_.push_back({key, cost});
    copies_[key].push_back(std::prev(order_.end()));
    bytes_ += cost;
  }
  // Takes out the oldest copy of `key` (the one vLLM's get_cached_block() returns), if any;
  // returns its cost, 0 when absent.
  int64_t take(const Key& key) {
    auto it = copies_.find(key);
    if (it == copies_.end()) return 0;
    const Iter entry = it->second.front();
    const int64_t cost = entry->cost;
    it->second.erase(it->second.begin());
    if (it->second.empty()) copies_.erase(it);
    order_.erase(entry);
    bytes_ -= cost;
    return cost;
  }
  // Evicts the least recent entry; returns its cost.
  int64_t evict_front() {
    const Key key = order_.front().key;
    auto it = copies_.find(key);
    // The front entry is its key's oldest copy: copies are appended in order.
    const int64_t cost = order_.front().cost;
    it->second.erase(it->second.begin());
    if (it->second.empty()) copies_.erase(it);
    order_.pop_front();
    bytes_ -= cost;
    return cost;
  }

 private:
  std::list<Entry> order_;
  absl::flat_hash_map<Key, std::vector<Iter>> copies_;
  int64_t bytes_ = 0;
};

// What vLLM caches, in one namespace: full attention blocks, partial attention entries and
// states, each under the fine (b-token) chain key at its end.
enum class VllmKind : uint8_t { kBlock, kPartial, kState };
using VllmKey = std::pair<uint64_t, VllmKind>;

// vLLM's one pool in bytes: cached entries in one LRU free queue, pinned bytes of the
// running request. Evicts from the front until a new entry fits.
class VllmPool {
 public:
  explicit VllmPool(int64_t capacity) : capacity_(capacity) {}

  bool contains(uint64_t key, VllmKind kind) const { return lru_.contains({key, kind}); }
  void pin_cached(uint64_t key, VllmKind kind) { pinned_ += lru_.take({key, kind}); }
  void pin_new(int64_t cost) {
    while (lru_.bytes() + pinned_ + cost > capacity_ && !lru_.empty()) lru_.evict_front();
    pinned_ += cost;
  }
  // Frees pinned bytes, cached under `key` (a copy, as vLLM keeps them) or not.
  void unpin(int64_t cost, uint64_t key, VllmKind kind, bool cache) {
    pinned_ -= cost;
    if (cache) lru_.push({key, kind}, cost);
  }
  bool overfull() const { return pinned_ > capacity_; }

 private:
  int64_t capacity_;
  int64_t pinned_ = 0;
  KeyedLru<VllmKey> lru_;
};

// vLLM's hit for `prompt`, in tokens: the largest p (a multiple of b, at most length - 1)
// with a state cached at p and the attention up to p: the full blocks before p, and at a p
// inside a block, a partial entry at p (the coordinator's fixed point of
// FullAttentionManager and MambaManager find_longest_cache_hit(), fine-grained).
int64_t vllm_hit(const VllmPool& pool, const PromptKeys& prompt, int32_t big, int32_t b) {
  const int64_t per = big / b;  // fine keys per big block
  const int64_t max_len = prompt.length - 1;
  int64_t full = 0;
  while (full < max_len / big && pool.contains(prompt.keys[(full + 1) * per - 1], VllmKind::kBlock))
    ++full;
  const int64_t top = std::min<int64_t>(max_len / b, (full + 1) * per - 1);
  for (int64_t i = top; i > 0; --i) {
    const uint64_t key = prompt.keys[i - 1];
    if (!pool.contains(key, VllmKind::kState)) continue;
    if (i % per == 0 || pool.contains(key, VllmKind::kPartial)) return i * b;
  }
  return 0;
}

// The positions where vLLM caches a state for a prompt computed from `hit`: every block
// boundary after it, and the partial tail (the last b boundary, when inside a block).
std::vector<int64_t> vllm_state_positions(int64_t length, int64_t hit, int32_t big, int32_t b) {
  std::vector<int64_t> out;
  for (int64_t p = (hit / big + 1) * big; p <= length; p += big) out.push_back(p);
  const int64_t tail = length / b * b;
  if (tail % big != 0 && tail > hit) out.push_back(tail);
  return out;
}

// One request under the rule.
void vllm_request(VllmPool& pool, const PromptKeys& prompt, const VllmStateSizes& sizes, int32_t b,
                  PrefixHits& result) {
  const int32_t big = sizes.block_tokens;
  const int64_t per = big / b;
  const int64_t hit = vllm_hit(pool, prompt, big, b);
  const int64_t hit_blocks = hit / big;  // full blocks shared; a partial hit is copied (CoW)
  const bool partial_hit = hit % big != 0;
  for (int64_t j = 0; j < hit_blocks; ++j)
    pool.pin_cached(prompt.keys[(j + 1) * per - 1], VllmKind::kBlock);
  if (partial_hit) pool.pin_cached(prompt.keys[hit / b - 1], VllmKind::kPartial);
  if (hit > 0) pool.pin_cached(prompt.keys[hit / b - 1], VllmKind::kState);
  // The request's own blocks, the running state, then its states in order, each freed
  // into the cache once the next one is written (remove_skipped_blocks()).
  const int64_t blocks = ceil_div(prompt.length, big);
  for (int64_t j = hit_blocks; j < blocks; ++j) pool.pin_new(sizes.block_bytes);
  pool.pin_new(sizes.state_bytes);
  const std::vector<int64_t> states = vllm_state_positions(prompt.length, hit, big, b);
  int64_t held = hit;  // the state the request holds for its last boundary
  for (int64_t p : states) {
    pool.pin_new(sizes.state_bytes);
    ++result.checkpoints_saved;
    if (held > 0) pool.unpin(sizes.state_bytes, prompt.keys[held / b - 1], VllmKind::kState, true);
    held = p;
  }
  // Free group after group, each tail first (KVCacheManager.free()).
  const int64_t tail = prompt.length / b * b;
  for (int64_t j = blocks - 1; j >= 0; --j) {
    const int64_t end = (j + 1) * big;
    if (end <= prompt.length) {
      pool.unpin(sizes.block_bytes, prompt.keys[end / b - 1], VllmKind::kBlock, true);
    } else {
      const bool partial = tail % big != 0 && tail > hit && tail > j * big;
      pool.unpin(sizes.block_bytes, partial ? prompt.keys[tail / b - 1] : 0, VllmKind::kPartial,
                 partial);
    }
  }
  if (partial_hit)
    pool.unpin(sizes.block_bytes, prompt.keys[hit / b - 1], VllmKind::kPartial, true);
  if (held > 0) pool.unpin(sizes.state_bytes, prompt.keys[held / b - 1], VllmKind::kState, true);
  pool.unpin(sizes.state_bytes, 0, VllmKind::kState, false);  // the running state
  result.hit_tokens += hit;
  result.hits += hit > 0 ? 1 : 0;
}

}  // namespace

PromptKeys prompt_keys(std::span<const TokenId> tokens, int32_t block_size) {
  PromptKeys out;
  out.length = static_cast<int32_t>(tokens.size());
  const size_t blocks = tokens.size() / block_size;
  out.keys.reserve(blocks);
  uint64_t key = 0x6a09e667f3bcc908ULL;
  for (size_t i = 0; i < blocks; ++i) {
    for (int32_t t = 0; t < block_size; ++t)
      key = mix64(key ^ static_cast<uint64_t>(tokens[i * block_size + t]));
    out.keys.push_back(key);
  }
  return out;
}

absl::StatusOr<PrefixHits> replay_vllm_state_rule(std::span<const PromptKeys> prompts,
                                                  const VllmStateSizes& sizes, int64_t pool_bytes,
                                                  int32_t block_size) {
  VllmPool pool(pool_bytes);
  PrefixHits r;
  for (const PromptKeys& prompt : prompts) {
    vllm_request(pool, prompt, sizes, block_size, r);
    if (pool.overfull()) {
      return absl::InvalidArgumentError(absl::StrCat("a prompt of ", prompt.length,
                                                     " tokens is larger than vLLM's pool of ",
                                                     pool_bytes, " bytes"));
    }
    ++r.requests;
    r.prompt_tokens += prompt.length;
  }
  return r;
}

}  // namespace pagedkv::sim
