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
//     because a pending copy still names them);
//   - both free queues, head (allocated next) to tail, as plain vectors: a release puts
//     hashed blocks at the tail and the others at the head, each group in the given order;
//   - the prefix index: BlockHash -> block, where a hit must also match the stored tokens,
//     extra keys and parent contents (a block's `content` key changes whenever it is
//     allocated, that is whenever its contents may change), plus per hash the standby
//     duplicates that take the indexed block's place when it leaves (newest first);
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
  };

  enum class Role { kNone, kIndexed, kStandby };

  struct DeviceBlock {
    int32_t ref = 0;
    Role role = Role::kNone;  // holds a hash: indexed, or standby of the indexed block
    uint64_t content = 0;     // new on every allocation; a standby shares its original's
    uint64_t write_step = 0;  // the step whose writes or swap-in fill it
    // Valid while cached: what a hit must match.
    BlockHash hash;
    uint64_t parent_content = 0;  // 0: first block
    std::vector<TokenId> tokens;
    std::vector<uint64_t> extra_keys;
    bool cached() const { return role != Role::kNone; }
  };

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
  };

  // Mirrors KvCacheManager::create(): InvalidArgument for any bad option.
  static Code validate(const KvCacheManager::Options& o) {
    if (o.num_blocks <= 0 || o.block_size <= 0 || o.num_host_blocks < 0 || o.max_model_len <= 0 ||
        o.watermark_blocks < 0 || o.watermark_blocks >= o.num_blocks || o.hash_fn == nullptr) {
      return Code::kInvalidArgument;
    }
    return Code::kOk;
  }

  explicit ReferenceModel(const KvCacheManager::Options& o)
      : opts_(o), device_(o.num_blocks), host_ref_(o.num_host_blocks, 0) {
    for (BlockId b = 0; b < o.num_blocks; ++b) device_queue_.push_back(b);
    for (BlockId b = 0; b < o.num_host_blocks; ++b) host_queue_.push_back(b);
  }

  // --- calls -----------------------------------------------------------------------------

  Code add_sequence(SeqId id, std::span<const TokenId> prompt, int32_t priority,
                    std::span<const uint64_t> extra_keys) {
    if (seqs_.count(id)) return Code::kAlreadyExists;
    if (prompt.empty()) return Code::kInvalidArgument;
    if (static_cast<int64_t>(prompt.size()) > opts_.max_model_len) return Code::kInvalidArgument;
    if (blocks_for(static_cast<int64_t>(prompt.size())) > opts_.num_blocks) {
      return Code::kInvalidArgument;
    }
    Seq s;
    s.id = id;
    s.priority = priority;
    s.arrival = next_arrival_++;
    s.tokens.assign(prompt.begin(), prompt.end());
    s.extra_keys.assign(extra_keys.begin(), extra_keys.end());
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
    BlockId parent = kNoBlock;
    for (int32_t i = 0; i < max_blocks; ++i) {
      const auto it = index_.find(key(hashes[i]));
      if (it == index_.end()) break;
      const BlockId c = it->second;
      const DeviceBlock& d = device_[c];
      if (d.parent_content != content_of(parent) || d.extra_keys != s->extra_keys ||
          d.tokens != block_tokens(*s, i)) {
        break;
      }
      hits.push_back(c);
      parent = c;
    }
    for (const BlockId b : hits) touch(b);
    s->table = hits;
    s->computed = static_cast<int32_t>(hits.size()) * bs;
    s->offered = static_cast<int32_t>(hits.size());
    // Hitting a block that this step still fills makes the sequence scheduled from there.
    for (size_t i = 0; i < hits.size(); ++i) {
      if (device_[hits[i]].write_step == step_) {
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
            blocks_for(victim->num_computed_tokens) > static_cast<int64_t>(host_queue_.size())) {
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
      if (needed > static_cast<int32_t>(host_queue_.size())) return Code::kResourceExhausted;
      s->host = take_from_queue(host_queue_, needed);
      for (const BlockId h : s->host) host_ref_[h] = 1;
      for (int32_t i = 0; i < needed; ++i) {
        pending_swaps_.swap_out.push_back(
            {s->table[i], s->host[i], std::min(bs, s->computed - i * bs)});
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
    if (needed > static_cast<int32_t>(device_queue_.size())) return Code::kResourceExhausted;
    s->table = allocate_device(needed);
    const int32_t bs = opts_.block_size;
    for (int32_t i = 0; i < needed; ++i) {
      pending_swaps_.swap_in.push_back(
          {s->host[i], s->table[i], std::min(bs, s->computed - i * bs)});
      device_[s->table[i]].write_step = step_;
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
    for (const BlockId b : c.table) touch(b);
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

  std::vector<BlockCopy> take_pending_copies() {
    std::vector<BlockCopy> out = std::exchange(pending_copies_, {});
    release_deferred();
    ++step_;  // taking the ops ends the step's scheduling
    return out;
  }

  SwapOps take_pending_swaps() {
    SwapOps out = std::exchange(pending_swaps_, {});
    release_deferred();
    ++step_;
    return out;
  }

  void reset_prefix_cache() {
    for (DeviceBlock& d : device_) d.role = Role::kNone;
    index_.clear();
    standby_.clear();
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
  const std::vector<DeviceBlock>& device_blocks() const { return device_; }
  const std::vector<int32_t>& host_refs() const { return host_ref_; }
  const std::vector<BlockId>& device_queue() const { return device_queue_; }
  const std::vector<BlockId>& host_queue() const { return host_queue_; }
  const Counters& counters() const { return counters_; }
  const std::vector<BlockCopy>& pending_copies() const { return pending_copies_; }
  const SwapOps& pending_swaps() const { return pending_swaps_; }
  const KvCacheManager::Options& options() const { return opts_; }
  int32_t used_host_blocks() const {
    return static_cast<int32_t>(
        std::count_if(host_ref_.begin(), host_ref_.end(), [](int32_t r) { return r > 0; }));
  }
  int32_t cached_free_blocks() const {
    return static_cast<int32_t>(std::count_if(
        device_.begin(), device_.end(), [](const auto& d) { return d.cached() && d.ref == 0; }));
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

  int64_t blocks_for(int64_t tokens) const {
    return (tokens + opts_.block_size - 1) / opts_.block_size;
  }

  std::vector<TokenId> block_tokens(const Seq& s, int32_t i) const {
    const auto begin = s.tokens.begin() + static_cast<int64_t>(i) * opts_.block_size;
    return std::vector<TokenId>(begin, begin + opts_.block_size);
  }

  static std::vector<BlockId> take_from_queue(std::vector<BlockId>& queue, int32_t n) {
    std::vector<BlockId> out(queue.begin(), queue.begin() + n);
    queue.erase(queue.begin(), queue.begin() + n);
    return out;
  }

  bool scheduled(const Seq& s) const { return s.scheduled_step == step_; }

  // The first scheduling in a step fixes the settled tokens.
  void mark_scheduled(Seq& s, int32_t settled) {
    if (s.scheduled_step == step_) return;
    s.scheduled_step = step_;
    s.settled = settled;
  }

  uint64_t content_of(BlockId parent) const {
    return parent == kNoBlock ? 0 : device_[parent].content;
  }

  // Takes block b out of the index or its hash's standbys; the newest standby replaces an
  // indexed block. Returns true when the hash left the index.
  bool leave_index(BlockId b) {
    DeviceBlock& d = device_[b];
    const Key k = key(d.hash);
    std::vector<BlockId>& standby = standby_[k];
    const Role role = d.role;
    d.role = Role::kNone;
    if (role == Role::kStandby) {
      std::erase(standby, b);
      return false;
    }
    if (standby.empty()) {
      index_.erase(k);
      return true;
    }
    index_[k] = standby.front();
    device_[standby.front()].role = Role::kIndexed;
    standby.erase(standby.begin());
    return false;
  }

  // Head of the queue first; cached blocks taken this way are evicted.
  std::vector<BlockId> allocate_device(int32_t n) {
    std::vector<BlockId> out = take_from_queue(device_queue_, n);
    for (const BlockId b : out) {
      DeviceBlock& d = device_[b];
      if (d.cached()) {
        // One event per evicted block; none when a standby takes over the hash.
        if (leave_index(b)) events_.push_back(BlockRemoved{{d.hash}});
        ++counters_.evictions;
      }
      d.content = next_content_++;
      d.ref = 1;
    }
    return out;
  }

  void touch(BlockId b) {
    if (device_[b].ref++ == 0) std::erase(device_queue_, b);
  }

  // Drops one reference from each block; those reaching 0 join the queue in the given
  // order, hashed ones at the tail and the others at the head.
  void unref_device(const std::vector<BlockId>& blocks) {
    size_t clean = 0;
    for (const BlockId b : blocks) {
      if (--device_[b].ref != 0) continue;
      if (device_[b].cached()) {
        device_queue_.push_back(b);
      } else {
        device_queue_.insert(device_queue_.begin() + static_cast<int64_t>(clean++), b);
      }
    }
  }

  // Host blocks are never hashed: released ones go to the head, in the given order.
  void release_host_blocks(const std::vector<BlockId>& blocks) {
    for (size_t i = 0; i < blocks.size(); ++i) {
      host_ref_[blocks[i]] = 0;
      host_queue_.insert(host_queue_.begin() + static_cast<int64_t>(i), blocks[i]);
    }
  }

  // Blocks it filled in this step and holds alone may never be written: unshare them.
  void unshare_unwritten(Seq& s) {
    if (!scheduled(s)) return;
    const int32_t end = std::min<int32_t>(s.offered, static_cast<int32_t>(s.table.size()));
    for (int32_t i = s.settled / opts_.block_size; i < end; ++i) {
      const BlockId b = s.table[i];
      DeviceBlock& d = device_[b];
      if (d.ref == 1 && d.cached() && leave_index(b)) events_.push_back(BlockRemoved{{d.hash}});
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
                       [&](BlockId b) { return device_[b].ref == 1; })) {
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
  // (either end) or a swap-in destination. Swap-out sources are read first in a step, so
  // they may be reused at once.
  bool device_pending(BlockId b) const {
    for (const BlockCopy& op : pending_copies_) {
      if (op.src == b || op.dst == b) return true;
    }
    for (const BlockCopy& op : pending_swaps_.swap_in) {
      if (op.dst == b) return true;
    }
    return false;
  }
  bool host_pending(BlockId h) const {
    for (const BlockCopy& op : pending_swaps_.swap_out) {
      if (op.dst == h) return true;
    }
    for (const BlockCopy& op : pending_swaps_.swap_in) {
      if (op.src == h) return true;
    }
    return false;
  }

  // Tail first, as one release; a last reference to a block a pending op still names is
  // parked.
  void release_device(Seq& s) {
    std::vector<BlockId> released;
    for (auto it = s.table.rbegin(); it != s.table.rend(); ++it) {
      if (device_pending(*it) && device_[*it].ref == 1) {
        deferred_device_.push_back(*it);
      } else {
        released.push_back(*it);
      }
    }
    unref_device(released);
    s.table.clear();
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
    release_host_blocks(released);
    s.host.clear();
  }

  // Parked blocks whose copies were taken are released one at a time, in parking order.
  void release_deferred() {
    std::vector<BlockId> keep;
    for (const BlockId b : deferred_device_) {
      if (device_pending(b)) {
        keep.push_back(b);
      } else {
        unref_device({b});
      }
    }
    deferred_device_ = std::move(keep);
    keep.clear();
    for (const BlockId h : deferred_host_) {
      if (host_pending(h)) {
        keep.push_back(h);
      } else {
        release_host_blocks({h});
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
    const bool cow = n > 0 && partial != 0 && device_[s.table[write_block]].ref > 1;
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
    if (new_blocks + reserve > static_cast<int64_t>(device_queue_.size())) {
      return {Code::kResourceExhausted, {}};
    }
    std::vector<BlockId> fresh = allocate_device(static_cast<int32_t>(new_blocks));
    size_t next = 0;
    if (cow) {
      // NOTE (contract): the copy's destination is the first block allocated.
      const BlockId src = s.table[write_block];
      const BlockId dst = fresh[next++];
      pending_copies_.push_back({src, dst, partial});
      --device_[src].ref;  // other sharers still hold it
      s.table[write_block] = dst;
      ++counters_.cow_copies;
    }
    s.table.insert(s.table.end(), fresh.begin() + static_cast<int64_t>(next), fresh.end());
    std::vector<int64_t> slots;
    for (int64_t t = s.computed; t < new_total; ++t) {
      slots.push_back(int64_t{s.table[t / bs]} * bs + t % bs);
      device_[s.table[t / bs]].write_step = step_;
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
      DeviceBlock& d = device_[b];
      if (d.cached()) {
        end_run();
        continue;
      }
      const uint64_t parent_content = content_of(i == 0 ? kNoBlock : s.table[i - 1]);
      const auto indexed = index_.find(key(h));
      if (indexed != index_.end()) {
        const DeviceBlock& original = device_[indexed->second];
        if (original.parent_content != parent_content || original.tokens != block_tokens(s, i) ||
            original.extra_keys != s.extra_keys) {
          end_run();
          continue;  // a collision: not shareable
        }
        d.role = Role::kStandby;
        d.content = original.content;
        std::vector<BlockId>& standby = standby_[key(h)];
        standby.insert(standby.begin(), b);
      } else {
        d.role = Role::kIndexed;
        index_[key(h)] = b;
      }
      d.hash = h;
      d.parent_content = parent_content;
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
  uint64_t step_ = 1;  // each take_pending_*() ends a step
  std::vector<DeviceBlock> device_;
  std::vector<BlockId> device_queue_;  // head first
  std::vector<int32_t> host_ref_;
  std::vector<BlockId> host_queue_;
  std::map<Key, BlockId> index_;
  std::map<Key, std::vector<BlockId>> standby_;  // per hash, newest first
  uint64_t next_content_ = 1;
  std::vector<BlockCopy> pending_copies_;
  SwapOps pending_swaps_;
  std::vector<BlockId> deferred_device_;
  std::vector<BlockId> deferred_host_;
  Counters counters_;
  std::vector<KvEvent> events_;
  std::vector<Preemption> preemptions_;
  std::vector<SeqId> claim_releases_;
};

}  // namespace pagedkv::testing

#endif  // PAGEDKV_TESTS_SUPPORT_REFERENCE_MODEL_H_
