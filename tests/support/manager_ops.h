// File: tests/support/manager_ops.h
//
// The operation decoder and differential driver shared by the fuzzers (fuzz/), the property
// tests (tests/property_test.cc) and the corpus replay (tests/fuzz_regression_test.cc): one
// implementation, three front ends.
//
// run_manager_ops(bytes, profile) decodes the bytes into manager options and a sequence of
// operations, valid and invalid alike: add_sequence with shared, copied, random or extreme
// prompts and salts; match_prefix; allocate_slots and allocate_slots_or_preempt with normal
// and extreme counts; append_tokens; fork; free; release_claim; preempt in both modes;
// swap_in; "steps" that take the pending copies and swaps (the manager's clock advances by
// 1 ms per step); reset_prefix_cache; block tables in all three forms; and decode rounds.
// Options include the host tier, and sequences retention ranges with durations. An input whose
// first byte is kGroupsMarker runs a manager of 1 to 3 layer groups (full, sliding window,
// chunked local, each with pools of its own) and, in half of those runs, partial-block reuse;
// every group is then checked as below. A first byte of kSpeculativeMarker (then the options,
// or kGroupsMarker and the groups' options) adds speculative decoding: decode rounds give
// every running sequence drafts (allocate_draft_slots()), run the step and judge them
// (accept_draft()), and single draft calls with random arguments. Each operation runs
// on a KvCacheManager and on the ReferenceModel, and after each one the driver checks:
//   1. the same status code and returned value (hit length, slot mapping, copies, tables);
//   2. the same state: every sequence (state, tokens, computed count, every group's table),
//      every ref count, every free queue in order, which blocks are cached, the counters
//      (Stats and each group's GroupStats), slot mappings of every group, the KV events and
//      the preemption hooks;
//   3. check_invariants() is OK;
//   4. data flow: a simulated engine keeps one fingerprint per KV slot (device and host).
//      A step runs swap-out, demote and exchange copies, then copy-on-write copies, then
//      swap-in and promote copies (the order of StepOps, take_step_ops()), then writes each new
//      token's fingerprint into its slot. After every step, every token a sequence counts as
//      computed must read back its own fingerprint (a function of its prefix tokens and extra keys)
//      through its block table: a block shared with, or reused by, another sequence with different
//      content shows up here whatever the bookkeeping says.
//
// Engine protocol: the simulated engine computes every sequence it scheduled in a step, so it
// runs the step (copies, then writes) before it frees a sequence that got slots in the
// current step, as free()'s NOTE asks. Everything else, including preempting or forking a
// sequence scheduled in this step (which the manager must refuse or make safe), it does at
// any time. See docs/testing.md.
//
// Set PAGEDKV_OPS_TRACE=1 to print each operation as it runs (to replay a crash).
//
// Returns "" on success, else a report naming the first failed check and the operations
// that led to it. Deterministic: the same bytes give the same run.
#ifndef PAGEDKV_TESTS_SUPPORT_MANAGER_OPS_H_
#define PAGEDKV_TESTS_SUPPORT_MANAGER_OPS_H_

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "pagedkv/block_hash.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/kv_events.h"
#include "support/reference_model.h"

namespace pagedkv::testing {

// Which mix of operations and options the bytes decode to.
enum class OpProfile {
  kManager,  // real XXH3-128 hash, balanced operation mix
  kHash,     // an injected weak hash (forced collisions), adversarial token contents
};

// --- byte source ----------------------------------------------------------------------------

// Reads the fuzzer's bytes front to back; past the end it yields zeros.
class ByteSource {
 public:
  explicit ByteSource(std::span<const uint8_t> data) : data_(data) {}
  bool empty() const { return pos_ >= data_.size(); }
  uint8_t u8() { return pos_ < data_.size() ? data_[pos_++] : 0; }
  // In [lo, hi].
  int32_t range(int32_t lo, int32_t hi) {
    return lo + static_cast<int32_t>(u8() % static_cast<uint32_t>(hi - lo + 1));
  }
  // Usually in [0, typical_max]; one time in 16, an extreme value.
  int32_t count(int32_t typical_max) {
    const uint8_t b = u8();
    if (b < 240) return b % (typical_max + 1);
    static constexpr int32_t kExtremes[] = {
        -1, -2, INT32_MIN, INT32_MAX, 1 << 30, INT32_MAX - 1, -(1 << 30), 1 << 16};
    return kExtremes[b % 8];
  }

 private:
  std::span<const uint8_t> data_;
  size_t pos_ = 0;
};

// What the state and hand-off op runners share: the first failure they report (later ones
// follow from it) and the calls that report it.
class FirstFailure {
 protected:
  template <typename... Parts>
  bool fail(const Parts&... parts) {
    if (error_.empty()) error_ = absl::StrCat(parts..., "\n");
    return false;
  }
  // For `return fail_void(...);` in a void function.
  template <typename... Parts>
  void fail_void(const Parts&... parts) {
    fail(parts...);
  }

  std::string error_;  // "" while nothing failed
};

// --- weak hashes (OpProfile::kHash) -----------------------------------------------------------

namespace weak_hash {

inline uint64_t fnv(std::span<const TokenId> tokens) {
  uint64_t h = 1469598103934665603ull;
  for (const TokenId t : tokens) h = (h ^ static_cast<uint32_t>(t)) * 1099511628211ull;
  return h;
}
// Every block collides with every other.
inline BlockHash constant(const BlockHash*, std::span<const TokenId>, std::span<const uint64_t>) {
  return {};
}
// Only the block's first token counts.
inline BlockHash first_token(const BlockHash*, std::span<const TokenId> tokens,
                             std::span<const uint64_t>) {
  return {tokens.empty() ? 0 : static_cast<uint32_t>(tokens[0]), 0};
}
// Ignores the parent and the extra keys: equal blocks at different positions or under
// different salts collide.
inline BlockHash tokens_only(const BlockHash*, std::span<const TokenId> tokens,
                             std::span<const uint64_t>) {
  return {fnv(tokens), 0};
}
// The real hash without extra keys: salts and adapters collide.
inline BlockHash no_salt(const BlockHash* parent, std::span<const TokenId> tokens,
                         std::span<const uint64_t>) {
  return hash_block(parent, tokens, {});
}
// The real hash without the parent: equal blocks after different prefixes collide.
inline BlockHash no_parent(const BlockHash*, std::span<const TokenId> tokens,
                           std::span<const uint64_t> extra_keys) {
  return hash_block(nullptr, tokens, extra_keys);
}
// Two bits of the real hash.
inline BlockHash two_bits(const BlockHash* parent, std::span<const TokenId> tokens,
                          std::span<const uint64_t> extra_keys) {
  return {hash_block(parent, tokens, extra_keys).lo & 3, 0};
}
// Sum of tokens mod 3, chained: different contents with equal sums collide.
inline BlockHash token_sum(const BlockHash* parent, std::span<const TokenId> tokens,
                           std::span<const uint64_t>) {
  uint64_t sum = parent != nullptr ? parent->lo : 0;
  for (const TokenId t : tokens) sum += static_cast<uint32_t>(t);
  return {sum % 3, 0};
}

inline constexpr BlockHashFn kAll[] = {constant,  first_token, tokens_only, no_salt,
                                       no_parent, two_bits,    token_sum,   hash_block};
inline constexpr const char* kNames[] = {"constant",  "first_token", "tokens_only", "no_salt",
                                         "no_parent", "two_bits",    "token_sum",   "real"};

}  // namespace weak_hash

// --- the driver -----------------------------------------------------------------------------

// The engine-protocol guard described above (run the step before freeing a sequence with
// writes pending). Building with -DPAGEDKV_OPS_PROTOCOL_GUARDS=0 drops it, to study what
// goes wrong when an engine aborts a scheduled sequence mid-step.
#ifndef PAGEDKV_OPS_PROTOCOL_GUARDS
#define PAGEDKV_OPS_PROTOCOL_GUARDS 1
#endif
inline constexpr bool kProtocolGuards = PAGEDKV_OPS_PROTOCOL_GUARDS != 0;

class ManagerOpRunner {
 public:
  static constexpr int kMaxOps = 2000;
  // A first input byte that selects a run with layer groups (decode_groups()).
  static constexpr uint8_t kGroupsMarker = 252;
  // A first input byte that adds speculative decoding (no saved input starts with it).
  static constexpr uint8_t kSpeculativeMarker = 254;
  static constexpr int kMaxTokensPerSeq = 4096;

  // invariants_every: check_invariants() after every operation (1, the tests' and fuzzers'
  // setting) or after every N-th and at the end (the soak, scripts/soak.sh); the model
  // comparison and the data-flow check run after every operation and step either way.
  ManagerOpRunner(std::span<const uint8_t> data, OpProfile profile, int invariants_every = 1)
      : in_(data),
        profile_(profile),
        invariants_every_(std::max(1, invariants_every)),
        echo_(std::getenv("PAGEDKV_OPS_TRACE") != nullptr) {}

  std::string run() {
    decode_options();
    log("create ", describe_options());
    auto created = KvCacheManager::create(opts_);
    const auto expected = ReferenceModel::validate(opts_);
    if (created.status().code() != expected) {
      return fail("create: got ", created.status(), ", model expects ", code_name(expected));
    }
    if (!created.ok()) return "";
    impl_.emplace(*std::move(created));
    model_.emplace(opts_);
    bs_ = opts_.block_size;
    num_groups_ = impl_->num_groups();
    if (num_groups_ != model_->num_groups()) {
      return fail("num_groups() ", num_groups_, ", model expects ", model_->num_groups());
    }
    for (int32_t g = 0; g < num_groups_; ++g) {
      const LayerGroup& spec = model_->layer_group(g);
      device_mem_.emplace_back(static_cast<size_t>(spec.num_blocks) * bs_, kGarbage);
      host_mem_.emplace_back(static_cast<size_t>(spec.num_host_blocks) * bs_, kGarbage);
    }
    for (int op = 0; op < kMaxOps && !in_.empty() && error_.empty(); ++op) {
      --until_invariants_;
      run_one();
      if (error_.empty()) check_all();
    }
    until_invariants_ = 0;       // the final state is always checked
    if (error_.empty()) step();  // the last step's writes must land too
    return error_;
  }

  int num_ops() const { return num_ops_; }
  // The manager's counters at the end of the run (zeros if creation failed), to show that a
  // run reached copy-on-write, swapping, prefix hits and eviction.
  KvCacheManager::Stats stats() const {
    return impl_.has_value() ? impl_->stats() : KvCacheManager::Stats{};
  }
  // The layer groups of the run's manager (none if creation failed) and their counters at
  // the end, to show that runs reached windowed releases and hits, per group.
  struct GroupTotals {
    LayerGroup group;
    KvCacheManager::GroupStats stats;
  };
  std::vector<GroupTotals> group_totals() const {
    std::vector<GroupTotals> out;
    for (int32_t g = 0; impl_.has_value() && g < impl_->num_groups(); ++g) {
      out.push_back({*impl_->layer_group(g), *impl_->group_stats(g)});
    }
    return out;
  }
  bool grouped() const { return grouped_; }

 private:
  static constexpr uint64_t kGarbage = 0;
  using Code = absl::StatusCode;

  struct PendingWrite {
    SeqId seq;
    int32_t group;
    int64_t slot;
    uint64_t value;
  };

  class RecordingHooks : public PreemptionHooks {
   public:
    void on_preempt(SeqId victim, PreemptionMode mode) override { calls.push_back({victim, mode}); }
    void on_claim_released(SeqId seq) override { claim_releases.push_back(seq); }
    std::vector<Preemption> calls;
    std::vector<SeqId> claim_releases;
  };

  // --- reporting ---

  template <typename... Parts>
  void log(const Parts&... parts) {
    std::ostringstream line;
    (line << ... << parts);
    trace_.push_back(line.str());
    if (trace_.size() > 60) trace_.pop_front();
    if (echo_) std::fprintf(stderr, "op: %s\n", trace_.back().c_str());
  }

  template <typename... Parts>
  std::string fail(const Parts&... parts) {
    if (!error_.empty()) return error_;
    std::ostringstream out;
    out << "FAILED: ";
    (out << ... << parts);
    out << "\nlast operations (oldest first):\n";
    for (const std::string& line : trace_) out << "  " << line << "\n";
    error_ = out.str();
    return error_;
  }

  static std::string code_name(Code c) { return absl::StatusCodeToString(c); }

  template <typename T>
  static std::string list(const std::vector<T>& v) {
    std::ostringstream out;
    out << "[";
    for (size_t i = 0; i < v.size(); ++i) out << (i ? " " : "") << v[i];
    out << "]";
    return out.str();
  }
  template <typename T>
  static std::string list(std::span<const T> v) {
    return list(std::vector<T>(v.begin(), v.end()));
  }

  bool expect_code(const char* what, const absl::Status& got, Code expected) {
    if (got.code() == expected) return true;
    fail(what, ": got ", got, ", model expects ", code_name(expected));
    return false;
  }

  // --- decoding ---

  void decode_options() {
    // A first byte of kGroupsMarker selects a run with layer groups, decoded from the bytes
    // after the one-group options (decode_groups()); no saved input starts with it, and
    // before it meant one device block, which other values give too.
    uint8_t first = in_.u8();
    speculative_ = first == kSpeculativeMarker;
    if (speculative_) first = in_.u8();
    grouped_ = first == kGroupsMarker;
    const uint8_t nb = grouped_ ? in_.u8() : first;
    // Without groups: one full-attention group of these pools (from full_attention()).
    const int32_t num_blocks =
        nb < 248 ? 1 + nb % 24 : std::array{0, -1, 48, 64, 1, 2, 3, 5}[nb % 8];
    const uint8_t b = in_.u8();
    opts_.block_size = b < 248 ? std::array{1, 2, 3, 4, 5, 7, 8, 16}[b % 8]
                               : std::array{0, -1, 32, 1, 2, 1, 3, 6}[b % 8];
    if (profile_ == OpProfile::kHash && b < 248) opts_.block_size = 1 + b % 4;
    const uint8_t h = in_.u8();
    const int32_t num_host_blocks = h < 250 ? h % 20 : -1;
    const uint8_t m = in_.u8();
    opts_.max_model_len = m < 248 ? (m % 16 < 12 ? 1 << 20 : std::array{1, 7, 40, 100}[m % 4])
                                  : std::array{0, -1, INT32_MAX, 1 << 20, 3, 1 << 20, 64, 5}[m % 8];
    const uint8_t w = in_.u8();
    opts_.watermark_blocks = w < 160 ? 0 : w < 250 ? 1 + w % 3 : w < 253 ? -1 : num_blocks;
    const uint8_t f = in_.u8();
    opts_.enable_prefix_caching = (f & 7) != 0;
    opts_.preemption_mode = (f & 8) ? PreemptionMode::kSwap : PreemptionMode::kRecompute;
    hash_index_ = 7;  // real
    if (profile_ == OpProfile::kHash) hash_index_ = (f >> 4) % 8;
    opts_.hash_fn = weak_hash::kAll[hash_index_];
    if (profile_ == OpProfile::kManager) policy_ = std::max(0, (f >> 4) % 8 - 2);
    opts_.victim_policy = make_policy(policy_);
    // A base text that shared prompts take prefixes of.
    const uint8_t seed = in_.u8();
    const int alphabet = profile_ == OpProfile::kHash ? 2 : 4;
    uint32_t lcg = seed;
    for (int i = 0; i < 96; ++i) {
      lcg = lcg * 1664525u + 1013904223u;
      base_.push_back(static_cast<TokenId>((lcg >> 16) % alphabet));
    }
    // The host tier: off, on where valid (twice as likely), or on regardless (create must
    // refuse it then).
    const int host_mode = h < 250 ? (h / 20) % 4 : 0;
    opts_.enable_host_cache =
        host_mode == 3 || (host_mode != 0 && num_host_blocks > 0 && opts_.enable_prefix_caching);
    // Half of the runs demote only reused blocks (the base text's seed picks: no byte of
    // the saved inputs changes meaning).
    opts_.host_admission = seed % 2 == 1 ? HostAdmission::kReused : HostAdmission::kAll;
    // Likewise half of them evict by the adaptive policy.
    opts_.eviction_policy = seed / 2 % 2 == 1 ? EvictionPolicy::kAdaptive : EvictionPolicy::kLru;
    opts_.event_sink = &events_;
    opts_.preemption_hooks = &hooks_;
    opts_.clock = [this] { return now_ms_; };
    if (grouped_) {
      decode_groups(w, host_mode);
    } else {
      opts_.layer_groups = full_attention(num_blocks, num_host_blocks);
    }
  }

  // Layer groups: 1 to 3 of them, full, sliding window or chunked local, with windows and
  // chunks below, at and above the block size (multiples of it and not), pools of their own
  // sizes (host pools too), and now and then an invalid group or options create() must
  // refuse: a window of 0 or below, a full group with a window, pools of 0 or -1 blocks,
  // no full group with prefix caching.
  void decode_groups(uint8_t w, int host_mode) {
    const int32_t bs = opts_.block_size;
    const uint8_t c = in_.u8();
    const int n = 1 + c % 3;
    for (int i = 0; i < n; ++i) {
      const uint8_t kb = in_.u8();
      const uint8_t wb = in_.u8();
      const uint8_t pb = in_.u8();
      const uint8_t hb = in_.u8();
      LayerGroup g;
      g.kind = std::array{AttentionKind::kFull, AttentionKind::kSlidingWindow,
                          AttentionKind::kChunkedLocal}[kb % 3];
      if (g.kind != AttentionKind::kFull) {
        g.window = wb < 250 ? std::max(1, std::array{1, 2, 3, bs - 1, bs, bs + 1, 2 * bs,
                                                     2 * bs + 1, 3 * bs, 4 * bs, 5, 13}[wb % 12])
                            : std::array{0, -1, INT32_MIN, 1 << 20, 0, -1}[wb % 6];
      } else if (wb >= 252) {
        g.window = 1;  // invalid for a full group
      }
      g.num_blocks = pb < 250 ? 1 + pb % 24 : std::array{0, -1, 48, 64, 2, 3}[pb % 6];
      g.num_host_blocks = hb < 254 ? hb % 20 : -1;
      opts_.layer_groups.push_back(g);
    }
    // With prefix caching a windowed group needs a full one beside it: usually make one
    // full, now and then leave create() to refuse the groups.
    const bool has_full =
        std::any_of(opts_.layer_groups.begin(), opts_.layer_groups.end(),
                    [](const LayerGroup& g) { return g.kind == AttentionKind::kFull; });
    if (!has_full && opts_.enable_prefix_caching && (c >> 3) % 16 != 0) {
      LayerGroup& g = opts_.layer_groups[(c >> 7) % n];
      g.kind = AttentionKind::kFull;
      g.window = 0;
    }
    const int32_t first_blocks = opts_.layer_groups[0].num_blocks;
    opts_.watermark_blocks = w < 160 ? 0 : w < 250 ? 1 + w % 3 : w < 253 ? -1 : first_blocks;
    const bool every_host = std::all_of(opts_.layer_groups.begin(), opts_.layer_groups.end(),
                                        [](const LayerGroup& g) { return g.num_host_blocks > 0; });
    opts_.enable_host_cache =
        host_mode == 3 || (host_mode != 0 && every_host && opts_.enable_prefix_caching);
    // Options one-group runs do not decode (their bytes are fixed by saved inputs): bit 0
    // partial-block reuse; bits 1 to 7 the windowed groups' checkpoints: the defaults
    // (whose spacings of 1,024 tokens and up no run reaches), none, or every 2 or 3 blocks
    // and 1 token (1 to 4 levels), now and then a level count create() must refuse.
    const uint8_t x = in_.u8();
    opts_.enable_partial_block_reuse = (x & 1) != 0;
    switch ((x >> 1) % 4) {
      case 0:
        break;
      case 1:
        opts_.window_checkpoint_tokens = 0;
        break;
      default:
        opts_.window_checkpoint_tokens = ((x >> 1) % 4) * bs + 1;
        opts_.window_checkpoint_levels = 1 + (x >> 3) % 4;
        break;
    }
    if ((x >> 3) == 31) opts_.window_checkpoint_levels = 17;
  }

  // Victim policies other than the default, including unhelpful ones: each is a pure
  // function of what it is shown, so the manager and the model get the same answers.
  static VictimPolicy make_policy(int kind) {
    switch (kind) {
      case 1:  // gives up
        return [](std::span<const SequenceInfo>, SeqId) { return std::nullopt; };
      case 2:  // the earliest arrival, by swap even when the host pool is too small
        return [](std::span<const SequenceInfo> running, SeqId) {
          return std::optional<Preemption>({running.front().id, PreemptionMode::kSwap});
        };
      case 3:  // the requester itself
        return [](std::span<const SequenceInfo>, SeqId requester) {
          return std::optional<Preemption>({requester, PreemptionMode::kRecompute});
        };
      case 4:  // a sequence that does not exist
        return [](std::span<const SequenceInfo>, SeqId) {
          return std::optional<Preemption>({-424242, PreemptionMode::kRecompute});
        };
      case 5:  // the one holding the most blocks
        return [](std::span<const SequenceInfo> running, SeqId) {
          const SequenceInfo* best = &running.front();
          for (const SequenceInfo& s : running) {
            if (s.num_blocks > best->num_blocks) best = &s;
          }
          return std::optional<Preemption>({best->id, PreemptionMode::kRecompute});
        };
      default:
        return nullptr;  // the manager's default policy
    }
  }

  std::string describe_options() const {
    std::ostringstream out;
    out << "block_size=" << opts_.block_size << " max_model_len=" << opts_.max_model_len
        << " watermark=" << opts_.watermark_blocks << " caching=" << opts_.enable_prefix_caching
        << " mode=" << (opts_.preemption_mode == PreemptionMode::kSwap ? "swap" : "recompute")
        << " hash=" << weak_hash::kNames[hash_index_] << " policy=" << policy_
        << " host_cache=" << opts_.enable_host_cache
        << " partial_reuse=" << opts_.enable_partial_block_reuse;
    for (const LayerGroup& g : opts_.layer_groups) {
      out << " group(" << attention_kind_name(g.kind) << " window=" << g.window
          << " blocks=" << g.num_blocks << " host=" << g.num_host_blocks << ")";
    }
    return out.str();
  }

  // A sequence id: usually an existing one, else one of a few small ids or an extreme one.
  SeqId pick_id() {
    const uint8_t b = in_.u8();
    const auto& seqs = model_->sequences();
    if ((b & 3) != 0 && !seqs.empty()) {
      auto it = seqs.begin();
      std::advance(it, (b >> 2) % seqs.size());
      return it->first;
    }
    const int v = (b >> 1) % 10;
    if (v == 8) return std::numeric_limits<SeqId>::min();
    if (v == 9) return -1;
    return v;
  }

  TokenId pick_token() {
    const uint8_t b = in_.u8();
    if (profile_ == OpProfile::kHash) {
      if (b < 224) return b % 2;
      return std::array{INT32_MIN, INT32_MAX, -1, 0, 1, 2, 1 << 16, 7}[b % 8];
    }
    if (b < 248) return b % 6;
    return std::array{INT32_MIN, INT32_MAX, -1, 0, 1, 2, 1 << 16, 7}[b % 8];
  }

  std::vector<TokenId> make_prompt() {
    std::vector<TokenId> prompt;
    uint8_t mode = in_.u8() % 6;
    // With layer groups, prompts that share cached prefixes matter most (hits across
    // groups): random tokens become a freed prompt again.
    if (grouped_ && mode == 3) mode = 5;
    if (mode == 5 && !freed_.empty()) {  // a freed prompt again: its blocks may be in the tier
      const std::vector<TokenId>& t = freed_[in_.u8() % freed_.size()];
      prompt.assign(t.begin(), t.begin() + 1 + in_.u8() % t.size());
      for (int i = in_.range(0, 1); i > 0; --i) prompt.push_back(pick_token());
    } else if (mode <= 1 || mode == 5) {  // a prefix of the shared base text, plus a short tail
      prompt.assign(base_.begin(), base_.begin() + in_.range(1, 64));
      for (int i = in_.range(0, 3); i > 0; --i) prompt.push_back(pick_token());
    } else if (mode == 2) {  // a prefix of a live sequence's tokens, plus a tail
      const auto& seqs = model_->sequences();
      if (!seqs.empty()) {
        auto it = seqs.begin();
        std::advance(it, in_.u8() % seqs.size());
        const auto& t = it->second.tokens;
        prompt.assign(t.begin(), t.begin() + 1 + in_.u8() % t.size());
      }
      for (int i = in_.range(0, 2); i > 0; --i) prompt.push_back(pick_token());
    } else if (mode == 3) {  // random tokens, possibly none
      for (int i = in_.range(0, 24); i > 0; --i) prompt.push_back(pick_token());
    } else {  // a block-sized pattern repeated: equal blocks after different prefixes
      std::vector<TokenId> unit;
      for (int i = in_.range(1, 4); i > 0; --i) unit.push_back(pick_token());
      for (int r = in_.range(1, 12); r > 0; --r)
        prompt.insert(prompt.end(), unit.begin(), unit.end());
    }
    return prompt;
  }

  std::vector<uint64_t> make_extra_keys() {
    switch (in_.u8() % 16) {
      case 11:
        return {1};
      case 12:
        return {2};
      case 13:
        return {1, 2};
      case 14:
        return {2, 1};
      case 15:
        return {std::numeric_limits<uint64_t>::max()};
      default:
        return {};
    }
  }

  // --- data flow ---

  static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }

  // fp[t]: a fingerprint of the KV of token t, a function of tokens [0, t] and extra keys.
  static std::vector<uint64_t> fingerprints(const ReferenceModel::Seq& s) {
    uint64_t h = mix(s.extra_keys.size());
    for (const uint64_t k : s.extra_keys) h = mix(h ^ k);
    std::vector<uint64_t> fp;
    fp.reserve(s.tokens.size());
    for (const TokenId t : s.tokens) {
      h = mix(h ^ static_cast<uint32_t>(t));
      fp.push_back(h | 1);  // never kGarbage
    }
    return fp;
  }

  bool has_pending_writes(SeqId id) const {
    return std::any_of(writes_.begin(), writes_.end(),
                       [&](const PendingWrite& w) { return w.seq == id; });
  }

  // The engine runs the step: takes the pending ops, copies, writes, then checks contents.
  void step() {
    log("step");
    ++num_ops_;
    const StepOps ops = impl_->take_step_ops();
    const StepOps model_ops = model_->take_step_ops();
    if (ops.swap_out != model_ops.swap_out || ops.swap_in != model_ops.swap_in ||
        ops.demote != model_ops.demote || ops.promote != model_ops.promote ||
        ops.exchange != model_ops.exchange || ops.copy_on_write != model_ops.copy_on_write) {
      fail("take_step_ops: got out ", ops_string(ops.swap_out), " in ", ops_string(ops.swap_in),
           " demote ", ops_string(ops.demote), " promote ", ops_string(ops.promote), " exchange ",
           ops_string(ops.exchange), " copy_on_write ", ops_string(ops.copy_on_write),
           ", model expects out ", ops_string(model_ops.swap_out), " in ",
           ops_string(model_ops.swap_in), " demote ", ops_string(model_ops.demote), " promote ",
           ops_string(model_ops.promote), " exchange ", ops_string(model_ops.exchange),
           " copy_on_write ", ops_string(model_ops.copy_on_write));
      return;
    }
    if (!valid_batches(ops)) return;
    // Each copy moves K/V within its group's pools (BlockCopy::group).
    using Mem = std::vector<std::vector<uint64_t>>;
    auto copy = [&](Mem& from, Mem& to, const BlockCopy& op) {
      for (int32_t i = 0; i < op.num_tokens; ++i) {
        to[op.group][static_cast<size_t>(op.dst) * bs_ + i] =
            from[op.group][static_cast<size_t>(op.src) * bs_ + i];
      }
    };
    for (const BlockCopy& op : ops.swap_out) copy(device_mem_, host_mem_, op);
    for (const BlockCopy& op : ops.demote) copy(device_mem_, host_mem_, op);
    for (const BlockCopy& op : ops.exchange) {
      for (int32_t i = 0; i < op.num_tokens; ++i) {
        std::swap(device_mem_[op.group][static_cast<size_t>(op.src) * bs_ + i],
                  host_mem_[op.group][static_cast<size_t>(op.dst) * bs_ + i]);
      }
    }
    for (const BlockCopy& op : ops.copy_on_write) copy(device_mem_, device_mem_, op);
    for (const BlockCopy& op : ops.swap_in) copy(host_mem_, device_mem_, op);
    for (const BlockCopy& op : ops.promote) copy(host_mem_, device_mem_, op);
    for (const PendingWrite& w : writes_) device_mem_[w.group][w.slot] = w.value;
    writes_.clear();
    ++now_ms_;  // time passes between steps: retention durations expire
    check_all();
    check_contents();
  }

  // Each list is one batch whose ops may run concurrently (KvStorage refuses one that
  // breaks these): no block of a group written twice, and no block a copy-on-write reads
  // is written.
  bool valid_batches(const StepOps& ops) {
    auto unique = [](const std::vector<BlockCopy>& ops, auto side) {
      std::vector<std::pair<int32_t, BlockId>> ids;
      for (const BlockCopy& op : ops) ids.push_back({op.group, op.*side});
      std::sort(ids.begin(), ids.end());
      return std::adjacent_find(ids.begin(), ids.end()) == ids.end();
    };
    const std::pair<const char*, const std::vector<BlockCopy>*> lists[] = {
        {"copy_on_write", &ops.copy_on_write},
        {"swap_out", &ops.swap_out},
        {"swap_in", &ops.swap_in},
        {"demote", &ops.demote},
        {"promote", &ops.promote},
        {"exchange", &ops.exchange}};
    for (const auto& [name, ops] : lists) {
      if (!unique(*ops, &BlockCopy::dst)) {
        fail("step: the ", name, " batch writes a block twice: ", ops_string(*ops));
        return false;
      }
    }
    if (!unique(ops.exchange, &BlockCopy::src)) {
      fail("step: the exchange batch names a device block twice: ", ops_string(ops.exchange));
      return false;
    }
    for (const BlockCopy& op : ops.copy_on_write) {
      for (const BlockCopy& other : ops.copy_on_write) {
        if (op.group == other.group && op.src == other.dst) {
          fail("step: copy-on-write reads group ", op.group, " block ", op.src,
               ", which the batch writes");
          return false;
        }
      }
    }
    return true;
  }

  static std::string ops_string(const std::vector<BlockCopy>& ops) {
    std::ostringstream out;
    out << "[";
    for (const BlockCopy& op : ops) {
      out << " " << op.src << "->" << op.dst << "/" << op.num_tokens;
      if (op.group != 0) out << "@g" << op.group;
    }
    out << " ]";
    return out.str();
  }

  // Every computed token in a held entry of every group reads back its own fingerprint
  // (a windowed group's released entries hold nothing the sequence reads).
  void check_contents() {
    if (!error_.empty()) return;
    for (const auto& [id, s] : model_->sequences()) {
      const std::vector<uint64_t> fp = fingerprints(s);
      const bool swapped = s.state == SequenceState::kSwapped;
      for (int32_t g = 0; g < num_groups_; ++g) {
        const ReferenceModel::Table& t = s.tables[g];
        const std::vector<uint64_t>& mem = swapped ? host_mem_[g] : device_mem_[g];
        for (int32_t pos = t.first_held * bs_; pos < s.computed; ++pos) {
          const BlockId b = swapped ? t.host[pos / bs_ - t.first_held] : t.blocks[pos / bs_];
          const uint64_t got = mem[static_cast<size_t>(b) * bs_ + pos % bs_];
          if (got != fp[pos]) {
            fail("data flow: seq ", id, " token ", pos, " (group ", g, " ",
                 swapped ? "host" : "device", " block ", b, " offset ", pos % bs_,
                 ") does not hold its own KV: ",
                 got == kGarbage ? "never written" : "another prefix's KV or stale data");
            return;
          }
        }
      }
    }
  }

  // --- operations ---

  void run_one() {
    ++num_ops_;
    const uint8_t op = in_.u8() % 32;
    if (op < 3) return op_add();
    if (op < 8) return op_admit();
    if (op < 9) return op_match();
    if (op < 12) return op_allocate(/*or_preempt=*/false);
    if (op < 14) return op_allocate(/*or_preempt=*/true);
    if (op < 16) return op_append();
    if (op < 18) return op_fork();
    if (op < 20) return op_free();
    if (op < 22) return op_preempt();
    if (op < 24) return op_swap_in();
    if (op < 27) {
      in_.u8();  // chose the order of the two old take calls; read so saved inputs decode alike
      return step();
    }
    if (op < 28) {
      log("reset_prefix_cache");
      impl_->reset_prefix_cache();
      model_->reset_prefix_cache();
      return;
    }
    if (op < 29) return op_tables();
    if (op < 30) return speculative_ ? op_speculative_round() : op_decode_round();
    if (op < 31) return op_batched_decode_round();
    if (speculative_ && (in_.u8() & 1) != 0) return op_draft_call();
    return op_release_claim();
  }

  void op_release_claim() {
    const SeqId id = pick_id();
    log("release_claim(", id, ")");
    const Code expected = model_->release_claim(id);
    expect_code("release_claim", impl_->release_claim(id), expected);
  }

  void op_add() {
    // Mostly a fresh id; sometimes one in use (AlreadyExists) or a small or extreme one.
    const SeqId id = in_.u8() % 4 != 0 ? next_fresh_id_++ : pick_id();
    const std::vector<TokenId> prompt = make_prompt();
    SequenceOptions so;
    so.extra_keys = make_extra_keys();
    const uint8_t p = in_.u8();
    so.priority = p < 250 ? p % 3 - 1 : std::array{INT32_MIN, INT32_MAX}[p % 2];
    so.retention = make_retention();
    std::ostringstream retention;
    for (const RetentionRange& r : so.retention) {
      retention << " [" << r.begin << ", " << r.end << ") p" << r.priority << " " << r.duration_ms
                << "ms";
    }
    log("add_sequence(", id, ", ", prompt.size(), " tokens ", list(prompt), ", priority ",
        so.priority, ", keys ", list(so.extra_keys), ", retention", retention.str(), ")");
    const Code expected =
        model_->add_sequence(id, prompt, so.priority, so.extra_keys, so.retention);
    expect_code("add_sequence", impl_->add_sequence(id, prompt, so), expected);
    last_added_ = expected == Code::kOk ? id : -12345;
  }

  // Usually none; else one or two ranges over the first blocks, now and then invalid.
  std::vector<RetentionRange> make_retention() {
    const uint8_t r = in_.u8();
    if (r < 192) return {};
    std::vector<RetentionRange> out;
    for (int i = 0; i <= r % 2; ++i) {
      const uint8_t a = in_.u8();
      const uint8_t b = in_.u8();
      RetentionRange range;
      range.begin = a < 250 ? (a % 4) * bs_ : -1;
      range.end = b % 8 == 7 ? std::numeric_limits<int32_t>::max() : range.begin + (b % 4) * bs_;
      range.priority = std::array{0, 20, 35, 36, 90, 100, 101, -1}[(a >> 2) % 8];
      range.duration_ms = std::array{0, 0, 1, 2, 3, 5, 0, -1}[(b >> 3) % 8];
      out.push_back(range);
    }
    return out;
  }

  // What an engine does with a new request: add it, claim its cached prefix, then reserve
  // slots for the rest of the prompt.
  void op_admit() {
    op_add();
    const ReferenceModel::Seq* s = model_->find(last_added_);
    if (!error_.empty() || s == nullptr || s->state != SequenceState::kWaiting) return;
    match(last_added_);
    s = model_->find(last_added_);
    if (!error_.empty() || s == nullptr) return;
    allocate(last_added_, static_cast<int32_t>(s->tokens.size()) - s->computed, 0,
             /*or_preempt=*/(in_.u8() & 1) != 0);
  }

  void op_match() { match(pick_id()); }

  void match(SeqId id) {
    log("match_prefix(", id, ")");
    const auto [code, hit] = model_->match_prefix(id);
    const auto got = impl_->match_prefix(id);
    if (!expect_code("match_prefix", got.status(), code)) return;
    if (got.ok() && *got != hit)
      fail("match_prefix(", id, "): got ", *got, ", model expects ", hit);
    if (got.ok() && hit > 0) log("  -> hit ", hit, " tokens");
  }

  int32_t pick_new_tokens(SeqId id) {
    const ReferenceModel::Seq* s = model_->find(id);
    const int32_t remaining =
        s == nullptr ? 1 : static_cast<int32_t>(s->tokens.size()) - s->computed;
    switch (in_.u8() % 6) {
      case 0:
      case 1:
        return remaining;
      case 2:
        return 1;
      case 3:
        return std::min(remaining, 1 + in_.u8() % 4);
      case 4:
        return 0;
      default:
        return in_.count(40);
    }
  }

  int32_t pick_lookahead() {
    const uint8_t b = in_.u8();
    if (b < 192) return 0;
    if (b < 248) return b % 5;
    return std::array{
        -1, INT32_MAX, INT32_MAX - 1, INT32_MAX - 15, 1 << 30, INT32_MIN, 64, 7}[b % 8];
  }

  // The engine writes each new token's K/V into its slot of every group (slots[g]).
  void record_writes(SeqId id, const ReferenceModel::Seq& before_state, int32_t computed_before,
                     const std::vector<std::vector<int64_t>>& slots) {
    const ReferenceModel::Seq* s = model_->find(id);
    const std::vector<uint64_t> fp = fingerprints(s != nullptr ? *s : before_state);
    for (int32_t g = 0; g < static_cast<int32_t>(slots.size()); ++g) {
      for (size_t i = 0; i < slots[g].size(); ++i) {
        writes_.push_back({id, g, slots[g][i], fp[computed_before + i]});
      }
    }
  }

  // The model's slots of every group from its last successful allocation.
  std::vector<std::vector<int64_t>> model_slots() const {
    std::vector<std::vector<int64_t>> slots;
    for (int32_t g = 0; g < num_groups_; ++g) slots.push_back(model_->last_slots(g));
    return slots;
  }

  void op_allocate(bool or_preempt) {
    const SeqId id = pick_id();
    const int32_t n = pick_new_tokens(id);
    const int32_t lookahead = pick_lookahead();
    allocate(id, n, lookahead, or_preempt);
  }

  void allocate(SeqId id, int32_t n, int32_t lookahead, bool or_preempt) {
    if (!error_.empty()) return;
    const char* name = or_preempt ? "allocate_slots_or_preempt" : "allocate_slots";
    log(name, "(", id, ", ", n, ", lookahead ", lookahead, ")");
    const ReferenceModel::Seq* before = model_->find(id);
    const ReferenceModel::Seq before_copy = before != nullptr ? *before : ReferenceModel::Seq{};
    const int32_t computed_before = before != nullptr ? before->computed : 0;
    const auto [code, slots] = or_preempt ? model_->allocate_slots_or_preempt(id, n, lookahead)
                                          : model_->allocate_slots(id, n, lookahead);
    const auto got = or_preempt ? impl_->allocate_slots_or_preempt(id, n, lookahead)
                                : impl_->allocate_slots(id, n, lookahead);
    if (!expect_code(name, got.status(), code)) return;
    if (!got.ok()) return;
    const std::vector<int64_t> got_slots(got->begin(), got->end());
    if (got_slots != slots) {
      fail(name, "(", id, "): slot mapping ", list(got_slots), ", model expects ", list(slots));
      return;
    }
    const std::vector<std::vector<int64_t>> expected = model_slots();
    for (int32_t g = 0; g < num_groups_; ++g) {
      const std::span<const int64_t> mine = *impl_->slot_mapping(g);
      if (std::vector<int64_t>(mine.begin(), mine.end()) != expected[g]) {
        fail(name, "(", id, "): slot_mapping(", g, ") ", list(mine), ", model expects ",
             list(expected[g]));
        return;
      }
    }
    record_writes(id, before_copy, computed_before, expected);
  }

  void op_append() {
    const SeqId id = pick_id();
    std::vector<TokenId> tokens;
    const uint8_t b = in_.u8();
    const int n = b < 250 ? b % 5 : 50;
    for (int i = 0; i < n; ++i) tokens.push_back(pick_token());
    log("append_tokens(", id, ", ", list(tokens), ")");
    const Code expected = model_->append_tokens(id, tokens);
    expect_code("append_tokens", impl_->append_tokens(id, tokens), expected);
  }

  void op_fork() {
    const SeqId parent = pick_id();
    const SeqId child = in_.u8() % 4 != 0 ? next_fresh_id_++ : pick_id();
    log("fork(", parent, ", ", child, ")");
    const Code expected = model_->fork(parent, child);
    expect_code("fork", impl_->fork(parent, child), expected);
  }

  void op_free() {
    const SeqId id = pick_id();
    // An open manager bug (reference_model.h, kAvoidFreeOfSwappedWithReleasedEntries)
    // makes this call undefined behaviour: skip it until it is fixed.
    if (const ReferenceModel::Seq* s = model_->find(id);
        s != nullptr && model_->free_meets_known_bug(*s)) {
      log("free(", id, ") skipped: known bug");
      return;
    }
    if (kProtocolGuards && has_pending_writes(id)) step();
    if (!error_.empty()) return;
    log("free(", id, ")");
    if (const ReferenceModel::Seq* s = model_->find(id)) {
      freed_.push_back(s->tokens);
      if (freed_.size() > 8) freed_.pop_front();
    }
    const Code expected = model_->free(id);
    expect_code("free", impl_->free(id), expected);
  }

  void op_preempt() {
    const SeqId id = pick_id();
    const PreemptionMode mode = (in_.u8() & 1) ? PreemptionMode::kSwap : PreemptionMode::kRecompute;
    if (!error_.empty()) return;
    log("preempt(", id, ", ", mode == PreemptionMode::kSwap ? "swap" : "recompute", ")");
    const Code expected = model_->preempt(id, mode);
    expect_code("preempt", impl_->preempt(id, mode), expected);
  }

  void op_swap_in() {
    const SeqId id = pick_id();
    log("swap_in(", id, ")");
    const Code expected = model_->swap_in(id);
    expect_code("swap_in", impl_->swap_in(id), expected);
  }

  // One engine iteration: every running sequence gets a token and a slot (preempting if
  // needed), then the step runs.
  void op_decode_round() {
    log("decode round");
    std::vector<SeqId> running;
    for (const SequenceInfo& info : impl_->running_sequences()) running.push_back(info.id);
    for (const SeqId id : running) {
      const ReferenceModel::Seq* s = model_->find(id);
      if (s == nullptr || s->state != SequenceState::kRunning || !error_.empty()) continue;
      const int32_t missing = static_cast<int32_t>(s->tokens.size()) - s->computed;
      if (missing == 0 && static_cast<int32_t>(s->tokens.size()) < kMaxTokensPerSeq) {
        const TokenId token = pick_token();
        log("append_tokens(", id, ", [", token, "])");
        const Code expected = model_->append_tokens(id, std::span<const TokenId>(&token, 1));
        if (!expect_code("append_tokens", impl_->append_tokens(id, {&token, 1}), expected)) return;
      }
      const ReferenceModel::Seq* now = model_->find(id);
      const int32_t n = std::min(1, static_cast<int32_t>(now->tokens.size()) - now->computed);
      allocate(id, n, 0, /*or_preempt=*/true);
    }
    if (error_.empty()) step();
  }

  // A speculative engine iteration: every running sequence gets its next token and 1 to 4
  // drafts (allocate_draft_slots(), whose slots the engine writes), the step runs, then each
  // sequence's drafts are judged (accept_draft(): usually a count in range, now and then
  // one out of it).
  void op_speculative_round() {
    log("speculative round");
    std::vector<SeqId> drafted;
    for (const SequenceInfo& info : impl_->running_sequences()) {
      const ReferenceModel::Seq* s = model_->find(info.id);
      if (s == nullptr || s->state != SequenceState::kRunning || !error_.empty()) continue;
      if (s->tokens.size() == static_cast<size_t>(s->computed) &&
          static_cast<int32_t>(s->tokens.size()) < kMaxTokensPerSeq) {
        const TokenId token = pick_token();
        log("append_tokens(", info.id, ", [", token, "])");
        const Code expected = model_->append_tokens(info.id, std::span<const TokenId>(&token, 1));
        if (!expect_code("append_tokens", impl_->append_tokens(info.id, {&token, 1}), expected)) {
          return;
        }
      }
      const ReferenceModel::Seq* now = model_->find(info.id);
      std::vector<TokenId> draft(1 + in_.u8() % 4);
      for (TokenId& t : draft) t = pick_token();
      if (draft_slots(info.id, static_cast<int32_t>(now->tokens.size()) - now->computed, draft)) {
        drafted.push_back(info.id);
      }
    }
    if (!error_.empty()) return;
    step();
    for (const SeqId id : drafted) {
      const ReferenceModel::Seq* s = model_->find(id);
      if (s == nullptr || !error_.empty()) continue;
      const uint8_t b = in_.u8();
      accept(id, b < 240 ? b % (s->drafts + 1) : std::array{-1, s->drafts + 1, INT32_MAX}[b % 3]);
    }
  }

  // One draft call with random arguments: allocate_draft_slots() or accept_draft().
  void op_draft_call() {
    const SeqId id = pick_id();
    if ((in_.u8() & 1) != 0) {
      accept(id, in_.range(-1, 4));
      return;
    }
    const int32_t n = pick_new_tokens(id);
    std::vector<TokenId> draft(in_.u8() % 5);
    for (TokenId& t : draft) t = pick_token();
    draft_slots(id, n, draft);
  }

  // allocate_draft_slots() on both, compared as allocate() compares; true when it succeeded.
  bool draft_slots(SeqId id, int32_t n, const std::vector<TokenId>& draft) {
    if (!error_.empty()) return false;
    log("allocate_draft_slots(", id, ", ", n, ", ", list(draft), ")");
    const ReferenceModel::Seq* before = model_->find(id);
    const ReferenceModel::Seq before_copy = before != nullptr ? *before : ReferenceModel::Seq{};
    const int32_t computed_before = before != nullptr ? before->computed : 0;
    const auto [code, slots] = model_->allocate_draft_slots(id, n, draft);
    const auto got = impl_->allocate_draft_slots(id, n, draft);
    if (!expect_code("allocate_draft_slots", got.status(), code) || !got.ok()) return false;
    if (std::vector<int64_t>(got->begin(), got->end()) != slots) {
      fail("allocate_draft_slots(", id, "): slot mapping ", list(*got), ", model expects ",
           list(slots));
      return false;
    }
    record_writes(id, before_copy, computed_before, model_slots());
    return true;
  }

  void accept(SeqId id, int32_t accepted) {
    if (!error_.empty()) return;
    log("accept_draft(", id, ", ", accepted, ")");
    const Code expected = model_->accept_draft(id, accepted);
    expect_code("accept_draft", impl_->accept_draft(id, accepted), expected);
  }

  // op_decode_round() through append_tokens_batch() and allocate_slots_batch(): every
  // running sequence's token first, then every allocation. The model runs the same calls one
  // by one; a sequence that an earlier allocation of the batch preempted fails with
  // FailedPrecondition there, without a call.
  void op_batched_decode_round() {
    log("batched decode round");
    std::vector<SeqId> running;
    for (const SequenceInfo& info : impl_->running_sequences()) running.push_back(info.id);
    std::vector<SeqId> appending;
    std::vector<TokenId> tokens;
    for (const SeqId id : running) {
      const ReferenceModel::Seq* s = model_->find(id);
      if (s == nullptr) {
        fail("batched decode round: seq ", id, " runs only in the manager");
        return;
      }
      if (s->tokens.size() == static_cast<size_t>(s->computed) &&
          static_cast<int32_t>(s->tokens.size()) < kMaxTokensPerSeq) {
        appending.push_back(id);
        tokens.push_back(pick_token());
      }
    }
    log("append_tokens_batch(", list(appending), ", ", list(tokens), ")");
    const auto appended = impl_->append_tokens_batch(appending, tokens);
    if (!expect_code("append_tokens_batch", appended.status(), Code::kOk)) return;
    for (size_t i = 0; i < appending.size(); ++i) {
      const Code expected = model_->append_tokens(appending[i], {&tokens[i], 1});
      if (!expect_code("append_tokens_batch entry", (*appended)[i], expected)) return;
    }
    std::vector<int32_t> counts;
    for (const SeqId id : running) {
      const ReferenceModel::Seq* s = model_->find(id);
      counts.push_back(std::min(1, static_cast<int32_t>(s->tokens.size()) - s->computed));
    }
    log("allocate_slots_batch(", list(running), ", ", list(counts), ", preempt)");
    // The model's side first: its states before each call tell who a call preempted.
    std::vector<Code> expected_codes;
    std::vector<std::vector<int64_t>> expected_slots(num_groups_);  // per group
    std::vector<std::vector<std::vector<int64_t>>> per_seq_slots;   // per sequence, group
    std::vector<ReferenceModel::Seq> before;
    std::vector<SeqId> victims;
    for (size_t i = 0; i < running.size(); ++i) {
      const SeqId id = running[i];
      before.push_back(*model_->find(id));
      if (std::find(victims.begin(), victims.end(), id) != victims.end()) {
        expected_codes.push_back(Code::kFailedPrecondition);
        per_seq_slots.emplace_back();
        for (auto& group_slots : expected_slots)
          group_slots.insert(group_slots.end(), counts[i], -1);
        continue;
      }
      const Code code = model_->allocate_slots_or_preempt(id, counts[i], 0).first;
      for (const SeqId other : running) {
        const ReferenceModel::Seq* o = model_->find(other);
        if (other != id && o != nullptr && o->state != SequenceState::kRunning) {
          victims.push_back(other);
        }
      }
      expected_codes.push_back(code);
      per_seq_slots.push_back(code == Code::kOk ? model_slots()
                                                : std::vector<std::vector<int64_t>>{});
      for (int32_t g = 0; g < num_groups_; ++g) {
        const std::vector<int64_t> mine =
            code == Code::kOk ? per_seq_slots.back()[g] : std::vector<int64_t>(counts[i], -1);
        expected_slots[g].insert(expected_slots[g].end(), mine.begin(), mine.end());
      }
    }
    const auto got = impl_->allocate_slots_batch(running, counts, 0, /*preempt=*/true);
    if (!expect_code("allocate_slots_batch", got.status(), Code::kOk)) return;
    for (size_t i = 0; i < running.size(); ++i) {
      if (!expect_code("allocate_slots_batch entry", got->statuses[i], expected_codes[i])) return;
    }
    const std::vector<int64_t> got_slots(got->slots.begin(), got->slots.end());
    if (got_slots != expected_slots[0]) {
      fail("allocate_slots_batch: slots ", list(got_slots), ", model expects ",
           list(expected_slots[0]));
      return;
    }
    for (int32_t g = 0; g < num_groups_; ++g) {
      const std::span<const int64_t> mine = *impl_->batch_slot_mapping(g);
      if (std::vector<int64_t>(mine.begin(), mine.end()) != expected_slots[g]) {
        fail("allocate_slots_batch: batch_slot_mapping(", g, ") ", list(mine), ", model expects ",
             list(expected_slots[g]));
        return;
      }
    }
    for (size_t i = 0; i < running.size(); ++i) {
      if (!per_seq_slots[i].empty()) {
        record_writes(running[i], before[i], before[i].computed, per_seq_slots[i]);
      }
    }
    if (error_.empty()) step();
  }

  void op_tables() {
    // Which group's tables: with layer groups, usually one of them, now and then one out of
    // range (InvalidArgument before anything else); group 0 without them.
    int32_t group = 0;
    if (grouped_) {
      const uint8_t g = in_.u8();
      group = g < 240 ? g % num_groups_ : std::array{-1, num_groups_}[g % 2];
    }
    const bool bad_group = group < 0 || group >= num_groups_;
    std::vector<SeqId> ids;
    for (int i = in_.range(0, 3); i > 0; --i) ids.push_back(pick_id());
    const uint8_t form = in_.u8() % 3;
    // Expected: the first missing or non-running sequence decides the error.
    Code first_error = Code::kOk;
    int32_t max_blocks = 0;
    int32_t total = 0;
    for (const SeqId id : ids) {
      const ReferenceModel::Seq* s = model_->find(id);
      if (s == nullptr) {
        first_error = Code::kNotFound;
        break;
      }
      if (s->state != SequenceState::kRunning) {
        first_error = Code::kFailedPrecondition;
        break;
      }
      const int32_t n = (s->computed + bs_ - 1) / bs_;
      max_blocks = std::max(max_blocks, n);
      total += n;
    }
    const auto nseq = static_cast<int32_t>(ids.size());
    // Expected tables.
    std::vector<int32_t> table, lens, indptr{0}, indices, last;
    auto fill_expected = [&](int32_t width) {
      table.clear();
      lens.clear();
      indices.clear();
      last.clear();
      indptr.assign(1, 0);
      for (const SeqId id : ids) {
        const ReferenceModel::Seq& s = *model_->find(id);
        const int32_t n = (s.computed + bs_ - 1) / bs_;
        // Released entries (before a windowed group's first held one) read as padding.
        const ReferenceModel::Table& t = s.tables[group];
        auto entry = [&](int32_t j) { return j < t.first_held ? kPaddingBlock : t.blocks[j]; };
        for (int32_t j = 0; j < width; ++j) table.push_back(j < n ? entry(j) : kPaddingBlock);
        lens.push_back(s.computed);
        for (int32_t j = 0; j < n; ++j) indices.push_back(entry(j));
        indptr.push_back(static_cast<int32_t>(indices.size()));
        last.push_back(n == 0 ? 0 : s.computed - (n - 1) * bs_);
      }
    };
    if (bad_group) first_error = Code::kInvalidArgument;
    if (form == 0) {
      log("build_block_tables(", list(ids), ", group ", group, ")");
      BlockTables out;
      if (!expect_code("build_block_tables", impl_->build_block_tables(ids, &out, group),
                       first_error)) {
        return;
      }
      if (first_error != Code::kOk) return;
      fill_expected(max_blocks);
      if (out.num_seqs != nseq || out.max_blocks != max_blocks || out.block_size != bs_ ||
          out.block_table != table || out.context_lens != lens || out.indptr != indptr ||
          out.indices != indices || out.last_page_len != last) {
        fail("build_block_tables(", list(ids), "): got table ", list(out.block_table), " lens ",
             list(out.context_lens), " indptr ", list(out.indptr), " indices ", list(out.indices),
             " last ", list(out.last_page_len), "; model expects table ", list(table), " lens ",
             list(lens), " indptr ", list(indptr), " indices ", list(indices), " last ",
             list(last));
      }
      return;
    }
    constexpr int32_t kSentinel = -7;
    if (form == 1) {
      const int32_t width = in_.u8() < 200 ? max_blocks + in_.range(0, 2) : in_.range(-1, 2);
      const int64_t want = static_cast<int64_t>(nseq) * std::max(width, 0);
      const int32_t table_size =
          static_cast<int32_t>(std::max<int64_t>(0, want - (in_.u8() < 220 ? 0 : 1)));
      const int32_t lens_size = std::max(0, nseq - (in_.u8() < 220 ? 0 : 1));
      log("write_block_tables(", list(ids), ", max_blocks ", width, ", buffers ", table_size, ", ",
          lens_size, ", group ", group, ")");
      // NOTE (contract): the group first, then buffers, then each sequence in order (unknown,
      // not running, too many entries).
      Code expected = Code::kOk;
      if (bad_group || width < 0 || table_size < want || lens_size < nseq) {
        expected = Code::kInvalidArgument;
      } else {
        for (const SeqId id : ids) {
          const ReferenceModel::Seq* s = model_->find(id);
          if (s == nullptr) {
            expected = Code::kNotFound;
          } else if (s->state != SequenceState::kRunning) {
            expected = Code::kFailedPrecondition;
          } else if ((s->computed + bs_ - 1) / bs_ > width) {
            expected = Code::kInvalidArgument;
          }
          if (expected != Code::kOk) break;
        }
      }
      std::vector<int32_t> got_table(table_size, kSentinel), got_lens(lens_size, kSentinel);
      if (!expect_code("write_block_tables",
                       impl_->write_block_tables(ids, width, got_table, got_lens, group),
                       expected)) {
        return;
      }
      if (expected != Code::kOk) {
        if (std::any_of(got_table.begin(), got_table.end(),
                        [](int32_t v) { return v != kSentinel; }) ||
            std::any_of(got_lens.begin(), got_lens.end(),
                        [](int32_t v) { return v != kSentinel; })) {
          fail("write_block_tables failed but wrote into the caller's buffers");
        }
        return;
      }
      fill_expected(width);
      table.resize(table_size, kSentinel);
      lens.resize(lens_size, kSentinel);
      if (got_table != table || got_lens != lens) {
        fail("write_block_tables: got ", list(got_table), " / ", list(got_lens), "; model expects ",
             list(table), " / ", list(lens));
      }
      return;
    }
    const int32_t indptr_size = std::max(0, nseq + 1 - (in_.u8() < 220 ? 0 : 1));
    const int32_t indices_size = std::max(0, total - (in_.u8() < 220 ? 0 : 1));
    const int32_t last_size = std::max(0, nseq - (in_.u8() < 220 ? 0 : 1));
    log("write_csr_block_tables(", list(ids), ", buffers ", indptr_size, ", ", indices_size, ", ",
        last_size, ", group ", group, ")");
    Code expected = first_error;
    if (expected == Code::kOk &&
        (indptr_size < nseq + 1 || indices_size < total || last_size < nseq)) {
      expected = Code::kInvalidArgument;
    }
    std::vector<int32_t> got_indptr(indptr_size, kSentinel), got_indices(indices_size, kSentinel),
        got_last(last_size, kSentinel);
    if (!expect_code("write_csr_block_tables",
                     impl_->write_csr_block_tables(ids, got_indptr, got_indices, got_last, group),
                     expected)) {
      return;
    }
    if (expected != Code::kOk) {
      for (const auto* v : {&got_indptr, &got_indices, &got_last}) {
        if (std::any_of(v->begin(), v->end(), [](int32_t x) { return x != kSentinel; })) {
          fail("write_csr_block_tables failed but wrote into the caller's buffers");
          return;
        }
      }
      return;
    }
    fill_expected(0);
    if (got_indptr != indptr || got_indices != indices || got_last != last) {
      fail("write_csr_block_tables: got indptr ", list(got_indptr), " indices ", list(got_indices),
           " last ", list(got_last), "; model expects ", list(indptr), " ", list(indices), " ",
           list(last));
    }
  }

  // --- state comparison ---

  void check_all() {
    if (!error_.empty()) return;
    if (invariants_every_ == 1 || until_invariants_ <= 0) {
      until_invariants_ = invariants_every_;
      if (const absl::Status s = impl_->check_invariants(); !s.ok()) {
        fail("check_invariants: ", s);
        return;
      }
    }
    const ReferenceModel& m = *model_;
    if (impl_->num_sequences() != static_cast<int32_t>(m.sequences().size())) {
      fail("num_sequences ", impl_->num_sequences(), ", model expects ", m.sequences().size());
      return;
    }
    std::vector<SequenceInfo> expected_running;
    for (const auto& [id, s] : m.sequences()) {
      for (int32_t g = 0; g < num_groups_; ++g) {
        const auto view = impl_->sequence(id, g);
        if (!view.ok()) {
          fail("sequence(", id, ", group ", g, "): ", view.status(), ", model has it");
          return;
        }
        const SequenceView& v = *view;
        const ReferenceModel::Table& t = s.tables[g];
        const std::vector<TokenId> tokens(v.tokens.begin(), v.tokens.end());
        const std::vector<BlockId> table(v.block_table.begin(), v.block_table.end());
        const std::vector<BlockId> host(v.host_blocks.begin(), v.host_blocks.end());
        if (v.id != id || v.state != s.state || v.priority != s.priority ||
            v.arrival != s.arrival || v.num_computed_tokens != s.computed || tokens != s.tokens ||
            table != t.blocks || host != t.host || v.first_held_block != t.first_held ||
            v.num_draft_tokens != s.drafts) {
          fail("sequence ", id, " group ", g, ": got state ", static_cast<int>(v.state),
               " priority ", v.priority, " arrival ", v.arrival, " computed ",
               v.num_computed_tokens, " tokens ", v.tokens.size(), " table ", list(table), " host ",
               list(host), " first held ", v.first_held_block, " drafts ", v.num_draft_tokens,
               "; model expects state ", static_cast<int>(s.state), " priority ", s.priority,
               " arrival ", s.arrival, " computed ", s.computed, " tokens ", s.tokens.size(),
               " table ", list(t.blocks), " host ", list(t.host), " first held ", t.first_held,
               " drafts ", s.drafts);
          return;
        }
      }
      if (s.state == SequenceState::kRunning) expected_running.push_back(m.info(s));
    }
    // A group out of range: InvalidArgument (one sequence per check; the status is costly).
    if (!m.sequences().empty()) {
      const SeqId id = m.sequences().begin()->first;
      for (const int32_t bad : {-1, num_groups_}) {
        if (impl_->sequence(id, bad).status().code() != Code::kInvalidArgument) {
          fail("sequence(", id, ", group ", bad, "): ", impl_->sequence(id, bad).status(),
               ", model expects INVALID_ARGUMENT");
          return;
        }
      }
    }
    for (const SeqId id : {SeqId{-1}, SeqId{0}, SeqId{1}, SeqId{7}, next_fresh_id_ - 1,
                           std::numeric_limits<SeqId>::min()}) {
      const bool present = m.find(id) != nullptr;
      if (impl_->contains(id) != present ||
          (!present && impl_->sequence(id).status().code() != Code::kNotFound)) {
        fail("contains(", id, ") / sequence(", id, ") disagree with the model (present: ", present,
             ")");
        return;
      }
    }
    std::sort(expected_running.begin(), expected_running.end(),
              [](const SequenceInfo& a, const SequenceInfo& b) { return a.arrival < b.arrival; });
    const std::vector<SequenceInfo> running = impl_->running_sequences();
    bool same_running = running.size() == expected_running.size();
    for (size_t i = 0; same_running && i < running.size(); ++i) {
      const SequenceInfo& a = running[i];
      const SequenceInfo& b = expected_running[i];
      same_running = a.id == b.id && a.priority == b.priority && a.arrival == b.arrival &&
                     a.num_blocks == b.num_blocks && a.num_tokens == b.num_tokens &&
                     a.num_computed_tokens == b.num_computed_tokens;
    }
    if (!same_running) {
      fail("running_sequences() differs from the model's running sequences");
      return;
    }
    for (int32_t g = 0; g < num_groups_; ++g) {
      const std::string suffix = num_groups_ > 1 ? " group " + std::to_string(g) : "";
      const BlockPool& dev = **impl_->device_pool(g);
      if (!same_blocks(("device" + suffix).c_str(), dev, m.device_blocks(g))) return;
      if (dev.free_queue_order() != m.device_queue(g)) {
        fail("device", suffix, " free queue ", list(dev.free_queue_order()), ", model expects ",
             list(m.device_queue(g)));
        return;
      }
      const BlockPool& host = **impl_->host_pool(g);
      if (!same_blocks(("host" + suffix).c_str(), host, m.host_blocks(g))) return;
      if (host.free_queue_order() != m.host_queue(g)) {
        fail("host", suffix, " free queue ", list(host.free_queue_order()), ", model expects ",
             list(m.host_queue(g)));
        return;
      }
    }
    check_stats();
    check_events();
    check_hooks();
  }

  // Every block's ref count, hash and retention priority.
  bool same_blocks(const char* pool_name, const BlockPool& pool,
                   const std::vector<ReferenceModel::Block>& blocks) {
    for (BlockId b = 0; b < pool.num_blocks(); ++b) {
      const auto& d = blocks[b];
      const int32_t ref = pool.ref_count(b).value();
      const bool cached = pool.is_cached(b).value();
      const int32_t priority = pool.retention_priority(b).value();
      if (ref != d.ref || cached != d.cached() || (cached && !(*pool.cached_hash(b) == d.hash)) ||
          priority != d.effective_priority()) {
        fail(pool_name, " block ", b, ": ref_count ", ref, " cached ", cached, " priority ",
             priority, "; model expects ref_count ", d.ref, " cached ", d.cached(), " priority ",
             d.effective_priority());
        return false;
      }
    }
    return true;
  }

  void check_stats() {
    if (!error_.empty()) return;
    const KvCacheManager::Stats s = impl_->stats();
    const ReferenceModel& m = *model_;
    const auto& c = m.counters();
    const auto free_blocks = static_cast<int32_t>(m.device_queue().size());
    const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
        {"num_blocks", {s.num_blocks, m.layer_group(0).num_blocks}},
        {"used_blocks", {s.used_blocks, m.layer_group(0).num_blocks - free_blocks}},
        {"free_blocks", {s.free_blocks, free_blocks}},
        {"cached_free_blocks", {s.cached_free_blocks, m.cached_free_blocks()}},
        {"num_host_blocks", {s.num_host_blocks, m.layer_group(0).num_host_blocks}},
        {"used_host_blocks", {s.used_host_blocks, m.used_host_blocks()}},
        {"prefix_query_tokens", {s.prefix_query_tokens, c.prefix_query_tokens}},
        {"prefix_hit_tokens", {s.prefix_hit_tokens, c.prefix_hit_tokens}},
        {"partial_hit_tokens", {s.partial_hit_tokens, c.partial_hit_tokens}},
        {"evictions", {s.evictions, m.evictions()}},
        {"cow_copies", {s.cow_copies, c.cow_copies}},
        {"preemptions_recompute", {s.preemptions_recompute, c.preemptions_recompute}},
        {"preemptions_swap", {s.preemptions_swap, c.preemptions_swap}},
        {"blocks_swapped_out", {s.blocks_swapped_out, c.blocks_swapped_out}},
        {"blocks_swapped_in", {s.blocks_swapped_in, c.blocks_swapped_in}},
        {"claims_released", {s.claims_released, c.claims_released}},
        {"cached_host_blocks", {s.cached_host_blocks, m.cached_host_blocks()}},
        {"host_hit_tokens", {s.host_hit_tokens, c.host_hit_tokens}},
        {"blocks_demoted", {s.blocks_demoted, c.blocks_demoted}},
        {"blocks_promoted", {s.blocks_promoted, c.blocks_promoted}},
        {"host_evictions", {s.host_evictions, m.host_evictions()}},
        {"blocks_not_admitted", {s.blocks_not_admitted, c.blocks_not_admitted}},
        {"ghost_hits", {s.ghost_hits, c.ghost_hits}},
        {"recent_ghost_hits", {s.recent_ghost_hits, m.adaptive_ghost_hits(0)}},
        {"frequent_ghost_hits", {s.frequent_ghost_hits, m.adaptive_ghost_hits(1)}},
        {"draft_tokens", {s.draft_tokens, c.draft_tokens}},
        {"accepted_draft_tokens", {s.accepted_draft_tokens, c.accepted_draft_tokens}},
    };
    for (const auto& [name, values] : fields) {
      if (values.first != values.second) {
        fail("stats().", name, " = ", values.first, ", model expects ", values.second);
        return;
      }
    }
    for (int32_t g = 0; g < num_groups_; ++g) {
      const KvCacheManager::GroupStats a = *impl_->group_stats(g);
      const KvCacheManager::GroupStats b = m.group_stats(g);
      const std::pair<const char*, std::pair<int64_t, int64_t>> group_fields[] = {
          {"num_blocks", {a.num_blocks, b.num_blocks}},
          {"used_blocks", {a.used_blocks, b.used_blocks}},
          {"free_blocks", {a.free_blocks, b.free_blocks}},
          {"cached_free_blocks", {a.cached_free_blocks, b.cached_free_blocks}},
          {"num_host_blocks", {a.num_host_blocks, b.num_host_blocks}},
          {"used_host_blocks", {a.used_host_blocks, b.used_host_blocks}},
          {"cached_host_blocks", {a.cached_host_blocks, b.cached_host_blocks}},
          {"evictions", {a.evictions, b.evictions}},
          {"host_evictions", {a.host_evictions, b.host_evictions}},
          {"hit_blocks", {a.hit_blocks, b.hit_blocks}},
          {"released_blocks", {a.released_blocks, b.released_blocks}},
          {"blocks_demoted", {a.blocks_demoted, b.blocks_demoted}},
          {"blocks_promoted", {a.blocks_promoted, b.blocks_promoted}},
          {"blocks_not_admitted", {a.blocks_not_admitted, b.blocks_not_admitted}},
          {"ghost_hits", {a.ghost_hits, b.ghost_hits}},
      };
      for (const auto& [name, values] : group_fields) {
        if (values.first != values.second) {
          fail("group_stats(", g, ").", name, " = ", values.first, ", model expects ",
               values.second);
          return;
        }
      }
    }
  }

  static std::string event_string(const KvEvent& e) {
    std::ostringstream out;
    if (const auto* s = std::get_if<BlockStored>(&e)) {
      out << "Stored(" << s->block_hashes.size() << " hashes, " << s->token_ids.size()
          << " tokens, parent " << s->parent_hash.has_value() << ", "
          << (s->medium == Medium::kHost ? "host" : "device") << ")";
    } else if (const auto* r = std::get_if<BlockRemoved>(&e)) {
      out << "Removed(" << r->block_hashes.size() << " hashes, "
          << (r->medium == Medium::kHost ? "host" : "device") << ")";
    } else {
      out << "Cleared";
    }
    return out.str();
  }

  static bool same_event(const KvEvent& a, const KvEvent& b) {
    if (a.index() != b.index()) return false;
    if (const auto* x = std::get_if<BlockStored>(&a)) {
      const auto& y = std::get<BlockStored>(b);
      return x->block_hashes == y.block_hashes && x->parent_hash == y.parent_hash &&
             x->token_ids == y.token_ids && x->block_size == y.block_size &&
             x->extra_keys == y.extra_keys && x->medium == y.medium;
    }
    if (const auto* x = std::get_if<BlockRemoved>(&a)) {
      const auto& y = std::get<BlockRemoved>(b);
      return x->block_hashes == y.block_hashes && x->medium == y.medium;
    }
    return true;
  }

  void check_events() {
    if (!error_.empty()) return;
    const std::vector<KvEvent> got = events_.take();
    const std::vector<KvEvent> expected = model_->take_events();
    bool same = got.size() == expected.size();
    for (size_t i = 0; same && i < got.size(); ++i) same = same_event(got[i], expected[i]);
    if (!same) {
      std::ostringstream g, e;
      for (const KvEvent& x : got) g << event_string(x) << " ";
      for (const KvEvent& x : expected) e << event_string(x) << " ";
      fail("KV events: got ", g.str(), "; model expects ", e.str());
    }
  }

  void check_hooks() {
    if (!error_.empty()) return;
    const std::vector<Preemption> got = std::exchange(hooks_.calls, {});
    const std::vector<Preemption> expected = model_->take_preemptions();
    for (const Preemption& p : got) {
      log("  -> preempted ", p.victim,
          p.mode == PreemptionMode::kSwap ? " by swap" : " by recompute");
    }
    bool same = got.size() == expected.size();
    for (size_t i = 0; same && i < got.size(); ++i) {
      same = got[i].victim == expected[i].victim && got[i].mode == expected[i].mode;
    }
    if (!same) {
      std::ostringstream g, e;
      for (const Preemption& p : got) g << p.victim << "/" << static_cast<int>(p.mode) << " ";
      for (const Preemption& p : expected) e << p.victim << "/" << static_cast<int>(p.mode) << " ";
      fail("preemption hooks: got ", g.str(), "; model expects ", e.str());
      return;
    }
    const std::vector<SeqId> released = std::exchange(hooks_.claim_releases, {});
    for (const SeqId id : released) log("  -> released the claim of ", id);
    if (released != model_->take_claim_releases()) {
      fail("claim-release hooks: got ", list(released), ", model disagrees");
    }
  }

  ByteSource in_;
  OpProfile profile_;
  KvCacheManager::Options opts_;
  int hash_index_ = 7;
  int policy_ = 0;  // victim policy: 0 the manager's default, else make_policy(policy_)
  int32_t bs_ = 1;
  std::vector<TokenId> base_;
  KvEventBuffer events_;
  RecordingHooks hooks_;
  std::optional<KvCacheManager> impl_;
  std::optional<ReferenceModel> model_;
  bool grouped_ = false;      // the input selected layer groups (kGroupsMarker)
  bool speculative_ = false;  // the input selected speculative decoding (kSpeculativeMarker)
  int32_t num_groups_ = 1;
  std::vector<std::vector<uint64_t>> device_mem_;  // per group: a fingerprint per slot
  std::vector<std::vector<uint64_t>> host_mem_;
  std::vector<PendingWrite> writes_;
  std::deque<std::string> trace_;
  std::string error_;
  int num_ops_ = 0;
  int invariants_every_ = 1;  // check_invariants() after every N-th operation
  int until_invariants_ = 1;  // operations until the next check_invariants()
  SeqId last_added_ = -12345;
  SeqId next_fresh_id_ = 100;
  bool echo_ = false;   // PAGEDKV_OPS_TRACE set: print each operation as it runs
  int64_t now_ms_ = 0;  // the manager's clock
  std::deque<std::vector<TokenId>> freed_;  // tokens of the last sequences freed
};

// Runs the operations the bytes decode to; "" when every check passed.
inline std::string run_manager_ops(std::span<const uint8_t> data, OpProfile profile) {
  return ManagerOpRunner(data, profile).run();
}

}  // namespace pagedkv::testing

#endif  // PAGEDKV_TESTS_SUPPORT_MANAGER_OPS_H_
