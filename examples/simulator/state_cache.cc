#include "state_cache.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <list>
#include <random>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fmt/format.h"
#include "pagedkv/capacity_plan.h"
#include "pagedkv/hf_model_config.h"
#include "report.h"
#include "tokens.h"

namespace pagedkv::sim {
namespace {

constexpr uint64_t kConversationDomain = 0x434f4e5645525341ULL;  // "CONVERSA"
constexpr uint64_t kStateSystemDomain = 0x5354415445535953ULL;   // "STATESYS"

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- Keyed LRU ------------------------------------------------------------------------------

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

// pagedkv's attention pool: b-token blocks, LRU, one copy per content (a recomputed block
// whose content is still cached is not cached again). Blocks of the running request are
// pinned: out of the LRU order, counted against the capacity.
class AttentionPool {
 public:
  explicit AttentionPool(int64_t capacity) : capacity_(capacity) {}

  bool contains(uint64_t key) const { return lru_.contains(key); }
  void pin_cached(uint64_t key) {
    lru_.take(key);
    ++pinned_;
  }
  // A new block for the running request, evicting the least recent cached one if needed.
  void pin_new() {
    if (capacity_ >= 0 && lru_.bytes() + pinned_ >= capacity_) lru_.evict_front();
    ++pinned_;
  }
  // Frees a pinned block, cached under `key` unless that content is cached already
  // (`cache` false: freed uncached).
  void unpin(uint64_t key, bool cache) {
    --pinned_;
    if (cache && !lru_.contains(key)) lru_.push(key, 1);
  }

 private:
  int64_t capacity_;
  int64_t pinned_ = 0;
  KeyedLru<uint64_t> lru_;  // cost 1 per block
};

// The longest prefix of `keys`, at most `max_blocks`, held by the attention pool.
int64_t attention_match(const AttentionPool& pool, const PromptKeys& prompt, int64_t max_blocks) {
  int64_t m = 0;
  while (m < max_blocks && pool.contains(prompt.keys[m])) ++m;
  return m;
}

// The hit in blocks: the largest h <= m with a checkpoint after block h - 1.
int64_t checkpoint_hit(const CheckpointCache& cache, const PromptKeys& prompt, int64_t m) {
  for (int64_t h = m; h > 0; --h) {
    if (cache.contains(prompt.keys[h - 1])) return h;
  }
  return 0;
}

// ---- The vLLM rule --------------------------------------------------------------------------

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

// One request under the vLLM rule.
void vllm_request(VllmPool& pool, const PromptKeys& prompt, const StateModel& model, int32_t b,
                  StateReplayResult& result) {
  const int32_t big = model.vllm_block_tokens;
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
  for (int64_t j = hit_blocks; j < blocks; ++j) pool.pin_new(model.vllm_block_bytes);
  pool.pin_new(model.vllm_state_bytes);
  const std::vector<int64_t> states = vllm_state_positions(prompt.length, hit, big, b);
  int64_t held = hit;  // the state the request holds for its last boundary
  for (int64_t p : states) {
    pool.pin_new(model.vllm_state_bytes);
    ++result.checkpoints_saved;
    if (held > 0)
      pool.unpin(model.vllm_state_bytes, prompt.keys[held / b - 1], VllmKind::kState, true);
    held = p;
  }
  // Free group after group, each tail first (KVCacheManager.free()).
  const int64_t tail = prompt.length / b * b;
  for (int64_t j = blocks - 1; j >= 0; --j) {
    const int64_t end = (j + 1) * big;
    if (end <= prompt.length) {
      pool.unpin(model.vllm_block_bytes, prompt.keys[end / b - 1], VllmKind::kBlock, true);
    } else {
      const bool partial = tail % big != 0 && tail > hit && tail > j * big;
      pool.unpin(model.vllm_block_bytes, partial ? prompt.keys[tail / b - 1] : 0,
                 VllmKind::kPartial, partial);
    }
  }
  if (partial_hit)
    pool.unpin(model.vllm_block_bytes, prompt.keys[hit / b - 1], VllmKind::kPartial, true);
  if (held > 0)
    pool.unpin(model.vllm_state_bytes, prompt.keys[held / b - 1], VllmKind::kState, true);
  pool.unpin(model.vllm_state_bytes, 0, VllmKind::kState, false);  // the running state
  result.hit_tokens += hit;
  result.hits += hit > 0 ? 1 : 0;
}

// ---- The study ------------------------------------------------------------------------------

int64_t distinct_blocks(const StateWorkload& workload) {
  absl::flat_hash_map<uint64_t, bool> seen;
  for (const PromptKeys& p : workload.prompts)
    for (uint64_t k : p.keys) seen.emplace(k, true);
  return static_cast<int64_t>(seen.size());
}

// Log-uniform integer in [lo, hi].
int32_t log_uniform(std::mt19937_64& rng, int32_t lo, int32_t hi) {
  std::uniform_real_distribution<double> u(std::log(lo), std::log(hi + 1.0));
  return std::clamp(static_cast<int32_t>(std::exp(u(rng))), lo, hi);
}

}  // namespace

// ---- Workloads ------------------------------------------------------------------------------

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

StateWorkload state_workload(const Trace& trace, int32_t block_size) {
  StateWorkload w{trace.name, {}};
  w.prompts.reserve(trace.requests.size());
  for (size_t i = 0; i < trace.requests.size(); ++i) {
    const std::vector<TokenId> tokens = prompt_tokens(trace.requests[i], static_cast<int64_t>(i));
    w.prompts.push_back(prompt_keys(tokens, block_size));
    w.prompts.back().output = trace.requests[i].output_length;
  }
  return w;
}

StateWorkload shared_prompt_workload(const SharedPromptOptions& o, int32_t block_size) {
  std::mt19937_64 rng(o.seed);
  std::vector<int32_t> system(o.num_system_prompts);
  for (int32_t& s : system)
    s = std::uniform_int_distribution<int32_t>(o.system_min, o.system_max)(rng);
  struct Turn {
    double time;
    int32_t conversation;
    int32_t prompt;  // tokens after the system prompt
    int32_t answer;
  };
  std::vector<Turn> turns;
  std::vector<int32_t> conv_system(o.conversations);
  std::exponential_distribution<double> gap(1.0), turn_gap(1.0 / o.turn_gap);
  double start = 0;
  for (int32_t c = 0; c < o.conversations; ++c) {
    start += gap(rng);
    const bool none = std::uniform_real_distribution<double>(0, 1)(rng) < o.no_system_fraction;
    conv_system[c] =
        none ? -1 : std::uniform_int_distribution<int32_t>(0, o.num_system_prompts - 1)(rng);
    const int32_t n = std::uniform_int_distribution<int32_t>(1, o.max_turns)(rng);
    double t = start;
    int32_t length = 0;
    for (int32_t k = 0; k < n; ++k) {
      length += log_uniform(rng, o.user_min, o.user_max);
      const int32_t answer = log_uniform(rng, o.answer_min, o.answer_max);
      turns.push_back({t, c, length, answer});
      length += answer;  // the next turn's prompt holds this answer
      t += turn_gap(rng);
    }
  }
  std::stable_sort(turns.begin(), turns.end(),
                   [](const Turn& a, const Turn& b) { return a.time < b.time; });
  StateWorkload w{"generated-shared", {}};
  for (const Turn& turn : turns) {
    const int32_t s = conv_system[turn.conversation];
    const int32_t sys = s >= 0 ? system[s] : 0;
    std::vector<TokenId> tokens;
    tokens.reserve(sys + turn.prompt);
    for (int32_t p = 0; p < sys; ++p) tokens.push_back(derive_token(kStateSystemDomain, s, p));
    for (int32_t p = 0; p < turn.prompt; ++p)
      tokens.push_back(derive_token(kConversationDomain, turn.conversation, p));
    w.prompts.push_back(prompt_keys(tokens, block_size));
    w.prompts.back().output = turn.answer;
  }
  return w;
}

int64_t median_prompt_output(const StateWorkload& workload) {
  if (workload.prompts.empty()) return 0;
  std::vector<int64_t> lengths;
  for (const PromptKeys& p : workload.prompts) lengths.push_back(int64_t{p.length} + p.output);
  std::sort(lengths.begin(), lengths.end());
  return lengths[(lengths.size() + 1) / 2 - 1];
}

// ---- Models ---------------------------------------------------------------------------------

absl::StatusOr<StateModel> state_model(std::string name, const KvCacheConfig& config,
                                       int32_t vllm_block_tokens) {
  StateModel m{std::move(name), config};
  int64_t token_page = 0;  // one attention layer, one token
  int32_t attention_layers = 0, state_layers = 0;
  for (int32_t g = 0; g < config.num_groups(); ++g) {
    const KvCacheGroup& group = config.groups[g];
    if (group.kind == AttentionKind::kFull) {
      m.attention_bytes_per_token += config.bytes_per_token(g);
      attention_layers += group.shape.num_layers;
      token_page = std::max(token_page, config.bytes_per_token(g) / group.shape.num_layers);
    } else if (group.kind == AttentionKind::kState) {
      m.slot_bytes += group.state.bytes();
      state_layers += group.state.num_layers;
    }
  }
  int32_t full_groups = 0, state_groups = 0;
  for (const KvCacheGroup& group : config.groups) {
    full_groups += group.kind == AttentionKind::kFull ? 1 : 0;
    state_groups += group.kind == AttentionKind::kState ? 1 : 0;
  }
  if (full_groups != 1 || state_groups != 1 || config.num_groups() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(m.name, ": the state study takes one full-attention and one state group, not ",
                     full_groups, " and ", state_groups, " of ", config.num_groups()));
  }
  if (attention_layers == 0 || state_layers == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(m.name, ": the state study needs full-attention and state groups (",
                     attention_layers, " attention and ", state_layers, " state layers)"));
  }
  if (vllm_block_tokens <= 0 || vllm_block_tokens % config.block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(m.name, ": vLLM block of ", vllm_block_tokens,
                                                   " tokens, not a positive multiple of ",
                                                   config.block_size));
  }
  const int64_t page = vllm_block_tokens * token_page;
  for (const KvCacheGroup& group : config.groups) {
    if (group.kind == AttentionKind::kState && group.state.bytes_per_layer() > page) {
      return absl::InvalidArgumentError(absl::StrCat(
          m.name, ": vLLM block of ", vllm_block_tokens, " tokens holds ", page,
          " bytes per layer, less than a state layer's ", group.state.bytes_per_layer()));
    }
  }
  m.vllm_block_tokens = vllm_block_tokens;
  m.vllm_state_bytes = state_layers * page;
  m.vllm_block_bytes = attention_layers * page;
  return m;
}

namespace {

// The built-in models: a short name and its fixture directory.
constexpr std::pair<std::string_view, std::string_view> kStateModels[] = {
    {"qwen3-next-80b-a3b", "Qwen--Qwen3-Next-80B-A3B-Instruct"},
    {"nemotron-h-8b", "nvidia--Nemotron-H-8B-Base-8K"},
    {"granite-4.0-h-tiny", "ibm-granite--granite-4.0-h-tiny"},
};

}  // namespace

std::vector<std::string> builtin_state_model_names() {
  std::vector<std::string> names;
  for (const auto& [name, dir] : kStateModels) names.emplace_back(name);
  return names;
}

absl::StatusOr<StateModel> builtin_state_model(std::string_view name) {
  for (const auto& [known, dir] : kStateModels) {
    if (known != name) continue;
    absl::StatusOr<HfModelConfig> hf =
        read_hf_config(absl::StrCat(PAGEDKV_FIXTURES_DIR, "/", std::string(dir), "/excerpt.json"));
    if (!hf.ok()) return hf.status();
    absl::StatusOr<int32_t> block = vllm_state_block_size(hf->kv);
    if (!block.ok()) return block.status();
    return state_model(std::string(name), hf->kv, *block);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown state model '", std::string(name),
                   "'; known: ", absl::StrJoin(builtin_state_model_names(), ", ")));
}

// ---- Policies -------------------------------------------------------------------------------

CheckpointPolicy CheckpointPolicy::pagedkv() { return {.name = "pagedkv"}; }
CheckpointPolicy CheckpointPolicy::classes() {
  return {.name = "classes: never-hit, then shortest, first", .eviction = Eviction::kClasses};
}
CheckpointPolicy CheckpointPolicy::every_block() {
  return {.name = "every block + LRU", .every_blocks = 1};
}

CheckpointPolicy CheckpointPolicy::with_every(CheckpointPolicy base, int32_t blocks) {
  base.name += absl::StrCat(" + every ", blocks);
  base.every_blocks = blocks;
  return base;
}

std::vector<int64_t> admission_positions(int64_t prompt_len, int64_t match_tokens,
                                         int64_t hit_tokens, const CheckpointPolicy& policy,
                                         int32_t block_size) {
  const int64_t end = prompt_len / block_size * block_size;
  std::vector<int64_t> out;
  if (policy.every_blocks > 0) {
    const int64_t step = int64_t{policy.every_blocks} * block_size;
    for (int64_t p = (hit_tokens / step + 1) * step; p <= end; p += step) out.push_back(p);
  }
  // The branch point: the match ended inside the prompt, at least one block before its end.
  if (policy.branch_point && match_tokens > 0 && match_tokens + block_size <= prompt_len)
    out.push_back(match_tokens);
  if (policy.prompt_end) out.push_back(end);
  std::erase_if(out, [&](int64_t p) { return p <= hit_tokens; });  // only computed states
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

int32_t checkpoint_bucket(int64_t position, int32_t block_size) {
  return std::bit_width(static_cast<uint64_t>(position / block_size)) - 1;
}

// ---- pagedkv's state pool -------------------------------------------------------------------

CheckpointCache::CheckpointCache(int64_t capacity, const CheckpointPolicy& policy,
                                 int32_t block_size)
    : capacity_(capacity), policy_(policy), block_size_(block_size) {}

void CheckpointCache::hit(uint64_t key) {
  Entry& e = entries_.at(key);
  order_.erase(rank(key, e));
  if (e.hits++ == 0) ++hit_class_;
  e.stamp = ++clock_;
  order_.insert(rank(key, e));
  hit_class_peak_ = std::max(hit_class_peak_, hit_class_);
}

void CheckpointCache::save(uint64_t key, int64_t position) {
  if (auto it = entries_.find(key); it != entries_.end()) {
    order_.erase(rank(key, it->second));
    it->second.stamp = ++clock_;
    order_.insert(rank(key, it->second));
    return;
  }
  if (capacity_ >= 0 && size() >= capacity_) evict_one();
  const Entry e{position, 0, ++clock_};
  entries_.emplace(key, e);
  order_.insert(rank(key, e));
  ++saved_;
}

CheckpointCache::Rank CheckpointCache::rank(uint64_t key, const Entry& e) const {
  if (policy_.eviction == CheckpointPolicy::Eviction::kLru) return {0, 0, e.stamp, key};
  return {e.hits > 0 ? 1 : 0, checkpoint_bucket(e.position, block_size_), e.stamp, key};
}

void CheckpointCache::evict_one() {
  const uint64_t key = std::get<3>(*order_.begin());
  order_.erase(order_.begin());
  if (entries_.at(key).hits > 0) --hit_class_;
  entries_.erase(key);
  ++evicted_;
}

// ---- Replays --------------------------------------------------------------------------------

absl::StatusOr<StateReplayResult> replay_pagedkv_state(const StateWorkload& workload,
                                                       int64_t attention_blocks,
                                                       int64_t state_slots,
                                                       const CheckpointPolicy& policy,
                                                       int32_t block_size) {
  if (state_slots >= 0 && state_slots < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("state pool of ", state_slots, " slots: one runs the sequence, 2 at least"));
  }
  AttentionPool attention(attention_blocks);
  CheckpointCache checkpoints(state_slots < 0 ? -1 : state_slots - 1, policy, block_size);
  StateReplayResult r;
  for (const PromptKeys& prompt : workload.prompts) {
    const int64_t blocks = ceil_div(prompt.length, block_size);
    if (attention_blocks >= 0 && blocks > attention_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("a prompt of ", prompt.length,
                                                     " tokens is larger than the attention pool (",
                                                     attention_blocks, " blocks)"));
    }
    // The branch point is where the chain stops matching; the hit may claim at most
    // length - 1 tokens, as match_prefix() does.
    const int64_t chain = attention_match(attention, prompt, std::ssize(prompt.keys));
    const int64_t m = std::min<int64_t>(chain, (prompt.length - 1) / block_size);
    const int64_t h = checkpoint_hit(checkpoints, prompt, m);
    if (h > 0) checkpoints.hit(prompt.keys[h - 1]);
    for (int64_t i = 0; i < h; ++i) attention.pin_cached(prompt.keys[i]);
    for (int64_t i = h; i < blocks; ++i) attention.pin_new();
    for (int64_t i = blocks - 1; i >= 0; --i) {  // tail first: the head ends most recent
      const bool full = i < static_cast<int64_t>(prompt.keys.size());
      attention.unpin(full ? prompt.keys[i] : 0, full);
    }
    for (int64_t p : admission_positions(prompt.length, chain * block_size, h * block_size, policy,
                                         block_size)) {
      checkpoints.save(prompt.keys[p / block_size - 1], p);
    }
    ++r.requests;
    r.prompt_tokens += prompt.length;
    r.hit_tokens += h * block_size;
    r.attention_tokens += m * block_size;
    r.hits += h > 0 ? 1 : 0;
  }
  r.checkpoints_saved = checkpoints.saved();
  r.checkpoints_evicted = checkpoints.evicted();
  r.hit_class_peak = checkpoints.hit_class_peak();
  return r;
}

absl::StatusOr<StateReplayResult> replay_vllm_state(const StateWorkload& workload,
                                                    const StateModel& model, int64_t pool_bytes,
                                                    int32_t block_size) {
  VllmPool pool(pool_bytes);
  StateReplayResult r;
  for (const PromptKeys& prompt : workload.prompts) {
    vllm_request(pool, prompt, model, block_size, r);
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

absl::StatusOr<StateSplit> split_state_budget(const StateModel& model, int64_t budget_bytes,
                                              int64_t target_tokens,
                                              int32_t checkpoints_per_sequence) {
  KvCacheConfig config = model.config;
  config.checkpoints_per_sequence = checkpoints_per_sequence;
  absl::StatusOr<PoolSplit> split = config.split_budget(budget_bytes, target_tokens);
  if (!split.ok()) return split.status();
  StateSplit s;
  for (int32_t g = 0; g < config.num_groups(); ++g) {
    // state_model() allows one attention and one state group.
    (config.is_state(g) ? s.state_slots : s.attention_blocks) = split->groups[g].num_blocks;
  }
  return s;
}

// ---- The study ------------------------------------------------------------------------------

absl::StatusOr<StateStudy> state_study(const StateWorkload& workload, const StateModel& model,
                                       const StateStudyOptions& options) {
  const int32_t b = options.block_size;
  StateStudy study;
  study.model = model.name;
  study.workload = workload.name;
  study.requests = static_cast<int64_t>(workload.prompts.size());
  for (const PromptKeys& p : workload.prompts) study.prompt_tokens += p.length;
  study.target_tokens = median_prompt_output(workload);
  study.vllm_block_tokens = model.vllm_block_tokens;
  const std::vector<CheckpointPolicy>& policies = options.policies;
  for (const CheckpointPolicy& p : policies) study.policy_names.push_back(p.name);

  absl::StatusOr<StateReplayResult> unbounded =
      replay_pagedkv_state(workload, -1, -1, policies[0], b);
  if (!unbounded.ok()) return unbounded.status();
  study.unbounded = *unbounded;
  study.footprint_blocks = distinct_blocks(workload);
  study.footprint_checkpoints = unbounded->checkpoints_saved;
  study.footprint_bytes = study.footprint_blocks * b * model.attention_bytes_per_token +
                          study.footprint_checkpoints * model.slot_bytes;

  int32_t longest = 0;
  for (const PromptKeys& p : workload.prompts) longest = std::max(longest, p.length);
  // Both models must hold the longest prompt while it runs: its blocks, and for vLLM its
  // running state and the two boundary states it holds while writing the next.
  auto fits = [&](const StateSplit& split, int64_t budget) {
    const int64_t vllm_need = ceil_div(longest, model.vllm_block_tokens) * model.vllm_block_bytes +
                              3 * model.vllm_state_bytes;
    return split.attention_blocks >= ceil_div(longest, b) && split.state_slots >= 2 &&
           budget >= vllm_need;
  };
  for (double fraction : options.fractions) {
    StateStudyRow row;
    row.fraction = fraction;
    row.budget_bytes = static_cast<int64_t>(fraction * study.footprint_bytes);
    absl::StatusOr<StateSplit> split = split_state_budget(
        model, row.budget_bytes, study.target_tokens, options.checkpoints_per_sequence);
    if (!split.ok()) return split.status();
    row.split = *split;
    row.fits = fits(row.split, row.budget_bytes);
    for (const CheckpointPolicy& policy : policies) {
      if (!row.fits) break;
      absl::StatusOr<StateReplayResult> r = replay_pagedkv_state(
          workload, row.split.attention_blocks, row.split.state_slots, policy, b);
      if (!r.ok()) return r.status();
      row.policies.push_back(*r);
    }
    if (row.fits) {
      absl::StatusOr<StateReplayResult> v = replay_vllm_state(workload, model, row.budget_bytes, b);
      if (!v.ok()) return v.status();
      row.vllm = *v;
    }
    study.rows.push_back(std::move(row));
  }
  const int64_t budget = static_cast<int64_t>(options.sensitivity_fraction * study.footprint_bytes);
  for (int32_t share : options.sensitivity) {
    absl::StatusOr<StateSplit> split =
        split_state_budget(model, budget, study.target_tokens, share);
    if (!split.ok()) return split.status();
    if (!fits(*split, budget)) continue;
    absl::StatusOr<StateReplayResult> r =
        replay_pagedkv_state(workload, split->attention_blocks, split->state_slots, policies[0], b);
    if (!r.ok()) return r.status();
    study.sensitivity.emplace_back(share, *r);
  }
  return study;
}

std::string format_state_study(const StateStudy& s) {
  std::string out = fmt::format(
      "State-layer prefix hits, {} on {} ({} requests, {} prompt tokens; split for {} tokens; "
      "footprint {} blocks + {} checkpoints = {:.0f} GiB; vLLM block {} tokens)\n",
      s.model, s.workload, commas(s.requests), commas(s.prompt_tokens), commas(s.target_tokens),
      commas(s.footprint_blocks), commas(s.footprint_checkpoints),
      s.footprint_bytes / double(int64_t{1} << 30), s.vllm_block_tokens);
  out += fmt::format("  unbounded: pagedkv hits {} ({:.3f}), attention alone holds {}\n",
                     commas(s.unbounded.hit_tokens), s.unbounded.hit_rate(),
                     commas(s.unbounded.attention_tokens));
  out += "| pool | GiB | blocks / slots |";
  for (const std::string& n : s.policy_names) out += fmt::format(" {} |", n);
  out += " vLLM rule | pagedkv / vLLM |\n|---:|---:|---|";
  for (size_t i = 0; i <= s.policy_names.size() + 1; ++i) out += "---:|";
  out += "\n";
  for (const StateStudyRow& row : s.rows) {
    out += fmt::format("| {:.0f} % | {:.0f} | {} / {} |", row.fraction * 100,
                       row.budget_bytes / double(int64_t{1} << 30),
                       commas(row.split.attention_blocks), commas(row.split.state_slots));
    if (!row.fits) {
      out += " a pool below the longest prompt |\n";
      continue;
    }
    for (const StateReplayResult& r : row.policies)
      out += fmt::format(" {} ({:.3f}) |", commas(r.hit_tokens), r.hit_rate());
    out += fmt::format(" {} ({:.3f}) |", commas(row.vllm.hit_tokens), row.vllm.hit_rate());
    const double ratio = row.vllm.hit_tokens > 0
                             ? static_cast<double>(row.policies[0].hit_tokens) / row.vllm.hit_tokens
                             : INFINITY;
    out += fmt::format(" {:.2f} |\n", ratio);
  }
  out += "  recomputed tokens (pagedkv / vLLM rule):";
  for (const StateStudyRow& row : s.rows) {
    if (!row.fits) continue;
    out += fmt::format(" {:.0f} %: {} / {};", row.fraction * 100,
                       commas(row.policies[0].recomputed_tokens()),
                       commas(row.vllm.recomputed_tokens()));
  }
  out += "\n  pagedkv's hits by checkpoints per sequence in the split:";
  for (const auto& [share, r] : s.sensitivity)
    out += fmt::format(" {}: {:.3f};", share, r.hit_rate());
  out += "\n";
  return out;
}

}  // namespace pagedkv::sim
