// File: tests/support/reference_model.h
//
// ReferenceModel: a deliberately plain, obviously-correct model of KvCacheManager's
// observable behaviour, written from the header contracts (kv_cache_manager.h,
// block_pool.h) for the property tests and fuzzers. It shares no code with src/: no
// intrusive lists, no counters kept in sync, no lazily cached hashes. Every derived fact
// (free count, which blocks a pending copy names, ref counts) is recomputed by scanning.
//
// What it models, per call: the status code, the returned value (hit length, slot mapping,
// copies), and the state afterwards:
//   - each sequence: state, priority, arrival, tokens, computed count, device table, host
//     blocks, how many of its full blocks were offered to the prefix index;
//   - each device and host block: its ref count (tables holding it, plus blocks parked
//     because a pending copy still names them), retention priority and duration;
//   - both free queues, head (allocated next) to tail, as plain vectors: a clean list and
//     one list per retention priority; a release puts hashed blocks at the tail of their
//     priority's list and the others at the head of the clean list, each group in the
//     given order; allocation takes the clean list, then the lowest priority's list; an
//     expired retention moves a block to the default priority's list by release order;
//   - the prefix index of each pool (the host pool's is the host tier): BlockHash ->
//     block, where a hit must also match the stored tokens, extra keys and parent
//     contents (a block's `content` key changes whenever it is allocated, that is whenever
//     its contents may change, and travels with a demoted or promoted copy), plus per hash
//     the standby duplicates that take the indexed block's place when it leaves (newest
//     first);
//   - the host tier: a device block that eviction drops from the index is copied to a host
//     block (a demote op), match_prefix continues into host hits and promotes them;
//   - counters (Stats), KV events and preemption hooks.
// Contract choices the header leaves open are marked "NOTE (contract)"; the model follows
// the implementation there so that a disagreement means a bug, not a taste difference.
#ifndef PAGEDKV_TESTS_SUPPORT_REFERENCE_MODEL_H_
#define PAGEDKV_TESTS_SUPPORT_REFERENCE_MODEL_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/kv_events.h"
#include "pagedkv/retention.h"
#include "pagedkv/types.h"

namespace pagedkv::testing {

class ReferenceModel {
 public:
  using Code = absl::StatusCode;

  struct Seq {
    SeqId id = 0;
    SequenceState state = SequenceState::kWaiting;
    int32_t priority = 0;
    int64_t arrival = 0;
    std::vector<TokenId> tokens;
    std::vector<uint64_t> extra_keys;
    int32_t computed = 0;
    std::vector<BlockId> table;  // device blocks
    std::vector<BlockId> host;   // host blocks (swapped)
    int32_t offered = 0;         // leading full blocks already offered to the index
    // Scheduled: got slots (allocate_slots with new tokens) or was swapped in during the
    // current step; `settled` tokens were computed before that. Forks inherit both.
    uint64_t scheduled_step = 0;
    int32_t settled = 0;
    bool kv_before_reset = false;  // held K/V at a reset_prefix_cache(): offers nothing
    std::vector<RetentionRange> retention;
  };

  enum class Role { kNone, kIndexed, kStandby };

  struct Block {
    int32_t ref = 0;
    Role role = Role::kNone;  // holds a hash: indexed, or standby of the indexed block
    uint64_t content = 0;     // new on every allocation; a standby or copy shares its original's
    uint64_t write_step = 0;  // device: the step whose writes, swap-in or promotion fill it
    bool copy_only = false;   // ... and whether a swap-in or promotion alone fills it
    // Valid while cached (and, for the copy eviction makes, after): what a hit must match.
    BlockHash hash;
    uint64_t parent_content = 0;  // 0: first block
    std::optional<BlockHash> parent_hash;
    std::vector<TokenId> tokens;
    std::vector<uint64_t> extra_keys;
    int32_t priority = kNone;  // set since it left the free queue; kNone: the default applies
    int64_t duration = 0;
    uint64_t stamp = 0;  // when it last joined a priority's list
    bool cached() const { return role != Role::kNone; }
    int32_t effective_priority() const {
      return priority == kNone ? kDefaultRetentionPriority : priority;
    }
    static constexpr int32_t kNone = -1;
  };
  using DeviceBlock = Block;

  struct Counters {
    int64_t prefix_query_tokens = 0;
    int64_t prefix_hit_tokens = 0;
    int64_t evictions = 0;
    int64_t cow_copies = 0;
    int64_t preemptions_recompute = 0;
    int64_t preemptions_swap = 0;
    int64_t blocks_swapped_out = 0;
    int64_t blocks_swapped_in = 0;
    int64_t claims_released = 0;
    int64_t host_hit_tokens = 0;
    int64_t blocks_demoted = 0;
    int64_t blocks_promoted = 0;
  };

  // Mirrors KvCacheManager::create(): InvalidArgument for any bad option.
  static Code validate(const KvCacheManager::Options& o) {
    if (o.num_blocks <= 0 || o.block_size <= 0 || o.num_host_blocks < 0 || o.max_model_len <= 0 ||
        o.watermark_blocks < 0 || o.watermark_blocks >= o.num_blocks || o.hash_fn == nullptr) {
      return Code::kInvalidArgument;
    }
    if (o.enable_host_cache && (!o.enable_prefix_caching || o.num_host_blocks == 0)) {
      return Code::kInvalidArgument;
    }
    return Code::kOk;
  }

  // NOTE (contract): host content keys start at 2^63, apart from the device's (from 1).
  explicit ReferenceModel(const KvCacheManager::Options& o)
      : opts_(o),
        device_(Medium::kDevice, o.num_blocks, 1),
        host_(Medium::kHost, o.num_host_blocks, uint64_t{1} << 63) {}

  // --- calls -----------------------------------------------------------------------------

  Code add_sequence(SeqId id, std::span<const TokenId> prompt, int32_t priority,
                    std::span<const uint64_t> extra_keys,
                    std::span<const RetentionRange> retention = {}) {
    if (seqs_.count(id)) return Code::kAlreadyExists;
    if (prompt.empty()) return Code::kInvalidArgument;
    if (static_cast<int64_t>(prompt.size()) > opts_.max_model_len) return Code::kInvalidArgument;
    if (blocks_for(static_cast<int64_t>(prompt.size())) > opts_.num_blocks) {
      return Code::kInvalidArgument;
    }
    for (const RetentionRange& r : retention) {
      if (r.begin < 0 || r.end < r.begin || r.priority < kMinRetentionPriority ||
          r.priority > kMaxRetentionPriority || r.duration_ms < 0) {
        return Code::kInvalidArgument;
      }
    }
    Seq s;
    s.id = id;
    s.priority = priority;
    s.arrival = next_arrival_++;
    s.tokens.assign(prompt.begin(), prompt.end());
    s.extra_keys.assign(extra_keys.begin(), extra_keys.end());
    s.retention.assign(retention.begin(), retention.end());
    seqs_.emplace(id, std::move(s));
    return Code::kOk;
  }

  Code append_tokens(SeqId id, std::span<const TokenId> tokens) {
    Seq* s = find(id);
    if (s == nullptr) return Code::kNotFound;
    if (static_cast<int64_t>(s->tokens.size()) + static_cast<int64_t>(tokens.size()) >
        opts_.max_model_len) {
      return Code::kInvalidArgument;
    }
    s->tokens.insert(s->tokens.end(), tokens.begin(), tokens.end());
    return Code::kOk;
  }

  std::pair<Code, int32_t> match_prefix(SeqId id) {
    Seq* s = find(id);
    if (s == nullptr) return {Code::kNotFound, 0};
    // NOTE (contract): a waiting sequence that already claimed a prefix cannot match again.
    if (s->state != SequenceState::kWaiting || !s->table.empty()) {
      return {Code::kFailedPrecondition, 0};
    }
    const auto len = static_cast<int64_t>(s->tokens.size());
    counters_.prefix_query_tokens += len;
    if (!opts_.enable_prefix_caching) return {Code::kOk, 0};
    const int32_t bs = opts_.block_size;
    const auto max_blocks = static_cast<int32_t>((len - 1) / bs);  // never the last token
    const std::vector<BlockHash> hashes = block_hashes(*s, max_blocks);
    std::vector<BlockId> hits;
    uint64_t parent_content = 0;
    for (int32_t i = 0; i < max_blocks; ++i) {
      const BlockId c = find_hit(device_, hashes[i], parent_content, *s, i);
      if (c == kNoBlock) break;
      hits.push_back(c);
      parent_content = device_.blocks[c].content;
    }
    for (const BlockId b : hits) touch(device_, b);
    s->table = hits;
    if (opts_.enable_host_cache) promote(*s, hashes, max_blocks, parent_content);
    s->computed = static_cast<int32_t>(s->table.size()) * bs;
    s->offered = static_cast<int32_t>(s->table.size());
    // Hitting a block that this step still fills makes the sequence scheduled from there.
    for (size_t i = 0; i < s->table.size(); ++i) {
      if (device_.blocks[s->table[i]].write_step == step_) {
        mark_scheduled(*s, static_cast<int32_t>(i) * bs);
        break;
      }
    }
    counters_.prefix_hit_tokens += s->computed;
    return {Code::kOk, s->computed};
  }

  std::pair<Code, std::vector<int64_t>> allocate_slots(SeqId id, int32_t n, int32_t lookahead) {
    Seq* s = find(id);
    if (s == nullptr) return {Code::kNotFound, {}};
    return allocate(*s, n, lookahead);
  }

  std::pair<Code, std::vector<int64_t>> allocate_slots_or_preempt(SeqId id, int32_t n,
                                                                  int32_t lookahead) {
    Seq* s = find(id);
    if (s == nullptr) return {Code::kNotFound, {}};
    while (true) {
      auto result = allocate(*s, n, lookahead);
      if (result.first != Code::kResourceExhausted) return result;
      if (release_one_claim(id)) continue;
      // Candidates: running sequences but the requester and those scheduled in this step, in
      // arrival order, as the policy sees them.
      std::vector<SequenceInfo> running;
      for (const auto& [vid, v] : seqs_) {
        if (vid == id || v.state != SequenceState::kRunning || scheduled(v)) continue;
        running.push_back({vid, v.priority, v.arrival, static_cast<int32_t>(v.table.size()),
                           static_cast<int32_t>(v.tokens.size()), v.computed});
      }
      std::sort(running.begin(), running.end(),
                [](const auto& a, const auto& b) { return a.arrival < b.arrival; });
      if (running.empty()) return result;
      SeqId victim_id = 0;
      PreemptionMode mode = opts_.preemption_mode;
      if (opts_.victim_policy) {
        // NOTE (contract): a policy that gives up, names the requester or names a sequence
        // that is not running makes the call fail with ResourceExhausted.
        const std::optional<Preemption> choice = opts_.victim_policy(running, id);
        if (!choice.has_value() || choice->victim == id) return result;
        const Seq* v = find(choice->victim);
        if (v == nullptr || v->state != SequenceState::kRunning || scheduled(*v)) return result;
        victim_id = choice->victim;
        mode = choice->mode;
      } else {
        // Default policy: lowest priority, then latest arrival; swap only if the host fits it.
        const SequenceInfo* victim = &running.front();
        for (const SequenceInfo& v : running) {
          if (v.priority < victim->priority ||
              (v.priority == victim->priority && v.arrival > victim->arrival)) {
            victim = &v;
          }
        }
        if (mode == PreemptionMode::kSwap &&
            blocks_for(victim->num_computed_tokens) > static_cast<int64_t>(queue_size(host_))) {
          mode = PreemptionMode::kRecompute;
        }
        victim_id = victim->id;
      }
      const Code c = preempt(victim_id, mode);
      if (c != Code::kOk) return {c, {}};
    }
  }

  Code preempt(SeqId id, PreemptionMode mode) {
    Seq* s = find(id);
    if (s == nullptr) return Code::kNotFound;
    if (s->state != SequenceState::kRunning) return Code::kFailedPrecondition;
    // Its new K/V is not written before the step: neither a swap-out nor a later prefix hit
    // could read it.
    if (scheduled(*s)) return Code::kFailedPrecondition;
    const int32_t bs = opts_.block_size;
    if (mode == PreemptionMode::kSwap) {
      const auto needed = static_cast<int32_t>(blocks_for(s->computed));
      if (needed > static_cast<int32_t>(queue_size(host_))) return Code::kResourceExhausted;
      s->host = allocate(host_, needed);
      for (int32_t i = 0; i < needed; ++i) {
        pending_.swap_out.push_back({s->table[i], s->host[i], std::min(bs, s->computed - i * bs)});
      }
      counters_.blocks_swapped_out += needed;
      ++counters_.preemptions_swap;
      release_device(*s);
      s->state = SequenceState::kSwapped;
    } else {
      release_device(*s);
      s->computed = 0;
      s->kv_before_reset = false;
      s->state = SequenceState::kWaiting;
      ++counters_.preemptions_recompute;
    }
    s->offered = 0;
    preemptions_.push_back({id, mode});
    return Code::kOk;
  }

  Code swap_in(SeqId id) {
    Seq* s = find(id);
    if (s == nullptr) return Code::kNotFound;
    if (s->state != SequenceState::kSwapped) return Code::kFailedPrecondition;
    const auto needed = static_cast<int32_t>(s->host.size());
    if (needed > static_cast<int32_t>(queue_size(device_))) return Code::kResourceExhausted;
    s->table = allocate_device(needed);
    const int32_t bs = opts_.block_size;
    for (int32_t i = 0; i < needed; ++i) {
      pending_.swap_in.push_back({s->host[i], s->table[i], std::min(bs, s->computed - i * bs)});
      device_.blocks[s->table[i]].write_step = step_;
      device_.blocks[s->table[i]].copy_only = true;
    }
    counters_.blocks_swapped_in += needed;
    release_host(*s);
    s->state = SequenceState::kRunning;
    mark_scheduled(*s, 0);  // nothing is on the device before the swap-in runs
    offer(*s);
    return Code::kOk;
  }

  Code fork(SeqId parent, SeqId child) {
    Seq* p = find(parent);
    if (p == nullptr) return Code::kNotFound;
    if (seqs_.count(child)) return Code::kAlreadyExists;
    if (p->state == SequenceState::kSwapped) return Code::kFailedPrecondition;
    Seq c = *p;
    c.id = child;
    c.arrival = next_arrival_++;
    c.table.resize(static_cast<size_t>(blocks_for(p->computed)));  // computed blocks only
    c.offered = std::min(c.offered, static_cast<int32_t>(c.table.size()));
    for (const BlockId b : c.table) touch(device_, b);
    seqs_.emplace(child, std::move(c));
    return Code::kOk;
  }

  Code free(SeqId id) {
    Seq* s = find(id);
    if (s == nullptr) return Code::kNotFound;
    unshare_unwritten(*s);
    release_device(*s);
    release_host(*s);
    seqs_.erase(id);
    return Code::kOk;
  }

  Code release_claim(SeqId id) {
    Seq* s = find(id);
    if (s == nullptr) return Code::kNotFound;
    if (s->state != SequenceState::kWaiting) return Code::kFailedPrecondition;
    drop_claim(*s);
    return Code::kOk;
  }

  StepOps take_step_ops() {
    StepOps out = std::exchange(pending_, {});
    release_deferred();
    ++step_;  // taking the ops ends the step's scheduling
    return out;
  }

  void reset_prefix_cache() {
    for (Pool* pool : {&device_, &host_}) {
      for (Block& b : pool->blocks) b.role = Role::kNone;
      pool->index.clear();
      pool->standby.clear();
    }
    for (auto& [id, s] : seqs_) {
      if (s.computed > 0 || !s.table.empty()) s.kv_before_reset = true;
    }
    events_.push_back(AllBlocksCleared{});
  }

  // --- lookups -----------------------------------------------------------------------------

  const Seq* find(SeqId id) const {
    const auto it = seqs_.find(id);
    return it == seqs_.end() ? nullptr : &it->second;
  }
  Seq* find(SeqId id) {
    const auto it = seqs_.find(id);
    return it == seqs_.end() ? nullptr : &it->second;
  }
  const std::map<SeqId, Seq>& sequences() const { return seqs_; }
  const std::vector<Block>& device_blocks() const { return device_.blocks; }
  const std::vector<Block>& host_blocks() const { return host_.blocks; }
  std::vector<BlockId> device_queue() const { return queue_order(device_); }
  std::vector<BlockId> host_queue() const { return queue_order(host_); }
  int64_t evictions() const { return device_.evictions; }
  int64_t host_evictions() const { return host_.evictions; }
  const Counters& counters() const { return counters_; }
  const StepOps& pending_ops() const { return pending_; }
  const KvCacheManager::Options& options() const { return opts_; }
  int32_t used_host_blocks() const {
    return static_cast<int32_t>(std::count_if(host_.blocks.begin(), host_.blocks.end(),
                                              [](const Block& b) { return b.ref > 0; }));
  }
  int32_t cached_free_blocks() const {
    return static_cast<int32_t>(
        std::count_if(device_.blocks.begin(), device_.blocks.end(),
                      [](const Block& b) { return b.cached() && b.ref == 0; }));
  }
  int32_t cached_host_blocks() const {
    return static_cast<int32_t>(std::count_if(host_.blocks.begin(), host_.blocks.end(),
                                              [](const Block& b) { return b.cached(); }));
  }
  std::vector<KvEvent> take_events() { return std::exchange(events_, {}); }
  std::vector<Preemption> take_preemptions() { return std::exchange(preemptions_, {}); }
  std::vector<SeqId> take_claim_releases() { return std::exchange(claim_releases_, {}); }

  // The chained hashes of the first n blocks of `s`, recomputed with the injected function.
  std::vector<BlockHash> block_hashes(const Seq& s, int32_t n) const {
    std::vector<BlockHash> out;
    for (int32_t j = 0; j < n; ++j) {
      out.push_back(
          opts_.hash_fn(j == 0 ? nullptr : &out.back(), block_tokens(s, j), s.extra_keys));
    }
    return out;
  }

 private:
  using Key = std::pair<uint64_t, uint64_t>;
  static Key key(const BlockHash& h) { return {h.lo, h.hi}; }

  // One pool of blocks: the device pool, or the host pool (swap blocks and the host tier).
  struct Pool {
    struct Expiry {
      int64_t time = 0;
      BlockId block = kNoBlock;
      uint64_t stamp = 0;
    };
    Pool(Medium m, int32_t n, uint64_t first_content)
        : medium(m), blocks(n), next_content(first_content) {
      for (BlockId b = 0; b < n; ++b) clean.push_back(b);
    }
    Medium medium;
    std::vector<Block> blocks;
    std::vector<BlockId> clean;                      // free and never cached since, head first
    std::map<int32_t, std::vector<BlockId>> levels;  // priority -> its list, LRU first
    std::map<Key, BlockId> index;
    std::map<Key, std::vector<BlockId>> standby;  // per hash, newest first
    uint64_t next_content;
    uint64_t last_stamp = 0;
    int64_t evictions = 0;
    std::vector<Expiry> expiries;
  };

  // A device block eviction dropped from the index: the host tier's copy is made from it.
  struct Evicted {
    BlockId block;
    BlockHash hash;
    uint64_t content;
    int32_t priority;
    int64_t duration;
  };

  int64_t blocks_for(int64_t tokens) const {
    return (tokens + opts_.block_size - 1) / opts_.block_size;
  }

  std::vector<TokenId> block_tokens(const Seq& s, int32_t i) const {
    const auto begin = s.tokens.begin() + static_cast<int64_t>(i) * opts_.block_size;
    return std::vector<TokenId>(begin, begin + opts_.block_size);
  }

  int64_t now() const {
    // NOTE (contract): without a clock the pools read steady_clock; the driver injects one.
    return opts_.clock ? opts_.clock() : 0;
  }

  // --- free queues ---

  static size_t queue_size(const Pool& p) {
    size_t n = p.clean.size();
    for (const auto& [priority, list] : p.levels) n += list.size();
    return n;
  }
  static std::vector<BlockId> queue_order(const Pool& p) {
    std::vector<BlockId> order = p.clean;
    for (const auto& [priority, list] : p.levels)
      order.insert(order.end(), list.begin(), list.end());
    return order;
  }
  static bool queued_in(const std::vector<BlockId>& list, BlockId b) {
    return std::find(list.begin(), list.end(), b) != list.end();
  }
  static void queue_erase(Pool& p, BlockId b) {
    std::erase(p.clean, b);
    for (auto& [priority, list] : p.levels) std::erase(list, b);
  }
  static BlockId queue_pop(Pool& p) {
    std::vector<BlockId>* list = &p.clean;
    for (auto& [priority, l] : p.levels) {
      if (!list->empty()) break;
      list = &l;
    }
    const BlockId b = list->front();
    list->erase(list->begin());
    return b;
  }
  // Inserts b into priority `priority`'s list before the first block released after it.
  static void insert_by_stamp(Pool& p, BlockId b, int32_t priority) {
    std::vector<BlockId>& list = p.levels[priority];
    auto it = std::find_if(list.begin(), list.end(),
                           [&](BlockId x) { return p.blocks[x].stamp > p.blocks[b].stamp; });
    list.insert(it, b);
  }

  // Retentions that expired: their blocks move to the default priority by release order.
  void expire(Pool& p) {
    if (p.expiries.empty()) return;
    const int64_t t = now();
    std::vector<typename Pool::Expiry> keep;
    for (const auto& e : p.expiries) {
      if (e.time > t) {
        keep.push_back(e);
        continue;
      }
      Block& b = p.blocks[e.block];
      const auto level = p.levels.find(b.effective_priority());
      if (level == p.levels.end() || !queued_in(level->second, e.block) || b.stamp != e.stamp) {
        continue;  // taken or freed again since
      }
      std::erase(level->second, e.block);
      b.priority = Block::kNone;
      b.duration = 0;
      insert_by_stamp(p, e.block, kDefaultRetentionPriority);
    }
    p.expiries = std::move(keep);
  }

  // NOTE (contract): the first holder to set a retention gives it, later ones raise it.
  static void set_retention(Block& b, int32_t priority, int64_t duration) {
    if (priority == Block::kNone) return;  // an evicted block without one
    if (b.priority != Block::kNone) {
      if (priority < b.priority) return;
      const bool longer = duration == 0 || (b.duration != 0 && duration > b.duration);
      if (priority == b.priority && !longer) return;
    }
    b.priority = priority;
    b.duration = duration;
  }

  // --- index ---

  uint64_t content_of(BlockId parent) const {
    return parent == kNoBlock ? 0 : device_.blocks[parent].content;
  }

  // The block of `p` indexed under `hash` if it holds block i of `s` after `parent_content`.
  BlockId find_hit(const Pool& p, const BlockHash& hash, uint64_t parent_content, const Seq& s,
                   int32_t i) const {
    const auto it = p.index.find(key(hash));
    if (it == p.index.end()) return kNoBlock;
    const Block& b = p.blocks[it->second];
    if (b.parent_content != parent_content || b.extra_keys != s.extra_keys ||
        b.tokens != block_tokens(s, i)) {
      return kNoBlock;
    }
    return it->second;
  }

  // Takes block b out of the index or its hash's standbys; the newest standby replaces an
  // indexed block. Returns true when the hash left the index.
  static bool leave_index(Pool& p, BlockId b) {
    Block& d = p.blocks[b];
    const Key k = key(d.hash);
    std::vector<BlockId>& standby = p.standby[k];
    const Role role = d.role;
    d.role = Role::kNone;
    if (role == Role::kStandby) {
      std::erase(standby, b);
      return false;
    }
    if (standby.empty()) {
      p.index.erase(k);
      return true;
    }
    p.index[k] = standby.front();
    p.blocks[standby.front()].role = Role::kIndexed;
    standby.erase(standby.begin());
    return false;
  }

  // Takes n blocks from the head of p's queue; cached blocks taken this way are evicted.
  std::vector<BlockId> allocate(Pool& p, int32_t n) {
    if (n > 0) expire(p);
    std::vector<BlockId> out;
    for (int32_t i = 0; i < n; ++i) {
      const BlockId b = queue_pop(p);
      Block& d = p.blocks[b];
      if (d.cached()) {
        // One event per evicted block; none when a standby takes over the hash.
        if (leave_index(p, b)) {
          events_.push_back(BlockRemoved{{d.hash}, p.medium});
          if (&p == &device_ && opts_.enable_host_cache) {
            evicted_.push_back({b, d.hash, d.content, d.priority, d.duration});
          }
        }
        ++p.evictions;
      }
      d.content = p.next_content++;
      d.ref = 1;
      d.priority = Block::kNone;
      d.duration = 0;
      out.push_back(b);
    }
    return out;
  }

  std::vector<BlockId> allocate_device(int32_t n) {
    std::vector<BlockId> out = allocate(device_, n);
    demote_evicted();
    return out;
  }

  // Whether the host tier holds e's hash already; a free host copy of the same contents
  // then moves to the tier's most recently used end with e's retention, without a copy.
  bool refresh_host_copy(const Evicted& e) {
    const auto it = host_.index.find(key(e.hash));
    if (it == host_.index.end()) return false;
    const Block& src = device_.blocks[e.block];
    Block& copy = host_.blocks[it->second];
    if (copy.ref == 0 && copy.parent_content == src.parent_content && copy.tokens == src.tokens &&
        copy.extra_keys == src.extra_keys) {
      touch(host_, it->second);
      set_retention(copy, e.priority, e.duration);
      release_host_block(it->second);
    }
    return true;
  }

  // Enters host block h, about to receive the evicted device block e's K/V, into the tier.
  void cache_host_copy(BlockId h, const Evicted& e) {
    const Block& src = device_.blocks[e.block];
    Block& d = host_.blocks[h];
    d.content = e.content;
    d.role = Role::kIndexed;
    d.hash = e.hash;
    d.parent_content = src.parent_content;
    d.parent_hash = src.parent_hash;
    d.tokens = src.tokens;
    d.extra_keys = src.extra_keys;
    host_.index[key(e.hash)] = h;
    events_.push_back(BlockStored{
        {e.hash}, src.parent_hash, src.tokens, opts_.block_size, src.extra_keys, Medium::kHost});
    set_retention(d, e.priority, e.duration);
  }

  // Each evicted device block is copied into a host block unless the tier holds its hash
  // or no host block is free; the host block is held until the copy is taken. With fewer
  // free host blocks than evictions, the least recently used evictions are dropped.
  void demote_evicted() {
    const std::vector<Evicted> evicted = std::exchange(evicted_, {});
    const size_t free_host = queue_size(host_);
    const size_t dropped = evicted.size() > free_host ? evicted.size() - free_host : 0;
    for (size_t i = dropped; i < evicted.size(); ++i) {
      const Evicted& e = evicted[i];
      if (refresh_host_copy(e) || queue_size(host_) == 0) continue;
      const BlockId h = allocate(host_, 1)[0];
      cache_host_copy(h, e);
      pending_.demote.push_back({e.block, h, opts_.block_size});
      release_host_block(h);
      ++counters_.blocks_demoted;
    }
  }

  // The host hits that continue s's device hits, as many as free device blocks allow
  // (less the watermark while another sequence runs), copied into new device blocks that
  // take their content keys and enter the device index; the host copies leave the tier. A
  // new device block that held an evicted cached block trades places with its host block
  // (an exchange op) unless the tier holds that block's hash already.
  void promote(Seq& s, const std::vector<BlockHash>& hashes, int32_t max_blocks,
               uint64_t parent_content) {
    const auto first = static_cast<int32_t>(s.table.size());
    const bool others_run = std::any_of(seqs_.begin(), seqs_.end(), [](const auto& entry) {
      return entry.second.state == SequenceState::kRunning;
    });
    const int64_t room = std::max<int64_t>(
        0, static_cast<int64_t>(queue_size(device_)) - (others_run ? opts_.watermark_blocks : 0));
    std::vector<BlockId> hits;
    for (int32_t i = first; i < max_blocks && i - first < room; ++i) {
      const BlockId h = find_hit(host_, hashes[i], parent_content, s, i);
      if (h == kNoBlock) break;
      hits.push_back(h);
      parent_content = host_.blocks[h].content;
    }
    if (hits.empty()) return;
    for (const BlockId h : hits) touch(host_, h);
    const std::vector<BlockId> fresh = allocate(device_, static_cast<int32_t>(hits.size()));
    const std::vector<Evicted> evicted = std::exchange(evicted_, {});
    size_t next_evicted = 0;
    const int32_t bs = opts_.block_size;
    for (size_t j = 0; j < hits.size(); ++j) {
      const BlockId h = hits[j];
      const BlockId d = fresh[j];
      device_.blocks[d].content = host_.blocks[h].content;
      device_.blocks[d].write_step = step_;
      device_.blocks[d].copy_only = true;
      if (leave_index(host_, h)) {
        events_.push_back(BlockRemoved{{host_.blocks[h].hash}, Medium::kHost});
      }
      const Evicted* e = nullptr;
      if (next_evicted < evicted.size() && evicted[next_evicted].block == d) {
        e = &evicted[next_evicted++];
      }
      // A host block a pending demotion or exchange writes is promoted after that batch,
      // and the evicted block demoted into another host block.
      const bool written_this_step = host_pending(h);
      if (e != nullptr && !written_this_step && !refresh_host_copy(*e)) {
        cache_host_copy(h, *e);
        pending_.exchange.push_back({d, h, bs});
        ++counters_.blocks_demoted;
      } else {
        if (e != nullptr && written_this_step) evicted_.push_back(*e);
        pending_.promote.push_back({h, d, bs});
      }
      release_host_block(h);
    }
    demote_evicted();
    s.table.insert(s.table.end(), fresh.begin(), fresh.end());
    s.offered = first;
    s.computed = static_cast<int32_t>(s.table.size()) * bs;
    offer(s);
    counters_.blocks_promoted += static_cast<int64_t>(hits.size());
    counters_.host_hit_tokens += static_cast<int64_t>(hits.size()) * bs;
  }

  void touch(Pool& p, BlockId b) {
    Block& d = p.blocks[b];
    if (d.ref++ == 0) {
      queue_erase(p, b);
      d.priority = Block::kNone;
      d.duration = 0;
    }
  }

  // Drops one reference from each block; those reaching 0 join the queue in the given
  // order, hashed ones at the tail of their priority's list, the others at the head.
  void unref(Pool& p, const std::vector<BlockId>& blocks) {
    size_t clean = 0;
    for (const BlockId b : blocks) {
      Block& d = p.blocks[b];
      if (--d.ref != 0) continue;
      if (!d.cached()) {
        p.clean.insert(p.clean.begin() + static_cast<int64_t>(clean++), b);
        continue;
      }
      d.stamp = ++p.last_stamp;
      p.levels[d.effective_priority()].push_back(b);
      if (d.duration > 0 && d.priority != Block::kNone) {
        p.expiries.push_back({now() + d.duration, b, d.stamp});
      }
    }
  }

  // NOTE (contract): a block's retention is that of the last range holding its first token.
  void apply_retention(const Seq& s) {
    for (size_t i = 0; i < s.table.size(); ++i) {
      const int64_t first_token = static_cast<int64_t>(i) * opts_.block_size;
      for (auto r = s.retention.rbegin(); r != s.retention.rend(); ++r) {
        if (first_token >= r->begin && first_token < r->end) {
          set_retention(device_.blocks[s.table[i]], r->priority, r->duration_ms);
          break;
        }
      }
    }
  }

  bool scheduled(const Seq& s) const { return s.scheduled_step == step_; }

  // The first scheduling in a step fixes the settled tokens.
  void mark_scheduled(Seq& s, int32_t settled) {
    if (s.scheduled_step == step_) return;
    s.scheduled_step = step_;
    s.settled = settled;
  }

  // Blocks its K/V writes fill in this step and it holds alone may never be written:
  // unshare them. A swap-in or promotion fills its blocks whatever happens to it.
  void unshare_unwritten(Seq& s) {
    if (!scheduled(s)) return;
    const int32_t end = std::min<int32_t>(s.offered, static_cast<int32_t>(s.table.size()));
    for (int32_t i = s.settled / opts_.block_size; i < end; ++i) {
      const BlockId b = s.table[i];
      Block& d = device_.blocks[b];
      const bool copy_filled = d.write_step == step_ && d.copy_only;
      if (d.ref == 1 && d.cached() && !copy_filled && leave_index(device_, b)) {
        events_.push_back(BlockRemoved{{d.hash}, Medium::kDevice});
      }
    }
  }

  void drop_claim(Seq& s) {
    counters_.claims_released += !s.table.empty();
    unshare_unwritten(s);
    release_device(s);
    s.computed = 0;
    s.offered = 0;
    s.kv_before_reset = false;
    s.scheduled_step = 0;
  }

  // Before preempting: the claim of a waiting sequence (not the requester) holding a block
  // nobody else holds; lowest priority, then latest arrival.
  bool release_one_claim(SeqId requester) {
    Seq* chosen = nullptr;
    for (auto& [id, s] : seqs_) {
      if (id == requester || s.state != SequenceState::kWaiting) continue;
      if (std::none_of(s.table.begin(), s.table.end(),
                       [&](BlockId b) { return device_.blocks[b].ref == 1; })) {
        continue;
      }
      if (chosen == nullptr || s.priority < chosen->priority ||
          (s.priority == chosen->priority && s.arrival > chosen->arrival)) {
        chosen = &s;
      }
    }
    if (chosen == nullptr) return false;
    drop_claim(*chosen);
    claim_releases_.push_back(chosen->id);
    return true;
  }

  // Named by a pending op that reads or writes device memory after the release: a CoW copy
  // (either end), a swap-in or promotion destination, an exchange. Swap-out and demotion
  // sources are read first in a step, so they may be reused at once.
  bool device_pending(BlockId b) const {
    for (const BlockCopy& op : pending_.copy_on_write) {
      if (op.src == b || op.dst == b) return true;
    }
    for (const BlockCopy& op : pending_.exchange) {
      if (op.src == b) return true;
    }
    for (const auto* ops : {&pending_.swap_in, &pending_.promote}) {
      for (const BlockCopy& op : *ops) {
        if (op.dst == b) return true;
      }
    }
    return false;
  }
  bool host_pending(BlockId h) const {
    for (const auto* ops : {&pending_.swap_out, &pending_.demote, &pending_.exchange}) {
      for (const BlockCopy& op : *ops) {
        if (op.dst == h) return true;
      }
    }
    for (const auto* ops : {&pending_.swap_in, &pending_.promote}) {
      for (const BlockCopy& op : *ops) {
        if (op.src == h) return true;
      }
    }
    return false;
  }

  // Tail first, as one release; a last reference to a block a pending op still names is
  // parked.
  void release_device(Seq& s) {
    apply_retention(s);
    std::vector<BlockId> released;
    for (auto it = s.table.rbegin(); it != s.table.rend(); ++it) {
      if (device_pending(*it) && device_.blocks[*it].ref == 1) {
        deferred_device_.push_back(*it);
      } else {
        released.push_back(*it);
      }
    }
    unref(device_, released);
    s.table.clear();
  }

  void release_host_block(BlockId h) {
    if (host_pending(h)) {
      deferred_host_.push_back(h);
    } else {
      unref(host_, {h});
    }
  }

  void release_host(Seq& s) {
    std::vector<BlockId> released;
    for (auto it = s.host.rbegin(); it != s.host.rend(); ++it) {
      if (host_pending(*it)) {
        deferred_host_.push_back(*it);
      } else {
        released.push_back(*it);
      }
    }
    unref(host_, released);
    s.host.clear();
  }

  // Parked blocks whose copies were taken are released one at a time, in parking order.
  void release_deferred() {
    std::vector<BlockId> keep;
    for (const BlockId b : deferred_device_) {
      if (device_pending(b)) {
        keep.push_back(b);
      } else {
        unref(device_, {b});
      }
    }
    deferred_device_ = std::move(keep);
    keep.clear();
    for (const BlockId h : deferred_host_) {
      if (host_pending(h)) {
        keep.push_back(h);
      } else {
        unref(host_, {h});
      }
    }
    deferred_host_ = std::move(keep);
  }

  std::pair<Code, std::vector<int64_t>> allocate(Seq& s, int32_t n, int32_t lookahead) {
    const int32_t bs = opts_.block_size;
    if (n < 0 || lookahead < 0) return {Code::kInvalidArgument, {}};
    if (s.state == SequenceState::kSwapped) return {Code::kFailedPrecondition, {}};
    const int64_t new_total = int64_t{s.computed} + n;
    if (new_total > static_cast<int64_t>(s.tokens.size())) return {Code::kInvalidArgument, {}};
    const int64_t total_blocks = blocks_for(new_total + lookahead);
    if (total_blocks > opts_.num_blocks) return {Code::kInvalidArgument, {}};
    const int32_t partial = s.computed % bs;
    const int32_t write_block = s.computed / bs;
    const bool cow = n > 0 && partial != 0 && device_.blocks[s.table[write_block]].ref > 1;
    // A copy-on-write must not copy tokens whose K/V this step has not written yet.
    if (cow && scheduled(s) && s.settled < s.computed) return {Code::kFailedPrecondition, {}};
    const int64_t new_blocks =
        std::max<int64_t>(0, total_blocks - static_cast<int64_t>(s.table.size())) + (cow ? 1 : 0);
    // The watermark holds back an admission only while another sequence is running.
    const bool others_run = std::any_of(seqs_.begin(), seqs_.end(), [&](const auto& entry) {
      return entry.second.id != s.id && entry.second.state == SequenceState::kRunning;
    });
    const int32_t reserve =
        s.state == SequenceState::kWaiting && others_run ? opts_.watermark_blocks : 0;
    if (new_blocks + reserve > static_cast<int64_t>(queue_size(device_))) {
      return {Code::kResourceExhausted, {}};
    }
    std::vector<BlockId> fresh = allocate_device(static_cast<int32_t>(new_blocks));
    size_t next = 0;
    if (cow) {
      // NOTE (contract): the copy's destination is the first block allocated.
      const BlockId src = s.table[write_block];
      const BlockId dst = fresh[next++];
      pending_.copy_on_write.push_back({src, dst, partial});
      --device_.blocks[src].ref;  // other sharers still hold it
      s.table[write_block] = dst;
      ++counters_.cow_copies;
    }
    s.table.insert(s.table.end(), fresh.begin() + static_cast<int64_t>(next), fresh.end());
    std::vector<int64_t> slots;
    for (int64_t t = s.computed; t < new_total; ++t) {
      slots.push_back(int64_t{s.table[t / bs]} * bs + t % bs);
      device_.blocks[s.table[t / bs]].write_step = step_;
      device_.blocks[s.table[t / bs]].copy_only = false;
    }
    if (n > 0) mark_scheduled(s, s.computed);
    s.computed = static_cast<int32_t>(new_total);
    s.state = SequenceState::kRunning;
    offer(s);
    return {Code::kOk, std::move(slots)};
  }

  // Enters the sequence's newly full computed blocks into the index, each once: a block is
  // skipped if it is already hashed; when another block holds its hash it becomes that
  // block's newest standby if it has the same tokens, extra keys and parent contents, and
  // is skipped otherwise.
  void offer(Seq& s) {
    const int32_t full = s.computed / opts_.block_size;
    if (!opts_.enable_prefix_caching || s.kv_before_reset) {
      s.offered = full;
      return;
    }
    const std::vector<BlockHash> hashes =
        s.offered < full ? block_hashes(s, full) : std::vector<BlockHash>{};
    // One BlockStored per run of consecutive blocks indexed; a block not indexed (hashed
    // already, a collision, a standby) ends a run.
    BlockStored stored;
    auto end_run = [&] {
      if (!stored.block_hashes.empty()) events_.push_back(std::exchange(stored, {}));
    };
    for (int32_t i = s.offered; i < full; ++i) {
      const BlockId b = s.table[i];
      const BlockHash& h = hashes[i];
      Block& d = device_.blocks[b];
      if (d.cached()) {
        end_run();
        continue;
      }
      const uint64_t parent_content = content_of(i == 0 ? kNoBlock : s.table[i - 1]);
      const auto indexed = device_.index.find(key(h));
      if (indexed != device_.index.end()) {
        const Block& original = device_.blocks[indexed->second];
        if (original.parent_content != parent_content || original.tokens != block_tokens(s, i) ||
            original.extra_keys != s.extra_keys) {
          end_run();
          continue;  // a collision: not shareable
        }
        d.role = Role::kStandby;
        d.content = original.content;
        std::vector<BlockId>& standby = device_.standby[key(h)];
        standby.insert(standby.begin(), b);
      } else {
        d.role = Role::kIndexed;
        device_.index[key(h)] = b;
      }
      d.hash = h;
      d.parent_content = parent_content;
      d.parent_hash = i > 0 ? std::optional(hashes[i - 1]) : std::nullopt;
      d.tokens = block_tokens(s, i);
      d.extra_keys = s.extra_keys;
      if (d.role == Role::kStandby) {  // its hash was announced already
        end_run();
        continue;
      }
      if (stored.block_hashes.empty() && i > 0) stored.parent_hash = hashes[i - 1];
      stored.block_hashes.push_back(h);
      stored.token_ids.insert(stored.token_ids.end(), d.tokens.begin(), d.tokens.end());
      stored.block_size = opts_.block_size;
      stored.extra_keys = s.extra_keys;
    }
    end_run();
    s.offered = std::max(s.offered, full);
  }

  KvCacheManager::Options opts_;
  std::map<SeqId, Seq> seqs_;
  int64_t next_arrival_ = 0;
  uint64_t step_ = 1;  // each take_step_ops() ends a step
  Pool device_;
  Pool host_;
  std::vector<Evicted> evicted_;  // by the device allocation in progress
  StepOps pending_;
  std::vector<BlockId> deferred_device_;
  std::vector<BlockId> deferred_host_;
  Counters counters_;
  std::vector<KvEvent> events_;
  std::vector<Preemption> preemptions_;
  std::vector<SeqId> claim_releases_;
};

}  // namespace pagedkv::testing

#endif  // PAGEDKV_TESTS_SUPPORT_REFERENCE_MODEL_H_
