// File: tests/support/reference_model.h
//
// ReferenceModel: a deliberately plain, obviously-correct model of KvCacheManager's
// observable behaviour, written from the header contracts (kv_cache_manager.h,
// block_pool.h, layer_group.h) and docs/allocator.md for the property tests and fuzzers.
// It shares no code with src/: no intrusive lists, no counters kept in sync, no lazily
// cached hashes, no scratch reused across calls. Every derived fact (free count, which
// blocks a pending copy names, ref counts, the longest hit) is recomputed by scanning.
//
// What it models, per call: the status code, the returned value (hit length, slot mapping
// of every layer group, copies), and the state afterwards:
//   - the layer groups (layer_group.h): Options::layer_groups, each with a device pool and a
//     host pool of its own, its own host tier and counters;
//   - each sequence: state, priority, arrival, tokens, computed count, one table per group
//     (device blocks, with kNoBlock before first_held in a windowed group: entries released
//     behind the window), host blocks while swapped, how many of its full blocks were
//     offered to the prefix index;
//   - each device and host block of every group: its ref count (tables holding it, plus
//     blocks parked because a pending copy still names them), retention priority and
//     duration;
//   - every free queue, head (allocated next) to tail, as plain vectors: a clean list and
//     one list per retention priority; a release puts hashed blocks at the tail of their
//     priority's list and the others at the head of the clean list, each group in the
//     given order; allocation takes the clean list, then the lowest priority's list; an
//     expired retention moves a block to the default priority's list by release order;
//   - the prefix index of each pool (a host pool's is its group's host tier): BlockHash ->
//     block, where a hit must also match the stored tokens, extra keys and parent
//     contents (a block's `content` key changes whenever it is allocated, that is whenever
//     its contents may change, and travels with a demoted or promoted copy), plus per hash
//     the standby duplicates, newest first (the oldest takes the indexed block's place when
//     it leaves). A full group's block is cached after its own table's previous block; a
//     windowed group's after the *anchor's* (the first full group's) previous block, since
//     its own may be released;
//   - the host tier, per group: a device block that eviction drops from the index is copied
//     to a host block (a demote op), match_prefix continues into host hits and promotes
//     them; with HostAdmission::kReused only a block hit, promoted or computed while its
//     hash was a ghost is (a reused flag per device block), and the hashes that leave both
//     tiers are ghosts (a plain vector, oldest first, of at most device + host blocks);
//   - prefix hits across groups: the longest p (blocks) such that every full group's chain
//     (device hits, then host hits as far as free device blocks allow) reaches p and every
//     windowed group holds, on the device or in its host tier, every entry the token at
//     p * block_size attends to, with its promotions fitting its free device blocks;
//   - partial-block reuse (Options::enable_partial_block_reuse): the hit continues into the
//     first tokens of a cached block that every group holds after its previous entry,
//     copied (copy-on-write) into a new block of each group;
//   - windowed eviction (prefix caching on): a windowed entry released behind the window or
//     with its sequence takes its sequence's retention range, else a class below the
//     default by the hit points whose windows need it (window_priority()); windowed blocks
//     cached after anchor contents gone from both anchor pools leave the index at the end
//     of the calls that check for them (bury_dead_windows()); a windowed block replaces a
//     copy of its tokens cached after other parent contents; offers cache the full groups
//     first;
//   - counters (Stats, GroupStats), KV events and preemption hooks.
// Contract choices the header leaves open are marked "NOTE (contract)"; the model follows
// the implementation there so that a disagreement means a bug, not a taste difference.
// Where the manager has a known bug, the model does what the documentation says unless the
// matching kEmulate... switch below is on (then it reproduces the manager's current
// behaviour, so that the property tests keep checking everything else); each switch names
// its failing test in tests/layer_groups_regression_test.cc.
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
#include "pagedkv/layer_group.h"
#include "pagedkv/retention.h"
#include "pagedkv/types.h"

namespace pagedkv::testing {

// Known manager bugs the model reproduces while they are open (turn a switch off with the
// fix). Test names are those of tests/layer_groups_regression_test.cc.
//
// "a windowed group's block offered in the same call as the anchor's parent block verifies
// after the parent's final contents": offer_computed_blocks() caches the groups in group
// order, so a windowed group listed before the anchor records the content key the anchor's
// previous block had before it became a standby in the same call; the block is then never
// a standby and can never hit.
inline constexpr bool kEmulateWindowedOfferBeforeAnchor = false;
// "blocks released behind the window keep the sequence's retention": release_behind_window()
// releases them at the default priority; docs/allocator.md says retention ranges apply to
// each group's blocks when the sequence releases them.
inline constexpr bool kEmulateNoRetentionBehindWindow = false;

// "free of a swapped sequence with released window entries releases its host blocks":
// free() -> release_device_blocks() takes subspan(first_held) of the swapped sequence's
// empty device table (first_held is kept for swap_in()), so it walks memory past the table
// and drops references to garbage ids. The driver skips such free calls while this is on.
inline constexpr bool kAvoidFreeOfSwappedWithReleasedEntries = false;

class ReferenceModel {
 public:
  using Code = absl::StatusCode;

  // One layer group's part of a sequence. Entry i holds tokens [i * bs, (i + 1) * bs).
  struct Table {
    std::vector<BlockId> blocks;  // device blocks; kNoBlock before first_held
    std::vector<BlockId> host;    // swapped: host copies of entries first_held..
    int32_t first_held = 0;
  };

  struct Seq {
    SeqId id = 0;
    SequenceState state = SequenceState::kWaiting;
    int32_t priority = 0;
    int64_t arrival = 0;
    std::vector<TokenId> tokens;
    std::vector<uint64_t> extra_keys;
    int32_t computed = 0;
    // Speculative decoding: the last `drafts` computed tokens wait for accept_draft();
    // nothing past computed - drafts is offered.
    int32_t drafts = 0;
    std::vector<Table> tables;  // one per layer group
    int32_t offered = 0;        // leading full blocks already offered to the index
    // Scheduled: got slots (allocate_slots with new tokens) or was swapped in during the
    // current step; `settled` tokens were computed before that. Forks inherit both.
    uint64_t scheduled_step = 0;
    int32_t settled = 0;
    bool kv_before_reset = false;  // held K/V at a reset_prefix_cache(): offers nothing
    std::vector<RetentionRange> retention;
    // Where its last match_prefix()'s full-group chains ended and where its hit ended, in
    // blocks: the branch points whose windows a windowed group keeps in its top class.
    int32_t match_chain_end = 0;
    int32_t match_hit = 0;

    const std::vector<BlockId>& table(int32_t group = 0) const { return tables[group].blocks; }
    const std::vector<BlockId>& host(int32_t group = 0) const { return tables[group].host; }
  };

  enum class Role { kNone, kIndexed, kStandby };

  struct Block {
    int32_t ref = 0;
    Role role = Role::kNone;  // holds a hash: indexed, or standby of the indexed block
    uint64_t content = 0;     // new on every allocation; a standby or copy shares its original's
    uint64_t write_step = 0;  // device: the step whose writes, swap-in or promotion fill it
    bool copy_only = false;   // ... and whether a swap-in or promotion alone fills it
    bool reused = false;      // device, HostAdmission::kReused: evidence of reuse
    // Valid while cached (and, for the copy eviction makes, after): what a hit must match.
    BlockHash hash;
    uint64_t parent_content = 0;  // 0: first block
    std::optional<BlockHash> parent_hash;
    std::vector<TokenId> tokens;
    std::vector<uint64_t> extra_keys;
    int32_t priority = kNone;  // set since it left the free queue; kNone: the default applies
    int64_t duration = 0;
    uint64_t stamp = 0;       // when it last joined a priority's list
    uint64_t indexed_at = 0;  // when it last became the indexed block of its hash
    uint64_t cached_at = 0;   // when it last entered the index (indexed or standby)
    // EvictionPolicy::kAdaptive: used again since it was cached (ARC's T2); the block it
    // was cached after and that block's epoch then (the link holds while the epoch stays);
    // its own epoch, which grows whenever it leaves the cache.
    bool frequent = false;
    BlockId parent = kNoBlock;
    uint64_t parent_epoch = 0;
    uint64_t epoch = 0;
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
    int64_t partial_hit_tokens = 0;
    int64_t cow_copies = 0;
    int64_t preemptions_recompute = 0;
    int64_t preemptions_swap = 0;
    int64_t blocks_swapped_out = 0;
    int64_t blocks_swapped_in = 0;
    int64_t claims_released = 0;
    int64_t host_hit_tokens = 0;
    int64_t blocks_demoted = 0;       // all groups
    int64_t blocks_promoted = 0;      // all groups
    int64_t blocks_not_admitted = 0;  // all groups
    int64_t ghost_hits = 0;           // all groups
    int64_t draft_tokens = 0;
    int64_t accepted_draft_tokens = 0;
  };

  struct GroupCounters {
    int64_t hit_blocks = 0;
    int64_t released_blocks = 0;
    int64_t blocks_demoted = 0;
    int64_t blocks_promoted = 0;
    int64_t blocks_not_admitted = 0;
    int64_t ghost_hits = 0;
  };

  // Mirrors KvCacheManager::create(): InvalidArgument for any bad option.
  static Code validate(const KvCacheManager::Options& o) {
    if (o.layer_groups.empty() || o.block_size <= 0 || o.max_model_len <= 0 ||
        o.hash_fn == nullptr) {
      return Code::kInvalidArgument;
    }
    if (o.enable_host_cache && !o.enable_prefix_caching) return Code::kInvalidArgument;
    if (o.host_admission != HostAdmission::kAll && o.host_admission != HostAdmission::kReused) {
      return Code::kInvalidArgument;
    }
    if (o.eviction_policy != EvictionPolicy::kLru &&
        o.eviction_policy != EvictionPolicy::kAdaptive) {
      return Code::kInvalidArgument;
    }
    // NOTE (contract): at most 16 checkpoint levels.
    if (o.window_checkpoint_tokens < 0 || o.window_checkpoint_levels < 0 ||
        o.window_checkpoint_levels > 16) {
      return Code::kInvalidArgument;
    }
    bool has_full = false;
    for (const LayerGroup& g : o.layer_groups) {
      if (g.num_blocks <= 0 || g.num_host_blocks < 0) return Code::kInvalidArgument;
      if (o.enable_host_cache && g.num_host_blocks == 0) return Code::kInvalidArgument;
      const bool windowed = g.kind != AttentionKind::kFull;
      if (windowed ? g.window <= 0 : g.window != 0) return Code::kInvalidArgument;
      has_full |= !windowed;
    }
    if (!has_full && o.enable_prefix_caching) return Code::kInvalidArgument;
    const int32_t first_blocks = o.layer_groups[0].num_blocks;
    if (o.watermark_blocks < 0 || o.watermark_blocks >= first_blocks) {
      return Code::kInvalidArgument;
    }
    return Code::kOk;
  }

  // NOTE (contract): host content keys start at 2^63, apart from the device's (from 1).
  explicit ReferenceModel(const KvCacheManager::Options& o) : opts_(o) {
    const std::vector<LayerGroup> specs = o.layer_groups;
    const int64_t first_blocks = specs[0].num_blocks;
    for (const LayerGroup& spec : specs) {
      // The watermark scaled to the group's pool, rounded up, leaving one block.
      const int64_t scaled =
          (int64_t{o.watermark_blocks} * spec.num_blocks + first_blocks - 1) / first_blocks;
      groups_.push_back(Group{spec,
                              static_cast<int32_t>(std::min<int64_t>(scaled, spec.num_blocks - 1)),
                              Pool(Medium::kDevice, spec.num_blocks, 1),
                              Pool(Medium::kHost, spec.num_host_blocks, uint64_t{1} << 63)});
    }
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (!groups_[g].windowed()) {
        anchor_ = static_cast<int32_t>(g);
        break;
      }
    }
    for (Group& g : groups_) {
      g.device.adaptive = !g.windowed() && o.eviction_policy == EvictionPolicy::kAdaptive;
    }
    // With windowed groups that cache, the anchor's pools report the contents they lose
    // (bury_dead_windows()).
    const bool windowed =
        std::any_of(groups_.begin(), groups_.end(), [](const Group& g) { return g.windowed(); });
    if (anchor_ >= 0 && windowed && o.enable_prefix_caching) {
      groups_[anchor_].device.logs_dead = groups_[anchor_].host.logs_dead = true;
    }
    last_slots_.resize(groups_.size());
  }

  // --- calls -----------------------------------------------------------------------------

  Code add_sequence(SeqId id, std::span<const TokenId> prompt, int32_t priority,
                    std::span<const uint64_t> extra_keys,
                    std::span<const RetentionRange> retention = {}) {
    if (seqs_.count(id)) return Code::kAlreadyExists;
    if (prompt.empty()) return Code::kInvalidArgument;
    if (static_cast<int64_t>(prompt.size()) > opts_.max_model_len) return Code::kInvalidArgument;
    // NOTE (contract): a windowed group must hold at least the blocks one token's window
    // spans (ceil((window - 1) / bs) + 1), or the prompt's blocks if fewer.
    const int64_t prompt_blocks = blocks_for(static_cast<int64_t>(prompt.size()));
    for (const Group& g : groups_) {
      const int64_t needed =
          g.windowed() ? std::min(prompt_blocks, blocks_for(g.spec.window - 1) + 1) : prompt_blocks;
      if (needed > g.spec.num_blocks) return Code::kInvalidArgument;
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
    s.tables.resize(groups_.size());
    seqs_.emplace(id, std::move(s));
    return Code::kOk;
  }

  Code append_tokens(SeqId id, std::span<const TokenId> tokens) {
    Seq* s = find(id);
    if (s == nullptr) return Code::kNotFound;
    if (s->drafts > 0) return Code::kFailedPrecondition;
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
    if (s->state != SequenceState::kWaiting || !s->tables[0].blocks.empty()) {
      return {Code::kFailedPrecondition, 0};
    }
    const auto len = static_cast<int64_t>(s->tokens.size());
    counters_.prefix_query_tokens += len;
    if (!opts_.enable_prefix_caching) return {Code::kOk, 0};
    const int32_t bs = opts_.block_size;
    const auto max_blocks = static_cast<int32_t>((len - 1) / bs);  // never the last token
    const std::vector<BlockHash> hashes = block_hashes(*s, max_blocks);

    // Every full group's chain bounds the hit.
    std::vector<Chain> chains(groups_.size());
    int32_t p = max_blocks;
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (groups_[g].windowed()) continue;
      chains[g] = walk_chain(groups_[g], *s, hashes, max_blocks);
      p = std::min(p, static_cast<int32_t>(chains[g].keys.size()));
    }
    // Windowed groups verify along the anchor's chain; the hit is the longest p <= the
    // chains that every windowed group serves.
    std::vector<std::vector<Entry>> entries(groups_.size());
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (!groups_[g].windowed()) continue;
      for (int32_t i = 0; i < p; ++i) {
        entries[g].push_back(window_entry(groups_[g], *s, hashes, i, chains[anchor_].keys));
      }
    }
    s->match_chain_end = p;
    int32_t hit = p;
    while (hit > 0 && !std::all_of(groups_.begin(), groups_.end(), [&](const Group& g) {
             return !g.windowed() || window_serves(g, entries[&g - groups_.data()], hit);
           })) {
      --hit;
    }

    // Claim it: every group's device hits first, then the promotions.
    for (size_t g = 0; g < groups_.size(); ++g) {
      Group& group = groups_[g];
      Table& t = s->tables[g];
      t.blocks.assign(hit, kNoBlock);
      t.first_held = group.windowed() ? group.first_needed(int64_t{hit} * bs, bs) : 0;
      for (int32_t i = t.first_held; i < hit; ++i) {
        const BlockId d = group.windowed() ? entries[g][i].device : chains[g].device_hit(i);
        if (d == kNoBlock) continue;
        t.blocks[i] = d;
        touch(group.device, d);
        group.device.blocks[d].reused = true;
      }
      group.counters.hit_blocks += hit - t.first_held;
    }
    if (opts_.enable_host_cache) {
      for (size_t g = 0; g < groups_.size(); ++g) {
        std::vector<std::pair<int32_t, BlockId>> promote_at;  // entry, host hit
        const Table& t = s->tables[g];
        for (int32_t i = t.first_held; i < hit; ++i) {
          if (t.blocks[i] != kNoBlock) continue;
          promote_at.push_back(
              {i, groups_[g].windowed() ? entries[g][i].host : chains[g].host_hit(i)});
        }
        promote(static_cast<int32_t>(g), *s, hashes, promote_at,
                anchor_ >= 0 ? chains[anchor_].keys : std::vector<uint64_t>{});
      }
    }
    const int32_t partial = opts_.enable_partial_block_reuse ? reuse_partial_block(*s, hit) : 0;
    s->computed = hit * bs + partial;
    s->offered = hit;
    // Hitting a block that this step still fills makes the sequence scheduled from there;
    // so does a partial block, filled by this step's copy.
    int32_t first_unwritten = partial > 0 ? hit : hit + 1;
    for (size_t g = 0; g < groups_.size(); ++g) {
      const Table& t = s->tables[g];
      for (int32_t i = t.first_held; i < std::min(hit, first_unwritten); ++i) {
        if (groups_[g].device.blocks[t.blocks[i]].write_step == step_) {
          first_unwritten = i;
          break;
        }
      }
    }
    if (first_unwritten <= hit) mark_scheduled(*s, first_unwritten * bs);
    counters_.prefix_hit_tokens += s->computed;
    counters_.partial_hit_tokens += partial;
    s->match_hit = hit;
    bury_dead_windows();
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
        if (vid == id || v.state != SequenceState::kRunning || scheduled(v) || v.drafts > 0) {
          continue;
        }
        running.push_back(info(v));
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
        if (v == nullptr || v->state != SequenceState::kRunning || scheduled(*v) || v->drafts > 0) {
          return result;
        }
        victim_id = choice->victim;
        mode = choice->mode;
      } else {
        // Default policy: lowest priority, then latest arrival; swap only if every group's
        // host pool fits it.
        const SequenceInfo* victim = &running.front();
        for (const SequenceInfo& v : running) {
          if (v.priority < victim->priority ||
              (v.priority == victim->priority && v.arrival > victim->arrival)) {
            victim = &v;
          }
        }
        if (mode == PreemptionMode::kSwap && !host_fits(*find(victim->id))) {
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
    if (s->state != SequenceState::kRunning || s->drafts > 0) return Code::kFailedPrecondition;
    // Its new K/V is not written before the step: neither a swap-out nor a later prefix hit
    // could read it.
    if (scheduled(*s)) return Code::kFailedPrecondition;
    const int32_t bs = opts_.block_size;
    if (mode == PreemptionMode::kSwap) {
      if (!host_fits(*s)) return Code::kResourceExhausted;
      const auto context = static_cast<int32_t>(blocks_for(s->computed));
      for (size_t g = 0; g < groups_.size(); ++g) {
        Table& t = s->tables[g];
        t.host = allocate(static_cast<int32_t>(g), Medium::kHost, context - t.first_held);
        for (int32_t i = t.first_held; i < context; ++i) {
          pending_.swap_out.push_back({t.blocks[i], t.host[i - t.first_held],
                                       std::min(bs, s->computed - i * bs),
                                       static_cast<int32_t>(g)});
        }
        counters_.blocks_swapped_out += context - t.first_held;
      }
      ++counters_.preemptions_swap;
      release_device(*s, /*keep_first_held=*/true);
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
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (s->tables[g].host.size() > queue_size(groups_[g].device)) return Code::kResourceExhausted;
    }
    const int32_t bs = opts_.block_size;
    for (size_t g = 0; g < groups_.size(); ++g) {
      Table& t = s->tables[g];
      const auto needed = static_cast<int32_t>(t.host.size());
      const std::vector<BlockId> fresh = allocate(static_cast<int32_t>(g), Medium::kDevice, needed);
      t.blocks.assign(t.first_held, kNoBlock);
      t.blocks.insert(t.blocks.end(), fresh.begin(), fresh.end());
      for (int32_t j = 0; j < needed; ++j) {
        const int32_t i = t.first_held + j;
        pending_.swap_in.push_back(
            {t.host[j], t.blocks[i], std::min(bs, s->computed - i * bs), static_cast<int32_t>(g)});
        Block& d = groups_[g].device.blocks[t.blocks[i]];
        d.write_step = step_;
        d.copy_only = true;
      }
      counters_.blocks_swapped_in += needed;
    }
    release_host(*s);
    s->state = SequenceState::kRunning;
    mark_scheduled(*s, 0);  // nothing is on the device before the swap-in runs
    offer(*s);
    bury_dead_windows();
    return Code::kOk;
  }

  Code fork(SeqId parent, SeqId child) {
    Seq* p = find(parent);
    if (p == nullptr) return Code::kNotFound;
    if (seqs_.count(child)) return Code::kAlreadyExists;
    if (p->state == SequenceState::kSwapped || p->drafts > 0) return Code::kFailedPrecondition;
    Seq c = *p;
    c.id = child;
    c.arrival = next_arrival_++;
    const auto context = static_cast<int32_t>(blocks_for(p->computed));  // computed blocks only
    for (size_t g = 0; g < groups_.size(); ++g) {
      Table& t = c.tables[g];
      t.blocks.resize(std::max(t.first_held, context));
      for (int32_t i = t.first_held; i < static_cast<int32_t>(t.blocks.size()); ++i) {
        touch(groups_[g].device, t.blocks[i]);
      }
    }
    c.offered = std::min(c.offered, context);
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
    bury_dead_windows();
    return Code::kOk;
  }

  // NOTE (contract): the new tokens are the sequence's uncomputed ones, at least one; drafts
  // follow them. Refused, nothing changes.
  std::pair<Code, std::vector<int64_t>> allocate_draft_slots(SeqId id, int32_t n,
                                                             std::span<const TokenId> draft) {
    Seq* s = find(id);
    if (s == nullptr) return {Code::kNotFound, {}};
    if (s->drafts > 0) return {Code::kFailedPrecondition, {}};
    const auto num_tokens = static_cast<int64_t>(s->tokens.size());
    if (n < 1 || draft.empty() || s->computed + int64_t{n} != num_tokens ||
        num_tokens + static_cast<int64_t>(draft.size()) > opts_.max_model_len) {
      return {Code::kInvalidArgument, {}};
    }
    s->tokens.insert(s->tokens.end(), draft.begin(), draft.end());
    const auto k = static_cast<int32_t>(draft.size());
    auto result = allocate(*s, n + k, 0, k);
    if (result.first != Code::kOk) {
      s->tokens.resize(static_cast<size_t>(num_tokens));
    } else {
      counters_.draft_tokens += k;
    }
    return result;
  }

  // Rejected drafts leave the token list and the computed count; the entries past the
  // computed blocks (only rejected drafts in them) are released, last first, as one release.
  Code accept_draft(SeqId id, int32_t accepted) {
    Seq* s = find(id);
    if (s == nullptr) return Code::kNotFound;
    if (s->drafts == 0 || scheduled(*s)) return Code::kFailedPrecondition;
    if (accepted < 0 || accepted > s->drafts) return Code::kInvalidArgument;
    const int32_t rejected = s->drafts - accepted;
    s->tokens.resize(s->tokens.size() - static_cast<size_t>(rejected));
    s->computed -= rejected;
    s->drafts = 0;
    const auto needed = static_cast<int32_t>(blocks_for(s->computed));
    for (size_t g = 0; g < groups_.size(); ++g) {
      std::vector<BlockId>& blocks = s->tables[g].blocks;
      std::vector<BlockId> last_first(
          blocks.rbegin(), blocks.rend() - std::min<int64_t>(needed, std::ssize(blocks)));
      release_device_blocks(static_cast<int32_t>(g), last_first);
      blocks.resize(std::min<size_t>(blocks.size(), static_cast<size_t>(needed)));
    }
    counters_.accepted_draft_tokens += accepted;
    offer(*s);
    bury_dead_windows();
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
    for (Group& g : groups_) {
      for (Pool* pool : {&g.device, &g.host}) {
        for (Block& b : pool->blocks) b.role = Role::kNone;
        pool->index.clear();
        pool->standby.clear();
        if (pool->adaptive) adaptive_reset(*pool);
      }
    }
    for (auto& [id, s] : seqs_) {
      if (s.computed > 0 || !s.tables[0].blocks.empty()) s.kv_before_reset = true;
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
  int32_t num_groups() const { return static_cast<int32_t>(groups_.size()); }
  const LayerGroup& layer_group(int32_t g) const { return groups_[g].spec; }
  const std::vector<Block>& device_blocks(int32_t g = 0) const { return groups_[g].device.blocks; }
  const std::vector<Block>& host_blocks(int32_t g = 0) const { return groups_[g].host.blocks; }
  std::vector<BlockId> device_queue(int32_t g = 0) const { return queue_order(groups_[g].device); }
  std::vector<BlockId> host_queue(int32_t g = 0) const { return queue_order(groups_[g].host); }
  int64_t evictions(int32_t g = 0) const { return groups_[g].device.evictions; }
  int64_t host_evictions(int32_t g = 0) const { return groups_[g].host.evictions; }
  // EvictionPolicy::kAdaptive's ghost hits of every group, from B1 (list 0) or B2 (1).
  int64_t adaptive_ghost_hits(int list) const {
    int64_t n = 0;
    for (const Group& g : groups_) n += g.device.ghost_hits[list];
    return n;
  }
  const Counters& counters() const { return counters_; }
  const StepOps& pending_ops() const { return pending_; }
  const KvCacheManager::Options& options() const { return opts_; }
  // The slots of group g from the last allocate call that succeeded (see slot_mapping()).
  const std::vector<int64_t>& last_slots(int32_t g) const { return last_slots_[g]; }
  // What the victim policy and running_sequences() show of a sequence: group 0's held
  // blocks.
  SequenceInfo info(const Seq& s) const {
    const Table& t = s.tables[0];
    return {s.id,
            s.priority,
            s.arrival,
            static_cast<int32_t>(t.blocks.size()) - t.first_held,
            static_cast<int32_t>(s.tokens.size()),
            s.computed};
  }
  int32_t used_host_blocks(int32_t g = 0) const {
    const auto& blocks = groups_[g].host.blocks;
    return static_cast<int32_t>(
        std::count_if(blocks.begin(), blocks.end(), [](const Block& b) { return b.ref > 0; }));
  }
  int32_t cached_free_blocks(int32_t g = 0) const {
    const auto& blocks = groups_[g].device.blocks;
    return static_cast<int32_t>(std::count_if(
        blocks.begin(), blocks.end(), [](const Block& b) { return b.cached() && b.ref == 0; }));
  }
  int32_t cached_host_blocks(int32_t g = 0) const {
    const auto& blocks = groups_[g].host.blocks;
    return static_cast<int32_t>(
        std::count_if(blocks.begin(), blocks.end(), [](const Block& b) { return b.cached(); }));
  }
  // KvCacheManager::group_stats(g).
  KvCacheManager::GroupStats group_stats(int32_t g) const {
    const Group& group = groups_[g];
    KvCacheManager::GroupStats s;
    s.num_blocks = group.spec.num_blocks;
    s.free_blocks = static_cast<int32_t>(queue_size(group.device));
    s.used_blocks = s.num_blocks - s.free_blocks;
    s.cached_free_blocks = cached_free_blocks(g);
    s.num_host_blocks = group.spec.num_host_blocks;
    s.used_host_blocks = used_host_blocks(g);
    s.cached_host_blocks = cached_host_blocks(g);
    s.evictions = group.device.evictions;
    s.host_evictions = group.host.evictions;
    s.hit_blocks = group.counters.hit_blocks;
    s.released_blocks = group.counters.released_blocks;
    s.blocks_demoted = group.counters.blocks_demoted;
    s.blocks_promoted = group.counters.blocks_promoted;
    s.blocks_not_admitted = group.counters.blocks_not_admitted;
    s.ghost_hits = group.counters.ghost_hits;
    return s;
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

  // The first position a token at `pos` attends to in group g (layer_group.h, restated).
  int64_t attended_from(int32_t g, int64_t pos) const {
    const LayerGroup& spec = groups_[g].spec;
    switch (spec.kind) {
      case AttentionKind::kSlidingWindow:
        return std::max<int64_t>(0, pos - spec.window + 1);
      case AttentionKind::kChunkedLocal:
        return pos / spec.window * spec.window;
      case AttentionKind::kState:
        return pos;
      case AttentionKind::kFull:
        break;
    }
    return 0;
  }

  // Whether freeing `s` would meet the open bug kAvoidFreeOfSwappedWithReleasedEntries.
  bool free_meets_known_bug(const Seq& s) const {
    return kAvoidFreeOfSwappedWithReleasedEntries && s.state == SequenceState::kSwapped &&
           std::any_of(s.tables.begin(), s.tables.end(),
                       [](const Table& t) { return t.first_held > 0; });
  }

 private:
  using Key = std::pair<uint64_t, uint64_t>;
  static Key key(const BlockHash& h) { return {h.lo, h.hi}; }

  // One pool of blocks: a group's device pool, or its host pool (swap blocks and the host
  // tier).
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
    std::vector<BlockId> clean;  // free and never cached since, head first
    // 2 * priority + frequent -> its list, LRU first (frequent: kAdaptive's T2 lists).
    std::map<int32_t, std::vector<BlockId>> levels;
    std::map<Key, BlockId> index;
    std::map<Key, std::vector<BlockId>> standby;  // per hash, newest first
    uint64_t next_content;
    uint64_t last_stamp = 0;
    uint64_t last_indexed = 0;
    uint64_t last_cached = 0;
    int64_t evictions = 0;
    // The anchor's pools with windowed groups caching: (hash, content) of each content that
    // left the index with no copy taking its place, until the next bury_dead_windows().
    bool logs_dead = false;
    std::vector<std::pair<BlockHash, uint64_t>> dead;
    std::vector<Expiry> expiries;
    // EvictionPolicy::kAdaptive (full groups' device pools): ARC's target for |T1|, its
    // ghost lists B1 and B2 (64 bits of the hash, oldest first), the parked non-leaves
    // (oldest first) and the ghost hits per list.
    bool adaptive = false;
    double target = 0;
    std::vector<uint64_t> ghosts[2];
    std::vector<BlockId> parked;
    int64_t ghost_hits[2] = {0, 0};
  };

  // A device block eviction dropped from the index: the host tier's copy is made from it.
  struct Evicted {
    BlockId block;
    BlockHash hash;
    uint64_t content;
    int32_t priority;
    int64_t duration;
  };

  struct Group {
    LayerGroup spec;
    int32_t watermark = 0;  // Options::watermark_blocks scaled to the pool
    Pool device;
    Pool host;
    std::vector<Evicted> evicted = {};         // by the device allocation in progress
    std::vector<BlockHash> host_evicted = {};  // host-tier hashes evicted (kReused), not ghosts yet
    std::vector<BlockHash> ghosts = {};        // HostAdmission::kReused: oldest first
    GroupCounters counters = {};
    bool windowed() const { return spec.kind != AttentionKind::kFull; }
    // The first table entry that a token at `pos` attends to.
    int32_t first_needed(int64_t pos, int32_t bs) const {
      switch (spec.kind) {
        case AttentionKind::kSlidingWindow:
          return static_cast<int32_t>(std::max<int64_t>(0, pos - spec.window + 1) / bs);
        case AttentionKind::kChunkedLocal:
          return static_cast<int32_t>(pos / spec.window * spec.window / bs);
        case AttentionKind::kState:
          return static_cast<int32_t>(pos / bs);
        case AttentionKind::kFull:
          break;
      }
      return 0;
    }
  };

  // A full group's verified chain: device hits from block 0, then host-tier hits.
  struct Chain {
    std::vector<BlockId> device;
    std::vector<BlockId> host;
    std::vector<uint64_t> keys;  // content key of each entry's hit: device, then host
    BlockId device_hit(int32_t i) const {
      return i < static_cast<int32_t>(device.size()) ? device[i] : kNoBlock;
    }
    BlockId host_hit(int32_t i) const { return host[i - device.size()]; }
  };

  // A windowed group's candidate for one entry.
  struct Entry {
    BlockId device = kNoBlock;
    BlockId host = kNoBlock;
    bool found() const { return device != kNoBlock || host != kNoBlock; }
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

  bool any_running() const {
    return std::any_of(seqs_.begin(), seqs_.end(), [](const auto& entry) {
      return entry.second.state == SequenceState::kRunning;
    });
  }

  // Whether every group's host pool can take `s`'s held context blocks.
  bool host_fits(const Seq& s) const {
    const int64_t context = blocks_for(s.computed);
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (context - s.tables[g].first_held > static_cast<int64_t>(queue_size(groups_[g].host))) {
        return false;
      }
    }
    return true;
  }

  // --- free queues ---

  static size_t queue_size(const Pool& p) {
    size_t n = p.clean.size() + p.parked.size();
    for (const auto& [priority, list] : p.levels) n += list.size();
    return n;
  }
  static std::vector<BlockId> queue_order(const Pool& p) {
    std::vector<BlockId> order = p.clean;
    for (const auto& [priority, list] : p.levels)
      order.insert(order.end(), list.begin(), list.end());
    order.insert(order.end(), p.parked.begin(), p.parked.end());
    return order;
  }
  static bool queued_in(const std::vector<BlockId>& list, BlockId b) {
    return std::find(list.begin(), list.end(), b) != list.end();
  }
  static void queue_erase(Pool& p, BlockId b) {
    std::erase(p.clean, b);
    for (auto& [priority, list] : p.levels) std::erase(list, b);
    std::erase(p.parked, b);
  }
  static int32_t level_of(const Block& d) { return 2 * d.effective_priority() + d.frequent; }
  static BlockId queue_pop(Pool& p) {
    if (p.adaptive) return adaptive_pop(p);
    std::vector<BlockId>* list = &p.clean;
    for (auto& [priority, l] : p.levels) {
      if (!list->empty()) break;
      list = &l;
    }
    const BlockId b = list->front();
    list->erase(list->begin());
    return b;
  }
  // Inserts b into list `level` before the first block released after it.
  static void insert_by_stamp(Pool& p, BlockId b, int32_t level) {
    std::vector<BlockId>& list = p.levels[level];
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
      if (queued_in(p.parked, e.block) && b.stamp == e.stamp) {
        b.priority = Block::kNone;  // unparked at the default priority
        b.duration = 0;
        continue;
      }
      const auto level = p.levels.find(level_of(b));
      if (level == p.levels.end() || !queued_in(level->second, e.block) || b.stamp != e.stamp) {
        continue;  // taken or freed again since
      }
      std::erase(level->second, e.block);
      b.priority = Block::kNone;
      b.duration = 0;
      insert_by_stamp(p, e.block, level_of(b));
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

  static uint64_t content_of(const Pool& p, BlockId b) {
    return b == kNoBlock ? 0 : p.blocks[b].content;
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

  // Free device blocks group g may fill with promotions once `free_hits` free blocks are
  // shared: the watermark stays free while others run.
  int64_t room(const Group& g, int32_t free_hits) const {
    const int32_t reserve = any_running() ? g.watermark : 0;
    return std::max<int64_t>(0, static_cast<int64_t>(queue_size(g.device)) - free_hits - reserve);
  }

  // Full group g's chain for `s`: verified device hits from block 0, then verified host
  // hits (with the tier), as many as free device blocks allow once the device hits are
  // shared.
  Chain walk_chain(const Group& g, const Seq& s, const std::vector<BlockHash>& hashes,
                   int32_t max_blocks) const {
    Chain c;
    uint64_t parent = 0;
    int32_t free_hits = 0;
    for (int32_t i = 0; i < max_blocks; ++i) {
      const BlockId b = find_hit(g.device, hashes[i], parent, s, i);
      if (b == kNoBlock) break;
      c.device.push_back(b);
      parent = g.device.blocks[b].content;
      c.keys.push_back(parent);
      free_hits += g.device.blocks[b].ref == 0;
    }
    if (!opts_.enable_host_cache) return c;
    const int64_t promotions = room(g, free_hits);
    for (auto i = static_cast<int32_t>(c.device.size());
         i < max_blocks && static_cast<int64_t>(c.host.size()) < promotions; ++i) {
      const BlockId h = find_hit(g.host, hashes[i], parent, s, i);
      if (h == kNoBlock) break;
      c.host.push_back(h);
      parent = g.host.blocks[h].content;
      c.keys.push_back(parent);
    }
    return c;
  }

  // Windowed group g's hit for entry i: a device block, else a host-tier block, holding
  // block i of `s` after the anchor's chain entry i - 1.
  Entry window_entry(const Group& g, const Seq& s, const std::vector<BlockHash>& hashes, int32_t i,
                     const std::vector<uint64_t>& anchor_keys) const {
    const uint64_t parent = i == 0 ? 0 : anchor_keys[i - 1];
    Entry e;
    e.device = find_hit(g.device, hashes[i], parent, s, i);
    if (e.device == kNoBlock && opts_.enable_host_cache) {
      e.host = find_hit(g.host, hashes[i], parent, s, i);
    }
    return e;
  }

  // Whether windowed group g serves a hit of q blocks: every entry the token at q * bs
  // attends to is there, and its host-tier entries fit the free device blocks.
  bool window_serves(const Group& g, const std::vector<Entry>& entries, int32_t q) const {
    int32_t in_host = 0;
    int32_t free_hits = 0;
    for (int32_t i = g.first_needed(int64_t{q} * opts_.block_size, opts_.block_size); i < q; ++i) {
      if (!entries[i].found()) return false;
      if (entries[i].device == kNoBlock) {
        ++in_host;
      } else {
        free_hits += g.device.blocks[entries[i].device].ref == 0;
      }
    }
    return in_host <= room(g, free_hits);
  }

  // Takes block b out of the index or its hash's standbys; the oldest standby replaces an
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
      if (p.logs_dead) p.dead.push_back({d.hash, d.content});
      return true;
    }
    p.index[k] = standby.back();
    p.blocks[standby.back()].role = Role::kIndexed;
    p.blocks[standby.back()].indexed_at = ++p.last_indexed;
    standby.pop_back();
    return false;
  }

  // Takes n blocks from the head of group g's device or host queue; cached blocks taken
  // this way are evicted (device ones logged for the host tier). Device allocations then
  // demote what they evicted.
  std::vector<BlockId> allocate(int32_t g, Medium medium, int32_t n) {
    std::vector<BlockId> out = take_blocks(g, medium, n);
    if (medium == Medium::kDevice) demote_evicted(g);
    return out;
  }

  std::vector<BlockId> take_blocks(int32_t g, Medium medium, int32_t n) {
    Group& group = groups_[g];
    Pool& p = medium == Medium::kDevice ? group.device : group.host;
    if (n > 0) expire(p);
    std::vector<BlockId> out;
    for (int32_t i = 0; i < n; ++i) {
      const BlockId b = queue_pop(p);
      Block& d = p.blocks[b];
      if (d.cached()) {
        // One event per evicted block; none when a standby takes over the hash.
        const bool gone = leave_index(p, b);
        if (gone) {
          events_.push_back(BlockRemoved{{d.hash}, p.medium});
          if (medium == Medium::kDevice && opts_.enable_host_cache) {
            group.evicted.push_back({b, d.hash, d.content, d.priority, d.duration});
          }
          if (medium == Medium::kHost && reuse_admission()) group.host_evicted.push_back(d.hash);
        }
        if (p.adaptive) adaptive_uncached(p, b, gone);
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

  // Whether group g's host tier holds e's hash already; a free host copy of the same
  // contents then moves to the tier's most recently used end with e's retention, without
  // a copy.
  bool refresh_host_copy(int32_t g, const Evicted& e) {
    Group& group = groups_[g];
    const auto it = group.host.index.find(key(e.hash));
    if (it == group.host.index.end()) return false;
    const Block& src = group.device.blocks[e.block];
    Block& copy = group.host.blocks[it->second];
    if (copy.ref == 0 && copy.parent_content == src.parent_content && copy.tokens == src.tokens &&
        copy.extra_keys == src.extra_keys) {
      touch(group.host, it->second);
      set_retention(copy, e.priority, e.duration);
      release_host_block(g, it->second);
    }
    return true;
  }

  // Enters host block h of group g, about to receive the evicted device block e's K/V,
  // into the tier.
  void cache_host_copy(int32_t g, BlockId h, const Evicted& e) {
    Group& group = groups_[g];
    const Block& src = group.device.blocks[e.block];
    Block& d = group.host.blocks[h];
    d.content = e.content;
    d.role = Role::kIndexed;
    d.cached_at = ++group.host.last_cached;
    d.hash = e.hash;
    d.parent_content = src.parent_content;
    d.parent_hash = src.parent_hash;
    d.tokens = src.tokens;
    d.extra_keys = src.extra_keys;
    group.host.index[key(e.hash)] = h;
    events_.push_back(BlockStored{
        {e.hash}, src.parent_hash, src.tokens, opts_.block_size, src.extra_keys, Medium::kHost});
    set_retention(d, e.priority, e.duration);
  }

  bool reuse_admission() const {
    return opts_.enable_host_cache && opts_.host_admission == HostAdmission::kReused;
  }

  // Makes `hash` group g's most recent ghost (kReused), forgetting the oldest beyond
  // device + host blocks.
  void add_ghost(int32_t g, const BlockHash& hash) {
    if (!reuse_admission()) return;
    std::vector<BlockHash>& ghosts = groups_[g].ghosts;
    std::erase(ghosts, hash);
    ghosts.push_back(hash);
    const auto capacity =
        static_cast<size_t>(groups_[g].spec.num_blocks + groups_[g].spec.num_host_blocks);
    if (ghosts.size() > capacity) ghosts.erase(ghosts.begin());
  }

  // Host-tier hashes the host pool evicted since the last call become ghosts.
  void ghost_host_evictions(int32_t g) {
    for (const BlockHash& hash : std::exchange(groups_[g].host_evicted, {})) add_ghost(g, hash);
  }

  // HostAdmission::kReused: the evicted blocks neither reused nor held by the tier (by
  // hash) are dropped, their hashes ghosts.
  void drop_unreused(int32_t g, std::vector<Evicted>& evicted) {
    if (!reuse_admission()) return;
    Group& group = groups_[g];
    std::erase_if(evicted, [&](const Evicted& e) {
      if (group.device.blocks[e.block].reused || group.host.index.count(key(e.hash)) != 0) {
        return false;
      }
      add_ghost(g, e.hash);
      ++group.counters.blocks_not_admitted;
      ++counters_.blocks_not_admitted;
      return true;
    });
  }

  // The blocks [begin, end) of s's table in group g were computed and offered: with
  // kReused, each is reused if its hash was a ghost (which it no longer is).
  void note_computed(int32_t g, const Seq& s, const std::vector<BlockHash>& hashes, int32_t begin,
                     int32_t end) {
    if (!reuse_admission()) return;
    Group& group = groups_[g];
    for (int32_t i = begin; i < end; ++i) {
      const bool ghost = std::erase(group.ghosts, hashes[i]) == 1;
      group.device.blocks[s.tables[g].blocks[i]].reused = ghost;
      group.counters.ghost_hits += ghost;
      counters_.ghost_hits += ghost;
    }
  }

  void demote_evicted(int32_t g) {
    drop_unreused(g, groups_[g].evicted);
    demote(g);
  }

  // Each evicted device block of group g is copied into a host block unless the tier
  // holds its hash or no host block is free; the host block is held until the copy is
  // taken. With fewer free host blocks than evictions, the least recently used evictions
  // are dropped. Hashes that leave both tiers become ghosts (kReused).
  void demote(int32_t g) {
    Group& group = groups_[g];
    const std::vector<Evicted> evicted = std::exchange(group.evicted, {});
    const size_t free_host = queue_size(group.host);
    const size_t dropped = evicted.size() > free_host ? evicted.size() - free_host : 0;
    ghost_host_evictions(g);
    for (size_t i = 0; i < dropped; ++i) add_ghost(g, evicted[i].hash);
    for (size_t i = dropped; i < evicted.size(); ++i) {
      const Evicted& e = evicted[i];
      if (refresh_host_copy(g, e)) continue;
      if (queue_size(group.host) == 0) {
        add_ghost(g, e.hash);
        continue;
      }
      const BlockId h = take_blocks(g, Medium::kHost, 1)[0];
      ghost_host_evictions(g);
      cache_host_copy(g, h, e);
      pending_.demote.push_back({e.block, h, opts_.block_size, g});
      release_host_block(g, h);
      ++group.counters.blocks_demoted;
      ++counters_.blocks_demoted;
    }
  }

  // Promotes group g's host-tier hits `at` (entry, host block) of s into new device blocks
  // that take their content keys and enter the device index; the host copies leave the
  // tier. A new device block that held an evicted cached block trades places with its host
  // block (an exchange op) unless the tier holds that block's hash already. Each run of
  // consecutive entries is indexed as one call: a full group's after its table's previous
  // block, a windowed group's after the anchor's chain (`anchor_keys`).
  void promote(int32_t g, Seq& s, const std::vector<BlockHash>& hashes,
               const std::vector<std::pair<int32_t, BlockId>>& at,
               const std::vector<uint64_t>& anchor_keys) {
    if (at.empty()) return;
    Group& group = groups_[g];
    for (const auto& [i, h] : at) touch(group.host, h);
    const std::vector<BlockId> fresh =
        take_blocks(g, Medium::kDevice, static_cast<int32_t>(at.size()));
    std::vector<Evicted> evicted = std::exchange(group.evicted, {});
    drop_unreused(g, evicted);
    for (const BlockId d : fresh) group.device.blocks[d].reused = true;
    size_t next_evicted = 0;
    const int32_t bs = opts_.block_size;
    for (size_t j = 0; j < at.size(); ++j) {
      const BlockId h = at[j].second;
      const BlockId d = fresh[j];
      group.device.blocks[d].content = group.host.blocks[h].content;
      group.device.blocks[d].write_step = step_;
      group.device.blocks[d].copy_only = true;
      if (leave_index(group.host, h)) {
        events_.push_back(BlockRemoved{{group.host.blocks[h].hash}, Medium::kHost});
      }
      const Evicted* e = nullptr;
      if (next_evicted < evicted.size() && evicted[next_evicted].block == d) {
        e = &evicted[next_evicted++];
      }
      // A host block a pending demotion or exchange writes is promoted after that batch,
      // and the evicted block demoted into another host block.
      const bool written_this_step = host_pending(g, h);
      if (e != nullptr && !written_this_step && !refresh_host_copy(g, *e)) {
        cache_host_copy(g, h, *e);
        pending_.exchange.push_back({d, h, bs, g});
        ++group.counters.blocks_demoted;
        ++counters_.blocks_demoted;
      } else {
        if (e != nullptr && written_this_step) group.evicted.push_back(*e);
        pending_.promote.push_back({h, d, bs, g});
      }
      release_host_block(g, h);
    }
    demote(g);
    Table& t = s.tables[g];
    for (size_t j = 0; j < at.size(); ++j) t.blocks[at[j].first] = fresh[j];
    for (size_t begin = 0; begin < at.size();) {
      size_t end = begin + 1;
      while (end < at.size() && at[end].first == at[end - 1].first + 1) ++end;
      cache_blocks(g, s, hashes, at[begin].first, at[end - 1].first + 1, anchor_keys);
      begin = end;
    }
    group.counters.blocks_promoted += static_cast<int64_t>(at.size());
    counters_.blocks_promoted += static_cast<int64_t>(at.size());
    if (g == anchor_) counters_.host_hit_tokens += static_cast<int64_t>(at.size()) * bs;
  }

  // Partial-block reuse: a hit of `hit` blocks continues into the first k tokens (fewer
  // than a block, never the last token) of a cached block in every group, the block
  // cached after the table's block hit - 1 (a windowed group: the anchor's) with the same
  // extra keys and starting with the prompt's next tokens. The shortest of the groups'
  // matches is reused: every group copies that many tokens (copy-on-write) into a new block
  // that ends its table. Nothing is reused when a group has no match, its block is filled
  // in this step, or no device block is free for the copy (its block counts if it is free).
  // NOTE (contract): the groups are asked in order, each for the longest match of the
  // tokens that the groups before it matched, so a later group may pick another block than
  // it would for all of them. Returns k (0: none).
  int32_t reuse_partial_block(Seq& s, int32_t hit) {
    const int32_t bs = opts_.block_size;
    int32_t k = std::min<int32_t>(bs - 1, static_cast<int32_t>(s.tokens.size()) - 1 - hit * bs);
    if (k <= 0) return 0;
    std::vector<BlockId> sources;
    for (size_t g = 0; g < groups_.size(); ++g) {
      const std::vector<TokenId> next(s.tokens.begin() + int64_t{hit} * bs,
                                      s.tokens.begin() + int64_t{hit} * bs + k);
      const Group& group = groups_[g];
      const int32_t parent_group = group.windowed() ? anchor_ : static_cast<int32_t>(g);
      const uint64_t parent = hit == 0 ? 0
                                       : content_of(groups_[parent_group].device,
                                                    s.tables[parent_group].blocks[hit - 1]);
      const auto [src, matched] = partial_match(group.device, parent, next, s.extra_keys);
      if (src == kNoBlock || group.device.blocks[src].write_step == step_ ||
          room(group, group.device.blocks[src].ref == 0) < 1) {
        return 0;
      }
      sources.push_back(src);
      k = std::min(k, matched);
    }
    for (size_t g = 0; g < groups_.size(); ++g) {
      const auto gi = static_cast<int32_t>(g);
      Group& group = groups_[g];
      touch(group.device, sources[g]);  // the allocation below cannot evict it
      const BlockId dst = allocate(gi, Medium::kDevice, 1)[0];
      pending_.copy_on_write.push_back({sources[g], dst, k, gi});
      release_device_blocks(gi, {sources[g]});  // parked until the step if it was free
      group.device.blocks[dst].write_step = step_;
      group.device.blocks[dst].copy_only = true;
      s.tables[g].blocks.push_back(dst);
    }
    return k;
  }

  // The indexed block of `p` cached after `parent` with `extra_keys` whose first tokens
  // match the most of `tokens` (at least one), and how many. NOTE (contract): of equally
  // long matches, the block indexed last.
  std::pair<BlockId, int32_t> partial_match(const Pool& p, uint64_t parent,
                                            const std::vector<TokenId>& tokens,
                                            const std::vector<uint64_t>& extra_keys) const {
    BlockId best = kNoBlock;
    int32_t best_n = 0;
    for (BlockId b = 0; b < static_cast<BlockId>(p.blocks.size()); ++b) {
      const Block& d = p.blocks[b];
      if (d.role != Role::kIndexed || d.parent_content != parent || d.extra_keys != extra_keys) {
        continue;
      }
      int32_t n = 0;
      while (n < static_cast<int32_t>(tokens.size()) && d.tokens[n] == tokens[n]) ++n;
      if (n > 0 && (n > best_n || (n == best_n && d.indexed_at > p.blocks[best].indexed_at))) {
        best = b;
        best_n = n;
      }
    }
    return {best, best_n};
  }

  void touch(Pool& p, BlockId b) {
    Block& d = p.blocks[b];
    if (d.ref++ == 0) {
      queue_erase(p, b);
      d.priority = Block::kNone;
      d.duration = 0;
    }
    if (p.adaptive && d.cached()) make_frequent(p, b);
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
      p.levels[level_of(d)].push_back(b);
      if (d.duration > 0 && d.priority != Block::kNone) {
        p.expiries.push_back({now() + d.duration, b, d.stamp});
      }
    }
  }

  // The retention s gives entries [begin, end) of its table in group g as it releases
  // them. NOTE (contract): an entry's retention is that of the last range holding its first
  // token; with none, a windowed group's entry (prefix caching on) gets its window class
  // (window_priority()).
  void apply_retention(int32_t g, const Seq& s, int32_t begin, int32_t end, bool ranges = true) {
    const bool classes = groups_[g].windowed() && opts_.enable_prefix_caching;
    for (int32_t i = begin; i < end; ++i) {
      Block& b = groups_[g].device.blocks[s.tables[g].blocks[i]];
      const int64_t first_token = static_cast<int64_t>(i) * opts_.block_size;
      const auto r = std::find_if(
          s.retention.rbegin(), s.retention.rend(),
          [&](const RetentionRange& r) { return first_token >= r.begin && first_token < r.end; });
      if (ranges && r != s.retention.rend()) {
        set_retention(b, r->priority, r->duration_ms);
      } else if (classes) {
        set_retention(b, window_priority(groups_[g], s, i), 0);
      }
    }
  }

  // Windowed eviction (docs/allocator.md): the retention class of entry `entry` of windowed
  // group g when s releases it, by the most useful hit point p (blocks) whose window needs
  // it: p > entry, p within s's full blocks, and the token at p * block_size attends to the
  // entry. Top class (the default priority): a branch point of s's last match (where its
  // full groups' chains ended, where its hit ended). Below it, one class per checkpoint
  // level: level l's points lie every window_checkpoint_tokens / 2^l tokens (spacings below
  // a block are dropped), coarser levels ranking higher. Lowest: no such point.
  int32_t window_priority(const Group& g, const Seq& s, int32_t entry) const {
    const int32_t bs = opts_.block_size;
    const int32_t levels = opts_.window_checkpoint_tokens > 0 ? opts_.window_checkpoint_levels : 0;
    const int64_t full_blocks = static_cast<int64_t>(s.tokens.size()) / bs;
    auto needs = [&](int64_t p) {
      return p > entry && p <= full_blocks && g.first_needed(p * bs, bs) <= entry;
    };
    const int32_t lowest = kDefaultRetentionPriority - 1 - levels;
    if (needs(s.match_chain_end) || needs(s.match_hit)) return kDefaultRetentionPriority;
    for (int32_t l = 0; l < levels; ++l) {
      const int64_t spacing = int64_t{opts_.window_checkpoint_tokens} >> l;
      if (spacing < bs) break;
      // Every checkpoint within the full blocks, its point the blocks before it.
      for (int64_t k = 1; k * spacing / bs <= full_blocks; ++k) {
        if (needs(k * spacing / bs)) return kDefaultRetentionPriority - 1 - l;
      }
    }
    return lowest;
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
    for (size_t g = 0; g < groups_.size(); ++g) {
      const Table& t = s.tables[g];
      Pool& p = groups_[g].device;
      const int32_t end = std::min<int32_t>(s.offered, static_cast<int32_t>(t.blocks.size()));
      for (int32_t i = std::max(s.settled / opts_.block_size, t.first_held); i < end; ++i) {
        const BlockId b = t.blocks[i];
        Block& d = p.blocks[b];
        const bool copy_filled = d.write_step == step_ && d.copy_only;
        if (d.ref != 1 || !d.cached() || copy_filled) continue;
        if (leave_index(p, b)) events_.push_back(BlockRemoved{{d.hash}, Medium::kDevice});
        if (p.adaptive) adaptive_uncached(p, b, /*evicted=*/false);
      }
    }
  }

  void drop_claim(Seq& s) {
    counters_.claims_released += !s.tables[0].blocks.empty();
    unshare_unwritten(s);
    release_device(s);
    s.computed = 0;
    s.offered = 0;
    s.kv_before_reset = false;
    s.scheduled_step = 0;
    bury_dead_windows();
  }

  // Before preempting: the claim of a waiting sequence (not the requester) holding a block
  // nobody else holds, in any group; lowest priority, then latest arrival.
  bool release_one_claim(SeqId requester) {
    Seq* chosen = nullptr;
    for (auto& [id, s] : seqs_) {
      if (id == requester || s.state != SequenceState::kWaiting) continue;
      bool frees_a_block = false;
      for (size_t g = 0; g < groups_.size(); ++g) {
        const Table& t = s.tables[g];
        for (int32_t i = t.first_held; i < static_cast<int32_t>(t.blocks.size()); ++i) {
          frees_a_block |= groups_[g].device.blocks[t.blocks[i]].ref == 1;
        }
      }
      if (!frees_a_block) continue;
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

  // Named by a pending op of group g that reads or writes device memory after the release:
  // a CoW copy (either end), a swap-in or promotion destination, an exchange. Swap-out and
  // demotion sources are read first in a step, so they may be reused at once.
  bool device_pending(int32_t g, BlockId b) const {
    for (const BlockCopy& op : pending_.copy_on_write) {
      if (op.group == g && (op.src == b || op.dst == b)) return true;
    }
    for (const BlockCopy& op : pending_.exchange) {
      if (op.group == g && op.src == b) return true;
    }
    for (const auto* ops : {&pending_.swap_in, &pending_.promote}) {
      for (const BlockCopy& op : *ops) {
        if (op.group == g && op.dst == b) return true;
      }
    }
    return false;
  }
  bool host_pending(int32_t g, BlockId h) const {
    for (const auto* ops : {&pending_.swap_out, &pending_.demote, &pending_.exchange}) {
      for (const BlockCopy& op : *ops) {
        if (op.group == g && op.dst == h) return true;
      }
    }
    for (const auto* ops : {&pending_.swap_in, &pending_.promote}) {
      for (const BlockCopy& op : *ops) {
        if (op.group == g && op.src == h) return true;
      }
    }
    return false;
  }

  // Releases device blocks of group g as one free, in the given order; a last reference to
  // a block a pending op still names is parked.
  void release_device_blocks(int32_t g, const std::vector<BlockId>& blocks) {
    std::vector<BlockId> released;
    for (const BlockId b : blocks) {
      if (device_pending(g, b) && groups_[g].device.blocks[b].ref == 1) {
        deferred_device_.push_back({g, b});
      } else {
        released.push_back(b);
      }
    }
    unref(groups_[g].device, released);
  }

  // Every group's held blocks, tail first, each group as one release. A swap-out keeps
  // first_held for swap_in(); every other release forgets it.
  void release_device(Seq& s, bool keep_first_held = false) {
    for (size_t g = 0; g < groups_.size(); ++g) {
      Table& t = s.tables[g];
      const auto size = static_cast<int32_t>(t.blocks.size());
      apply_retention(static_cast<int32_t>(g), s, t.first_held, size);
      std::vector<BlockId> tail_first;
      for (int32_t i = size - 1; i >= t.first_held; --i) tail_first.push_back(t.blocks[i]);
      release_device_blocks(static_cast<int32_t>(g), tail_first);
      t.blocks.clear();
      if (!keep_first_held) t.first_held = 0;
    }
  }

  void release_host_block(int32_t g, BlockId h) {
    if (host_pending(g, h)) {
      deferred_host_.push_back({g, h});
    } else {
      unref(groups_[g].host, {h});
    }
  }

  void release_host(Seq& s) {
    for (size_t g = 0; g < groups_.size(); ++g) {
      Table& t = s.tables[g];
      std::vector<BlockId> released;
      for (auto it = t.host.rbegin(); it != t.host.rend(); ++it) {
        if (host_pending(static_cast<int32_t>(g), *it)) {
          deferred_host_.push_back({static_cast<int32_t>(g), *it});
        } else {
          released.push_back(*it);
        }
      }
      unref(groups_[g].host, released);
      t.host.clear();
    }
  }

  // Parked blocks whose copies were taken are released one at a time, in parking order.
  void release_deferred() {
    std::vector<std::pair<int32_t, BlockId>> keep;
    for (const auto& [g, b] : deferred_device_) {
      if (device_pending(g, b)) {
        keep.push_back({g, b});
      } else {
        unref(groups_[g].device, {b});
      }
    }
    deferred_device_ = std::move(keep);
    keep.clear();
    for (const auto& [g, h] : deferred_host_) {
      if (host_pending(g, h)) {
        keep.push_back({g, h});
      } else {
        unref(groups_[g].host, {h});
      }
    }
    deferred_host_ = std::move(keep);
  }

  // What allocate() does in one group, decided before anything changes.
  struct Plan {
    int32_t release_end = 0;  // windowed: entries before it are released
    int32_t new_blocks = 0;
    bool cow = false;
  };

  std::pair<Code, std::vector<int64_t>> allocate(Seq& s, int32_t n, int32_t lookahead,
                                                 int32_t drafts = 0) {
    const int32_t bs = opts_.block_size;
    if (s.drafts > 0) return {Code::kFailedPrecondition, {}};
    if (n < 0 || lookahead < 0) return {Code::kInvalidArgument, {}};
    if (s.state == SequenceState::kSwapped) return {Code::kFailedPrecondition, {}};
    const int64_t new_total = int64_t{s.computed} + n;
    if (new_total > static_cast<int64_t>(s.tokens.size())) return {Code::kInvalidArgument, {}};
    const int64_t total_blocks = blocks_for(new_total + lookahead);
    const int32_t partial = s.computed % bs;
    const int32_t write_block = s.computed / bs;
    // The watermark holds back an admission only while another sequence is running.
    const bool admission = s.state == SequenceState::kWaiting && any_running();
    // NOTE (contract): the groups are checked in order, each for a request it can never
    // hold (InvalidArgument), an unsafe copy-on-write, then free blocks; the first failing
    // check decides.
    std::vector<Plan> plans(groups_.size());
    for (size_t g = 0; g < groups_.size(); ++g) {
      const Group& group = groups_[g];
      const Table& t = s.tables[g];
      Plan& plan = plans[g];
      // A windowed group releases the entries wholly before the window of the next token,
      // up to the first one this step fills (released by a later call).
      int32_t freed = 0;
      plan.release_end = t.first_held;
      if (group.windowed()) {
        const int32_t first_needed = group.first_needed(s.computed, bs);
        for (; plan.release_end < first_needed &&
               plan.release_end < static_cast<int32_t>(t.blocks.size());
             ++plan.release_end) {
          const BlockId b = t.blocks[plan.release_end];
          if (group.device.blocks[b].write_step == step_) break;
          freed += group.device.blocks[b].ref == 1 && !device_pending(static_cast<int32_t>(g), b);
        }
      }
      const int64_t held = total_blocks - (group.windowed() ? plan.release_end : 0);
      if (held > group.spec.num_blocks) return {Code::kInvalidArgument, {}};
      plan.cow = n > 0 && partial != 0 && group.device.blocks[t.blocks[write_block]].ref > 1;
      // A copy-on-write must not copy tokens whose K/V this step has not written yet.
      if (plan.cow && scheduled(s) && s.settled < s.computed) {
        return {Code::kFailedPrecondition, {}};
      }
      plan.new_blocks = static_cast<int32_t>(
          std::max<int64_t>(0, total_blocks - static_cast<int64_t>(t.blocks.size())) + plan.cow);
      const int32_t reserve = admission ? group.watermark : 0;
      if (int64_t{plan.new_blocks} + reserve >
          static_cast<int64_t>(queue_size(group.device)) + freed) {
        return {Code::kResourceExhausted, {}};
      }
    }
    last_slots_.assign(groups_.size(), {});
    for (size_t g = 0; g < groups_.size(); ++g) {
      const auto gi = static_cast<int32_t>(g);
      Group& group = groups_[g];
      Table& t = s.tables[g];
      const Plan& plan = plans[g];
      if (plan.release_end > t.first_held) release_behind_window(gi, s, plan.release_end);
      std::vector<BlockId> fresh = allocate(gi, Medium::kDevice, plan.new_blocks);
      size_t next = 0;
      if (plan.cow) {
        // NOTE (contract): the copy's destination is the first block allocated.
        const BlockId src = t.blocks[write_block];
        const BlockId dst = fresh[next++];
        pending_.copy_on_write.push_back({src, dst, partial, gi});
        --group.device.blocks[src].ref;  // other sharers still hold it
        t.blocks[write_block] = dst;
        ++counters_.cow_copies;
      }
      t.blocks.insert(t.blocks.end(), fresh.begin() + static_cast<int64_t>(next), fresh.end());
      for (int64_t pos = s.computed; pos < new_total; ++pos) {
        const BlockId b = t.blocks[pos / bs];
        last_slots_[g].push_back(int64_t{b} * bs + pos % bs);
        group.device.blocks[b].write_step = step_;
        group.device.blocks[b].copy_only = false;
      }
    }
    if (n > 0) mark_scheduled(s, s.computed);
    s.computed = static_cast<int32_t>(new_total);
    s.drafts = drafts;
    s.state = SequenceState::kRunning;
    offer(s);
    bury_dead_windows();
    return {Code::kOk, last_slots_[0]};
  }

  // Releases entries [first_held, end) of windowed group g's table, in table order, as one
  // release: no future token of s attends to them. Hashed blocks stay cached.
  void release_behind_window(int32_t g, Seq& s, int32_t end) {
    Table& t = s.tables[g];
    apply_retention(g, s, t.first_held, end, /*ranges=*/!kEmulateNoRetentionBehindWindow);
    std::vector<BlockId> released;
    for (int32_t i = t.first_held; i < end; ++i) {
      released.push_back(t.blocks[i]);
      t.blocks[i] = kNoBlock;
    }
    release_device_blocks(g, released);
    groups_[g].counters.released_blocks += end - t.first_held;
    t.first_held = end;
  }

  // Enters entries [begin, end) of s's table in group g into the group's device index as
  // one call, each once: a block is skipped if it is already hashed; when another block
  // holds its hash it becomes that block's newest standby if it has the same tokens, extra
  // keys and parent contents, and is skipped otherwise. The parent contents are those of
  // the table's previous block (full groups, read as each block is cached) or of the
  // anchor's chain entry before it (windowed groups: anchor_keys[i - 1]). One BlockStored
  // per run of consecutive blocks indexed; a block not indexed ends a run.
  void cache_blocks(int32_t g, const Seq& s, const std::vector<BlockHash>& hashes, int32_t begin,
                    int32_t end, const std::vector<uint64_t>& anchor_keys) {
    Group& group = groups_[g];
    Pool& p = group.device;
    const Table& t = s.tables[g];
    BlockStored stored;
    auto end_run = [&] {
      if (!stored.block_hashes.empty()) events_.push_back(std::exchange(stored, {}));
    };
    for (int32_t i = begin; i < end; ++i) {
      const BlockId b = t.blocks[i];
      const BlockHash& h = hashes[i];
      Block& d = p.blocks[b];
      if (d.cached()) {
        end_run();
        continue;
      }
      const uint64_t parent_content = i == 0             ? 0
                                      : group.windowed() ? anchor_keys[i - 1]
                                                         : content_of(p, t.blocks[i - 1]);
      // A windowed pool: a copy holding these tokens and extra keys after other parent
      // contents can never verify again; it and its standbys give way to this block.
      if (const auto stale = p.index.find(key(h));
          group.windowed() && stale != p.index.end() &&
          p.blocks[stale->second].parent_content != parent_content &&
          p.blocks[stale->second].tokens == block_tokens(s, i) &&
          p.blocks[stale->second].extra_keys == s.extra_keys) {
        while (p.index.count(key(h)) != 0) drop_from_cache(p, p.index.at(key(h)));
      }
      const auto indexed = p.index.find(key(h));
      if (indexed != p.index.end()) {
        const Block& original = p.blocks[indexed->second];
        if (original.parent_content != parent_content || original.tokens != block_tokens(s, i) ||
            original.extra_keys != s.extra_keys) {
          end_run();
          continue;  // a collision: not shareable
        }
        d.role = Role::kStandby;
        d.content = original.content;
        std::vector<BlockId>& standby = p.standby[key(h)];
        standby.insert(standby.begin(), b);
      } else {
        d.role = Role::kIndexed;
        d.indexed_at = ++p.last_indexed;
        p.index[key(h)] = b;
      }
      d.cached_at = ++p.last_cached;
      d.hash = h;
      d.parent_content = parent_content;
      d.parent_hash = i > 0 ? std::optional(hashes[i - 1]) : std::nullopt;
      d.tokens = block_tokens(s, i);
      d.extra_keys = s.extra_keys;
      if (p.adaptive) adaptive_cached(p, b, i == 0 ? kNoBlock : t.blocks[i - 1]);
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
  }

  // Takes block b out of pool p's index (its hash's oldest standby takes its place); a free
  // one moves from its priority's list to the clean list's head without its retention.
  void drop_from_cache(Pool& p, BlockId b) {
    Block& d = p.blocks[b];
    if (d.ref == 0) queue_erase(p, b);
    if (leave_index(p, b)) events_.push_back(BlockRemoved{{d.hash}, p.medium});
    if (p.adaptive) adaptive_uncached(p, b, /*evicted=*/false);
    if (d.ref == 0) {
      p.clean.insert(p.clean.begin(), b);
      d.priority = Block::kNone;
      d.duration = 0;
    }
  }

  // --- EvictionPolicy::kAdaptive (docs/allocator.md, "Eviction policy") ---

  static int32_t frequent_blocks(const Pool& p) {
    return static_cast<int32_t>(
        std::count_if(p.blocks.begin(), p.blocks.end(), [](const Block& d) { return d.frequent; }));
  }
  static bool linked(const Pool& p, const Block& d) {
    return d.parent != kNoBlock && p.blocks[d.parent].epoch == d.parent_epoch;
  }
  static int32_t cached_children(const Pool& p, BlockId b) {
    return static_cast<int32_t>(
        std::count_if(p.blocks.begin(), p.blocks.end(),
                      [&](const Block& d) { return d.cached() && d.parent == b && linked(p, d); }));
  }

  // A clean block; else from the lowest priority's lists the least recent leaf of its
  // recent list while |T1| = C - |T2| is over the target (or its frequent list is empty),
  // else of its frequent list, parking the non-leaves met; else a parked block.
  static BlockId adaptive_pop(Pool& p) {
    while (true) {
      std::vector<BlockId>* from = &p.clean;
      if (from->empty()) {
        auto level = std::find_if(p.levels.begin(), p.levels.end(),
                                  [](const auto& l) { return !l.second.empty(); });
        from = level == p.levels.end() ? &p.parked : &level->second;
        const auto frequent = level == p.levels.end() || level->first % 2 == 1
                                  ? p.levels.end()
                                  : p.levels.find(level->first + 1);
        const auto t1 = static_cast<int32_t>(p.blocks.size()) - frequent_blocks(p);
        if (frequent != p.levels.end() && !frequent->second.empty() && t1 <= p.target) {
          from = &frequent->second;
        }
      }
      const BlockId b = from->front();
      from->erase(from->begin());
      if (from != &p.parked && p.blocks[b].cached() && cached_children(p, b) > 0) {
        p.parked.push_back(b);
        continue;
      }
      return b;
    }
  }

  // b (in use) turns frequent, and so do its recent ancestors, by their parent links; a
  // free one moves to its priority's frequent list by its stamp.
  static void make_frequent(Pool& p, BlockId b) {
    while (!p.blocks[b].frequent) {
      Block& d = p.blocks[b];
      d.frequent = true;
      for (auto& [level, list] : p.levels) {
        if (level % 2 == 1 || !queued_in(list, b)) continue;
        std::erase(list, b);
        insert_by_stamp(p, b, level + 1);
        break;
      }
      if (!linked(p, d)) return;
      b = d.parent;
    }
  }

  // b was just cached after `parent`: a ghost hit moves the target and makes it frequent.
  static void adaptive_cached(Pool& p, BlockId b, BlockId parent) {
    Block& d = p.blocks[b];
    int list = -1;
    for (int l : {0, 1}) {
      if (std::erase(p.ghosts[l], d.hash.lo) > 0) list = l;
    }
    const double b1 = std::max<size_t>(1, p.ghosts[0].size());
    const double b2 = std::max<size_t>(1, p.ghosts[1].size());
    const auto c = static_cast<double>(p.blocks.size());
    if (list == 0) p.target = std::min(c, p.target + std::max(1.0, b2 / b1));
    if (list == 1) p.target = std::max(0.0, p.target - std::max(1.0, b1 / b2));
    if (list >= 0) ++p.ghost_hits[list];
    d.frequent = false;
    d.parent = parent != kNoBlock && p.blocks[parent].cached() ? parent : kNoBlock;
    if (d.parent != kNoBlock) d.parent_epoch = p.blocks[parent].epoch;
    if (list >= 0) make_frequent(p, b);
  }

  // b just left the cache (`evicted`: its hash with it). A recent block becomes a ghost
  // only while |B1| may be above 0 (|B1| <= |T2|); then the ghost bounds |B1| <= |T2| and
  // |B1| + |B2| <= C; a parked parent whose last cached child this was is requeued.
  static void adaptive_uncached(Pool& p, BlockId b, bool evicted) {
    Block& d = p.blocks[b];
    const bool was_frequent = d.frequent;
    d.frequent = false;
    ++d.epoch;
    const int32_t t2 = frequent_blocks(p);
    if (evicted && (was_frequent || t2 > 0)) {
      for (auto& ghosts : p.ghosts) std::erase(ghosts, d.hash.lo);
      p.ghosts[was_frequent].push_back(d.hash.lo);
    }
    while (static_cast<int32_t>(p.ghosts[0].size()) > t2) p.ghosts[0].erase(p.ghosts[0].begin());
    while (p.ghosts[0].size() + p.ghosts[1].size() > p.blocks.size()) {
      std::vector<uint64_t>& from = p.ghosts[1].empty() ? p.ghosts[0] : p.ghosts[1];
      from.erase(from.begin());
    }
    if (linked(p, d) && cached_children(p, d.parent) == 0 && queued_in(p.parked, d.parent)) {
      std::erase(p.parked, d.parent);
      insert_by_stamp(p, d.parent, level_of(p.blocks[d.parent]));
    }
    d.parent = kNoBlock;
  }

  // reset_prefix_cache(): parked blocks go to the clean list's head; flags, links and
  // ghosts go; the target stays.
  static void adaptive_reset(Pool& p) {
    for (const BlockId b : std::exchange(p.parked, {})) p.clean.insert(p.clean.begin(), b);
    for (Block& d : p.blocks) {
      d.frequent = false;
      d.parent = kNoBlock;
      ++d.epoch;
    }
    p.ghosts[0].clear();
    p.ghosts[1].clear();
  }

  // Windowed eviction: an anchor content that left the anchor's device and host indexes
  // can never verify a windowed block cached after it, so every such block of every
  // windowed group (device and host) leaves the index, the most recently cached first.
  // The contents are those the anchor's pools lost since the last call (device ones
  // first), each checked as things are now.
  void bury_dead_windows() {
    if (anchor_ < 0) return;
    Group& anchor = groups_[anchor_];
    for (Pool* pool : {&anchor.device, &anchor.host}) {
      for (const std::pair<BlockHash, uint64_t>& dead : std::exchange(pool->dead, {})) {
        const uint64_t content = dead.second;
        auto holds = [&](const Pool& p) {  // no structured binding: clang 14 refuses those
          const auto it = p.index.find(key(dead.first));
          return it != p.index.end() && p.blocks[it->second].content == content;
        };
        if (holds(anchor.device) || holds(anchor.host)) continue;
        for (Group& g : groups_) {
          if (!g.windowed()) continue;
          for (Pool* p : {&g.device, &g.host}) {
            std::vector<BlockId> children;
            for (BlockId b = 0; b < static_cast<BlockId>(p->blocks.size()); ++b) {
              if (p->blocks[b].cached() && p->blocks[b].parent_content == content) {
                children.push_back(b);
              }
            }
            std::sort(children.begin(), children.end(), [&](BlockId a, BlockId b) {
              return p->blocks[a].cached_at > p->blocks[b].cached_at;
            });
            for (const BlockId b : children) drop_from_cache(*p, b);
          }
        }
      }
    }
  }

  // Enters the sequence's newly full computed blocks into every group's index, each held
  // entry once. The anchor goes first: a windowed group's blocks are cached after the
  // anchor's previous block as it is once cached (a standby takes its original's contents
  // key).
  void offer(Seq& s) {
    const int32_t full = (s.computed - s.drafts) / opts_.block_size;
    if (!opts_.enable_prefix_caching || s.kv_before_reset) {
      s.offered = full;
      return;
    }
    if (s.offered >= full) return;
    const std::vector<BlockHash> hashes = block_hashes(s, full);
    // The full groups first (so the anchor first), then the windowed ones, each in group
    // order; the events come in that order.
    std::vector<int32_t> order;
    for (const bool windowed : {false, true}) {
      for (int32_t g = 0; g < num_groups(); ++g) {
        if (kEmulateWindowedOfferBeforeAnchor || groups_[g].windowed() == windowed) {
          order.push_back(g);
        }
      }
      if (kEmulateWindowedOfferBeforeAnchor) break;
    }
    for (const int32_t g : order) {
      std::vector<uint64_t> anchor_keys;
      if (groups_[g].windowed()) {
        for (int32_t i = 0; i < full; ++i) {
          anchor_keys.push_back(content_of(groups_[anchor_].device, s.tables[anchor_].blocks[i]));
        }
      }
      const int32_t begin = std::max(s.offered, s.tables[g].first_held);
      cache_blocks(g, s, hashes, begin, full, anchor_keys);
      note_computed(g, s, hashes, begin, full);
    }
    s.offered = full;
  }

  KvCacheManager::Options opts_;
  std::vector<Group> groups_;
  int32_t anchor_ = -1;  // the first full-attention group
  std::map<SeqId, Seq> seqs_;
  int64_t next_arrival_ = 0;
  uint64_t step_ = 1;  // each take_step_ops() ends a step
  StepOps pending_;
  std::vector<std::pair<int32_t, BlockId>> deferred_device_;  // (group, block)
  std::vector<std::pair<int32_t, BlockId>> deferred_host_;
  Counters counters_;
  std::vector<std::vector<int64_t>> last_slots_;  // per group
  std::vector<KvEvent> events_;
  std::vector<Preemption> preemptions_;
  std::vector<SeqId> claim_releases_;
};

}  // namespace pagedkv::testing

#endif  // PAGEDKV_TESTS_SUPPORT_REFERENCE_MODEL_H_
