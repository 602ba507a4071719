// Two engines driven by bytes (a fuzzer's input, or a seeded generator's): a prefill engine
// computes prompts and exports them (export_sequence()), a decode engine imports them
// (import_slots()), receives their blocks through a simulated transfer that drops,
// corrupts, delays or loses the sender, completes them (complete_import()), and decodes
// on, with draft steps (allocate_draft_slots(), accept_draft()) and preemption by
// recompute under a tight pool. Both managers are checked after every operation by
// check_invariants(), and each engine's memory is simulated: every K/V slot holds a
// fingerprint of the tokens up to its own, every state slot a fingerprint of the tokens
// whose state it is, the step's ops move them as the engine moves K/V, the computation
// writes them, and the transfer copies them from the sender's pinned blocks (garbage for
// a corrupt block). Before each step's computation, and after each complete_import(),
// every token a running sequence attends must read back its own fingerprint: a pending
// import counted before its bytes arrived, a corrupt block kept, a pinned block reused or
// a rolled-back draft attended shows up as a mismatch. Used by tests/handoff_test.cc
// ([property]) and fuzz/handoff_fuzzer.cc.
#ifndef PAGEDKV_TESTS_SUPPORT_HANDOFF_OPS_H_
#define PAGEDKV_TESTS_SUPPORT_HANDOFF_OPS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/kv_handoff.h"
#include "support/manager_ops.h"

namespace pagedkv::testing {

struct HandoffOpsTotals {
  int64_t steps = 0;
  int64_t exports = 0;
  int64_t imports = 0;
  int64_t complete_imports = 0;   // with every block verified
  int64_t partial_imports = 0;    // some tokens recomputed
  int64_t recomputed_tokens = 0;  // imported tokens complete_import() did not count
  int64_t faulty_blocks = 0;      // corrupt or lost in transit
  int64_t lost_senders = 0;       // exports released before their transfer
  int64_t cancelled_imports = 0;  // freed while pending
  int64_t drafts = 0;
  int64_t accepted = 0;
  int64_t preemptions = 0;
};

// One engine: a manager, and the fingerprints its device memory holds.
class SimulatedEngine {
 public:
  static constexpr uint64_t kGarbage = ~uint64_t{0};

  explicit SimulatedEngine(KvCacheManager manager) : m_(std::move(manager)) {
    bs_ = m_.options().block_size;
    for (int32_t g = 0; g < m_.num_groups(); ++g) {
      const LayerGroup& spec = m_.options().layer_groups[g];
      const bool state = spec.kind == AttentionKind::kState;
      state_.push_back(state);
      mem_.emplace_back(static_cast<size_t>(spec.num_blocks) * (state ? 1 : bs_), kGarbage);
    }
  }

  KvCacheManager& manager() { return m_; }
  bool is_state(int32_t g) const { return state_[g]; }
  int32_t block_size() const { return bs_; }

  // The fingerprint of tokens[0, n): a state after them, or the K/V of token n - 1.
  static uint64_t fingerprint(std::span<const TokenId> tokens, uint64_t fp = 0) {
    for (const TokenId t : tokens) fp = fp * 0x100000001b3ULL + static_cast<uint64_t>(t) + 1;
    return fp;
  }

  uint64_t& slot(int32_t g, BlockId b, int32_t offset = 0) {
    return mem_[g][static_cast<size_t>(b) * (state_[g] ? 1 : bs_) + offset];
  }

  // `seq` computes from token `start` in this step (the first allocation of the step wins).
  void schedule(SeqId seq, int32_t start) { step_start_.try_emplace(seq, start); }
  // A pending import: its tokens are the transfer's to write.
  void mark_importing(SeqId seq, bool importing) {
    if (importing) {
      importing_.insert(seq);
    } else {
      importing_.erase(seq);
    }
  }
  bool importing(SeqId seq) const { return importing_.contains(seq); }
  bool scheduled(SeqId seq) const { return step_start_.contains(seq); }
  // A draft step's drafts, per state group the slots their states go to.
  void set_drafts(SeqId seq, int32_t num_drafts) { drafts_[seq] = num_drafts; }
  int32_t drafts(SeqId seq) const {
    const auto it = drafts_.find(seq);
    return it == drafts_.end() ? 0 : it->second;
  }
  void clear_drafts(SeqId seq) { drafts_.erase(seq); }
  void forget(SeqId seq) {
    step_start_.erase(seq);
    importing_.erase(seq);
    drafts_.erase(seq);
    draft_slots_.erase(seq);
  }
  void set_draft_slots(SeqId seq, int32_t g, std::vector<int64_t> slots) {
    draft_slots_[seq][g] = std::move(slots);
  }

  enum class Check { kAll, kStates, kKv };
  // Every token before `computed` that `seq` attends holds its own fingerprint, and each
  // state slot the state after them: "" or what is wrong.
  std::string check_sequence(SeqId seq, int32_t computed, Check what = Check::kAll) {
    const absl::StatusOr<SequenceView> view = m_.sequence(seq);
    if (!view.ok() || view->state != SequenceState::kRunning) return "";
    const std::span<const TokenId> tokens = view->tokens;
    for (int32_t g = 0; g < m_.num_groups(); ++g) {
      const SequenceView t = *m_.sequence(seq, g);
      if (state_[g]) {
        const uint64_t want = fingerprint(tokens.first(computed));
        if (what != Check::kKv && computed > 0 && slot(g, t.block_table[0]) != want) {
          return absl::StrCat("seq ", seq, " group ", g, " slot ", t.block_table[0],
                              ": not the state after its ", computed, " computed tokens");
        }
        continue;
      }
      // A windowed group holds the entries the next token attends, from first_held_block.
      if (what == Check::kStates) continue;
      for (int32_t pos = t.first_held_block * bs_; pos < computed; ++pos) {
        const BlockId b = t.block_table[pos / bs_];
        if (slot(g, b, pos % bs_) != fingerprint(tokens.first(pos + 1))) {
          return absl::StrCat(
              "seq ", seq, " token ", pos, " (group ", g, " block ", b, " offset ", pos % bs_,
              "): ", slot(g, b, pos % bs_) == kGarbage ? "garbage" : "another prefix's", " K/V");
        }
      }
    }
    return "";
  }

  // The step: the ops' copies, the computation (K/V of the scheduled tokens, states and
  // their saves), each state checked before it and each token's K/V after the step's
  // writes (a block another sequence fills in this step may be hit). "" or what is wrong.
  std::string end_step() {
    const StepOps ops = m_.take_step_ops();
    for (const BlockCopy& c : ops.copy_on_write) {
      for (int32_t i = 0; i < c.num_tokens; ++i) slot(c.group, c.dst, i) = slot(c.group, c.src, i);
    }
    for (const BlockCopy& c : ops.copy_state) slot(c.group, c.dst) = slot(c.group, c.src);
    if (!ops.swap_out.empty() || !ops.swap_in.empty() || !ops.demote.empty() ||
        !ops.promote.empty() || !ops.exchange.empty()) {
      return "host copies in an engine without host pools";
    }
    for (auto& [seq, start] : step_start_) {
      const absl::StatusOr<SequenceView> view = m_.sequence(seq);
      if (!view.ok() || view->state != SequenceState::kRunning || importing(seq)) continue;
      // A sequence that starts at token 0 starts from the zero state.
      for (int32_t g = 0; g < m_.num_groups(); ++g) {
        if (state_[g] && start == 0) slot(g, m_.sequence(seq, g)->block_table[0]) = 0;
      }
      if (std::string e = check_sequence(seq, start, Check::kStates); !e.empty()) {
        return absl::StrCat("before the computation: ", e);
      }
    }
    for (const StateSave& save : ops.save_state) {
      const auto it = step_start_.find(save.seq);
      const absl::StatusOr<SequenceView> view = m_.sequence(save.seq);
      if (it == step_start_.end() || !view.ok() || save.position < it->second ||
          save.position > std::ssize(view->tokens)) {
        return absl::StrCat("a save of seq ", save.seq, " at ", save.position,
                            " outside its computation");
      }
      slot(save.group, save.dst) = fingerprint(
          view->tokens.subspan(it->second, save.position - it->second), slot(save.group, save.src));
    }
    for (const auto& [seq, start] : step_start_) compute(seq, start);
    for (const auto& [seq, start] : step_start_) {
      const absl::StatusOr<SequenceView> view = m_.sequence(seq);
      if (!view.ok() || importing(seq)) continue;
      if (std::string e = check_sequence(seq, view->num_computed_tokens, Check::kKv); !e.empty()) {
        return absl::StrCat("after the computation: ", e);
      }
    }
    step_start_.clear();
    return "";
  }

 private:
  // Writes the K/V of `seq`'s tokens [start, computed) into the slots its tables give, and
  // extends its states (a draft's into the draft's own slot).
  void compute(SeqId seq, int32_t start) {
    const absl::StatusOr<SequenceView> view = m_.sequence(seq);
    if (!view.ok() || view->state != SequenceState::kRunning || importing(seq)) return;
    const std::span<const TokenId> tokens = view->tokens;
    const int32_t computed = view->num_computed_tokens;
    const int32_t verified = computed - drafts(seq);
    for (int32_t g = 0; g < m_.num_groups(); ++g) {
      const SequenceView t = *m_.sequence(seq, g);
      if (state_[g]) {
        uint64_t& own = slot(g, t.block_table[0]);
        own = fingerprint(tokens.subspan(start, verified - start), own);
        uint64_t state = own;
        for (int32_t j = 0; j < drafts(seq); ++j) {
          state = fingerprint(tokens.subspan(verified + j, 1), state);
          slot(g, static_cast<BlockId>(draft_slots_[seq][g][j])) = state;
        }
        continue;
      }
      for (int32_t pos = std::max(start, t.first_held_block * bs_); pos < computed; ++pos) {
        slot(g, t.block_table[pos / bs_], pos % bs_) = fingerprint(tokens.first(pos + 1));
      }
    }
  }

  KvCacheManager m_;
  int32_t bs_ = 0;
  std::vector<bool> state_;
  std::vector<std::vector<uint64_t>> mem_;  // per group: per slot, a fingerprint
  std::map<SeqId, int32_t> step_start_;
  std::set<SeqId> importing_;
  std::map<SeqId, int32_t> drafts_;
  std::map<SeqId, std::map<int32_t, std::vector<int64_t>>> draft_slots_;
};

class HandoffOpRunner : private FirstFailure {
 public:
  explicit HandoffOpRunner(std::span<const uint8_t> data) : in_(data) {}

  // Runs the input; returns "" or what went wrong.
  std::string run(HandoffOpsTotals* totals = nullptr) {
    if (create()) {
      while (!in_.empty() && error_.empty() && totals_.steps < 48) {
        const int ops = 1 + in_.u8() % 6;
        for (int i = 0; i < ops && error_.empty(); ++i) one_op();
        if (error_.empty()) end_steps();
      }
    }
    if (totals != nullptr) add(*totals);
    return error_;
  }

 private:
  // An exported request on its way: the decode engine imports it, a step later the bytes
  // arrive.
  struct InFlight {
    KvExport sent;
    TokenId sampled = 0;
    bool imported = false;
    KvImport import;
  };

  bool create() {
    const uint8_t a = in_.u8();
    const uint8_t b = in_.u8();
    KvCacheManager::Options options;
    options.block_size = 4;
    options.enable_prefix_caching = (a & 7) != 0;
    options.layer_groups.push_back({.kind = AttentionKind::kFull, .num_blocks = 16 + a % 24});
    if ((b & 1) != 0) {
      options.layer_groups.push_back(
          {.kind = AttentionKind::kSlidingWindow, .window = 6, .num_blocks = 10 + b % 16});
    }
    if ((b & 2) != 0) {
      options.layer_groups.push_back({.kind = AttentionKind::kState, .num_blocks = 4 + b % 8});
      options.state_checkpoint_interval_blocks = (a >> 3) % 2 == 0 ? 2 : 0;
    }
    absl::StatusOr<KvCacheManager> prefill = KvCacheManager::create(options);
    // The decode engine's pools are smaller: imports and decodes preempt each other.
    for (LayerGroup& g : options.layer_groups) g.num_blocks = std::max(4, g.num_blocks / 2);
    absl::StatusOr<KvCacheManager> decode = KvCacheManager::create(options);
    if (!prefill.ok() || !decode.ok()) {
      return fail("create: ", prefill.status().ToString(), " ", decode.status().ToString());
    }
    prefill_.emplace(*std::move(prefill));
    decode_.emplace(*std::move(decode));
    return true;
  }

  // A prompt from shared pieces (one of three system prompts, or none, then a short user
  // turn), so that both engines' caches hit.
  std::vector<TokenId> prompt() {
    const uint8_t p = in_.u8();
    std::vector<TokenId> tokens;
    if (p % 4 < 3) {
      for (int i = 0; i < 5 + 4 * (p % 4) + (p >> 4) % 3; ++i) tokens.push_back(1000 * (p % 4) + i);
    }
    for (int i = 0, n = 1 + in_.u8() % 10; i < n; ++i) tokens.push_back(5000 + in_.u8() % 4);
    return tokens;
  }

  void one_op() {
    switch (in_.u8() % 12) {
      case 0:
      case 1:
        return prefill_new();
      case 2:
        return prefill_more();
      case 3:
      case 4:
        return export_one();
      case 5:
      case 6:
        return import_one();
      case 7:
      case 8:
        return decode_one();
      case 9:
        return free_decoded();
      case 10:
        return lose_sender();
      default:
        return cancel_import();
    }
  }

  // --- the prefill engine ------------------------------------------------------------------

  void prefill_new() {
    KvCacheManager& m = prefill_->manager();
    const SeqId id = next_id_++;
    if (!m.add_sequence(id, prompt()).ok()) return;
    (void)m.match_prefix(id);
    prefill_more(id);
    check(*prefill_, "prefill: add ", id);
  }

  void prefill_more(SeqId id = -1) {
    KvCacheManager& m = prefill_->manager();
    if (id < 0)
      id = pick(*prefill_, [&](const SequenceView& v) {
        return v.num_computed_tokens < std::ssize(v.tokens);
      });
    if (id < 0) return;
    const SequenceView v = *m.sequence(id);
    const int32_t left = static_cast<int32_t>(v.tokens.size()) - v.num_computed_tokens;
    const int32_t start = v.num_computed_tokens;
    if (m.allocate_slots(id, 1 + in_.u8() % left).ok()) prefill_->schedule(id, start);
    check(*prefill_, "prefill: allocate ", id);
  }

  // A prompt computed in an earlier step samples its first token, and leaves.
  void export_one() {
    KvCacheManager& m = prefill_->manager();
    const SeqId id = pick(*prefill_, [&](const SequenceView& v) {
      return v.num_computed_tokens == std::ssize(v.tokens) && !prefill_->scheduled(v.id);
    });
    if (id < 0) return;
    const TokenId sampled = 5000 + in_.u8() % 4;
    absl::StatusOr<KvExport> sent = m.export_sequence(id);
    if (!sent.ok()) return fail_void("export_sequence(", id, "): ", sent.status().ToString());
    prefill_->forget(id);
    in_flight_.emplace(
        id,
        InFlight{.sent = *std::move(sent), .sampled = sampled, .imported = false, .import = {}});
    ++totals_.exports;
    check(*prefill_, "export_sequence ", id);
  }

  // The sender is gone before the bytes left: its pins are released, nothing arrives.
  void lose_sender() {
    for (auto& [id, f] : in_flight_) {
      if (!f.imported || lost_.contains(id) || in_.u8() % 2 == 0) continue;
      release(id);
      lost_.insert(id);
      ++totals_.lost_senders;
      return;
    }
  }

  void release(SeqId id) {
    if (!prefill_->manager().release_export(id).ok()) return;
    check(*prefill_, "release_export ", id);
  }

  // --- the decode engine -------------------------------------------------------------------

  void import_one() {
    KvCacheManager& m = decode_->manager();
    for (auto& [id, f] : in_flight_) {
      if (f.imported) continue;
      std::vector<TokenId> tokens = f.sent.tokens;
      tokens.push_back(f.sampled);
      if (!m.contains(id) && !m.add_sequence(id, tokens).ok()) {
        return fail_void("decode: add_sequence(", id, ") refused");
      }
      const absl::StatusOr<SequenceView> v = m.sequence(id);
      const auto n = static_cast<int32_t>(f.sent.tokens.size());
      // Computed here meanwhile (no room for the import before), or all hit locally:
      // the transfer is not needed.
      const absl::StatusOr<int32_t> local =
          v->state == SequenceState::kWaiting && v->num_computed_tokens == 0
              ? m.match_prefix(id)
              : absl::StatusOr<int32_t>(n);
      if (!local.ok()) return fail_void("match_prefix(", id, "): ", local.status().ToString());
      if (*local >= n) {
        release(id);
        in_flight_.erase(id);
        return;
      }
      absl::StatusOr<KvImport> in = m.import_slots(id, n);
      check(*decode_, "import_slots ", id);
      if (!in.ok()) {
        (void)m.release_claim(id);  // no room now: try again later
        return;
      }
      f.imported = true;
      f.import = *std::move(in);
      decode_->mark_importing(id, true);
      decode_->schedule(id, *local);
      ++totals_.imports;
      return;
    }
  }

  // After the decode engine's step: some transfers arrive, each block intact, corrupt or
  // lost; the import completes with the verified prefix of each group.
  void deliver() {
    std::vector<SeqId> done;
    for (auto& [id, f] : in_flight_) {
      if (!f.imported || in_.u8() % 4 == 0) continue;  // delayed to a later step
      const bool sender_alive = !lost_.contains(id);
      std::vector<int32_t> verified;
      for (size_t g = 0; g < f.import.groups.size(); ++g) {
        verified.push_back(receive(static_cast<int32_t>(g), f, sender_alive));
        if (!error_.empty()) return;
      }
      const absl::StatusOr<int32_t> p = decode_->manager().complete_import(id, verified);
      if (!p.ok()) return fail_void("complete_import(", id, "): ", p.status().ToString());
      decode_->mark_importing(id, false);
      const auto n = static_cast<int32_t>(f.sent.tokens.size());
      bool whole = true;
      for (size_t g = 0; g < verified.size(); ++g) {
        whole = whole && verified[g] == std::ssize(f.import.groups[g].blocks);
      }
      if (whole != (*p == n) || *p < 0 || *p > n) {
        return fail_void("complete_import(", id, ") = ", *p, " of ", n, " tokens, every block ",
                         whole ? "" : "not ", "verified");
      }
      if (whole) {
        ++totals_.complete_imports;
      } else {
        ++totals_.partial_imports;
        totals_.recomputed_tokens += n - *p;
      }
      check(*decode_, "complete_import ", id);
      if (const std::string e = decode_->check_sequence(id, *p); !e.empty()) {
        return fail_void("after complete_import: ", e);
      }
      if (sender_alive) release(id);
      lost_.erase(id);
      done.push_back(id);
    }
    for (const SeqId id : done) in_flight_.erase(id);
  }

  // Group g's entries of one transfer: returns how many leading ones arrived verified.
  int32_t receive(int32_t g, const InFlight& f, bool sender_alive) {
    const KvHandoffGroup& from = f.sent.groups[g];
    const KvHandoffGroup& to = f.import.groups[g];
    int32_t verified = 0;
    bool intact_so_far = sender_alive;
    const int32_t bs = decode_->block_size();
    for (size_t i = 0; i < to.blocks.size(); ++i) {
      const int32_t entry = to.first_entry + static_cast<int32_t>(i);
      const int32_t k = entry - from.first_entry;
      if (k < 0 || k >= std::ssize(from.blocks)) {
        fail("import of seq ", f.sent.seq, " group ", g, " entry ", entry,
             ": not among the export's entries [", from.first_entry, ", ",
             from.first_entry + std::ssize(from.blocks), ")");
        return 0;
      }
      const BlockId src = from.blocks[k];
      const BlockId dst = to.blocks[i];
      const uint8_t fate = in_.u8();
      const bool lost = !sender_alive || fate % 8 == 0;
      const bool corrupt = !lost && fate % 8 == 1;
      totals_.faulty_blocks += lost || corrupt;
      if (!lost) {
        const int32_t n = decode_->is_state(g) ? 1 : bs;
        for (int32_t j = 0; j < n; ++j) {
          // The pinned source still holds the export's tokens: nothing reused it.
          const int32_t pos = entry * bs + j;
          const uint64_t sent = prefill_->slot(g, src, j);
          const auto held = decode_->is_state(g) ? std::ssize(f.sent.tokens) : pos + 1;
          if (held <= std::ssize(f.sent.tokens) &&
              sent != SimulatedEngine::fingerprint(std::span(f.sent.tokens).first(held))) {
            fail("export of seq ", f.sent.seq, " group ", g, " block ", src, " offset ", j,
                 ": the pinned block no longer holds token ", pos);
            return 0;
          }
          decode_->slot(g, dst, j) = corrupt ? SimulatedEngine::kGarbage - 1 : sent;
        }
      }
      intact_so_far = intact_so_far && !lost && !corrupt;
      verified += intact_so_far;
    }
    return verified;
  }

  void decode_one() {
    KvCacheManager& m = decode_->manager();
    const SeqId id = pick(*decode_, [&](const SequenceView& v) {
      return !decode_->importing(v.id) && !decode_->scheduled(v.id) &&
             v.state != SequenceState::kSwapped;
    });
    if (id < 0) return;
    const SequenceView v = *m.sequence(id);
    if (v.state == SequenceState::kWaiting && v.num_computed_tokens == 0) {
      (void)m.match_prefix(id);
    }
    const int32_t start = m.sequence(id)->num_computed_tokens;
    if (start == std::ssize(v.tokens)) {
      const TokenId t = 5000 + in_.u8() % 4;
      if (!m.append_tokens(id, {&t, 1}).ok()) return;
    }
    const int32_t left = static_cast<int32_t>(m.sequence(id)->tokens.size()) - start;
    const uint8_t how = in_.u8();
    if (how % 3 == 0 && m.sequence(id)->state == SequenceState::kRunning) {
      std::vector<TokenId> draft(1 + how / 3 % 3);
      for (TokenId& t : draft) t = 5000 + in_.u8() % 4;
      if (!m.allocate_draft_slots(id, left, draft).ok()) return;
      decode_->schedule(id, start);
      decode_->set_drafts(id, static_cast<int32_t>(draft.size()));
      for (int32_t g = 0; g < m.num_groups(); ++g) {
        if (!decode_->is_state(g)) continue;
        const std::span<const int64_t> slots = *m.slot_mapping(g);
        decode_->set_draft_slots(id, g, {slots.end() - std::ssize(draft), slots.end()});
      }
      totals_.drafts += std::ssize(draft);
    } else {
      const int64_t preempted = m.stats().preemptions_recompute;
      const auto slots = m.allocate_slots_or_preempt(id, 1 + in_.u8() % left);
      totals_.preemptions += m.stats().preemptions_recompute - preempted;
      if (slots.ok()) decode_->schedule(id, start);
    }
    check(*decode_, "decode ", id);
  }

  // After the decode engine's step: the drafts' verdicts.
  void judge_drafts() {
    KvCacheManager& m = decode_->manager();
    for (SeqId id = 1; id < next_id_; ++id) {
      const int32_t k = decode_->drafts(id);
      if (k == 0) continue;
      const int32_t accepted = in_.u8() % (k + 1);
      if (!m.accept_draft(id, accepted).ok()) return fail_void("accept_draft(", id, ") refused");
      decode_->clear_drafts(id);
      totals_.accepted += accepted;
      check(*decode_, "accept_draft ", id);
    }
  }

  void free_decoded() {
    const SeqId id = pick(*decode_, [&](const SequenceView& v) {
      return !decode_->importing(v.id) && !decode_->scheduled(v.id) && decode_->drafts(v.id) == 0;
    });
    if (id < 0) return;
    if (!decode_->manager().free(id).ok()) return fail_void("free(", id, ") refused");
    decode_->forget(id);
    check(*decode_, "free ", id);
  }

  // A transfer cancelled: the sender is told, the receiver frees the pending import.
  void cancel_import() {
    for (auto& [id, f] : in_flight_) {
      if (!f.imported || decode_->scheduled(id) || in_.u8() % 2 == 0) continue;
      if (!decode_->manager().free(id).ok()) return fail_void("free(", id, ") of an import");
      decode_->forget(id);
      if (!lost_.contains(id)) release(id);
      lost_.erase(id);
      ++totals_.cancelled_imports;
      check(*decode_, "cancel ", id);
      in_flight_.erase(id);
      return;
    }
  }

  void end_steps() {
    ++totals_.steps;
    for (SimulatedEngine* e : {&*prefill_, &*decode_}) {
      if (std::string err = e->end_step(); !err.empty()) {
        return fail_void(e == &*prefill_ ? "prefill" : "decode", " step: ", err);
      }
      check(*e, "take_step_ops");
    }
    judge_drafts();
    if (error_.empty()) deliver();
  }

  template <typename Predicate>
  SeqId pick(SimulatedEngine& e, Predicate wanted) {
    std::vector<SeqId> ids;
    for (SeqId id = 1; id < next_id_; ++id) {
      const absl::StatusOr<SequenceView> v = e.manager().sequence(id);
      if (v.ok() && wanted(*v)) ids.push_back(id);
    }
    return ids.empty() ? -1 : ids[in_.u8() % ids.size()];
  }

  template <typename... Parts>
  void check(SimulatedEngine& e, const Parts&... where) {
    if (const absl::Status s = e.manager().check_invariants(); !s.ok()) {
      fail(&e == &*prefill_ ? "prefill " : "decode ", where..., ": ", s.ToString());
    }
  }

  void add(HandoffOpsTotals& t) const {
    t.steps += totals_.steps;
    t.exports += totals_.exports;
    t.imports += totals_.imports;
    t.complete_imports += totals_.complete_imports;
    t.partial_imports += totals_.partial_imports;
    t.recomputed_tokens += totals_.recomputed_tokens;
    t.faulty_blocks += totals_.faulty_blocks;
    t.lost_senders += totals_.lost_senders;
    t.cancelled_imports += totals_.cancelled_imports;
    t.drafts += totals_.drafts;
    t.accepted += totals_.accepted;
    t.preemptions += totals_.preemptions;
  }

  ByteSource in_;
  std::optional<SimulatedEngine> prefill_;
  std::optional<SimulatedEngine> decode_;
  std::map<SeqId, InFlight> in_flight_;
  std::set<SeqId> lost_;  // exports released before their transfer
  SeqId next_id_ = 1;
  HandoffOpsTotals totals_;
};

inline std::string run_handoff_ops(std::span<const uint8_t> data,
                                   HandoffOpsTotals* totals = nullptr) {
  return HandoffOpRunner(data).run(totals);
}

}  // namespace pagedkv::testing

#endif  // PAGEDKV_TESTS_SUPPORT_HANDOFF_OPS_H_
