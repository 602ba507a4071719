// A KvCacheManager with state groups driven by bytes (a fuzzer's input, or a seeded
// generator's), checked after every operation by check_invariants() and, every step, by a
// simulation of the engine's states: each state slot (device and host) holds a
// fingerprint of the tokens whose state it is, the step's ops move fingerprints as the
// engine moves states (swap-out, demote, copy_state, swap-in, promote: the host tier's
// checkpoints when it is on), and the computation extends them
// token by token and saves them at each StepOps::save_state position. Before the
// computation, every running sequence's slot must hold the fingerprint of its computed
// prefix: a restore of the wrong checkpoint, a missed or misordered op, or a slot reused
// while an op still names it shows up as a mismatch. An input whose first byte is
// kSpeculativeMarker also runs draft steps: the computation writes each draft's state into
// its slot, and after the step a verdict keeps some (accept_draft()); the sequence's slot
// must then hold the state after its last accepted token. Used by tests/state_groups_test.cc
// ([property]) and fuzz/state_fuzzer.cc.
#ifndef PAGEDKV_TESTS_SUPPORT_STATE_OPS_H_
#define PAGEDKV_TESTS_SUPPORT_STATE_OPS_H_

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pagedkv/kv_cache_manager.h"
#include "support/manager_ops.h"

namespace pagedkv::testing {

struct StateOpsTotals {
  int64_t operations = 0;
  int64_t steps = 0;
  int64_t saves = 0;
  int64_t restores = 0;
  int64_t restored_tokens = 0;
  int64_t forks = 0;
  int64_t swaps = 0;
  int64_t demotes = 0;        // checkpoints demoted to the host tier
  int64_t host_restores = 0;  // checkpoints restored from the host tier
  int64_t drafts = 0;         // draft tokens given state slots
  int64_t accepted = 0;       // of those, accepted
};

class StateOpRunner : private FirstFailure {
 public:
  explicit StateOpRunner(std::span<const uint8_t> data) : in_(data), hooks_(this) {}

  // Runs the input; returns "" or what went wrong.
  std::string run(StateOpsTotals* totals = nullptr) {
    if (!create()) return error_;
    while (!in_.empty() && error_.empty() && totals_.steps < 64) {
      const int ops = 1 + in_.u8() % 8;
      for (int i = 0; i < ops && error_.empty(); ++i) one_op();
      if (error_.empty()) end_step();
    }
    if (totals != nullptr) {
      totals->operations += totals_.operations;
      totals->steps += totals_.steps;
      totals->saves += totals_.saves;
      totals->restores += totals_.restores;
      totals->restored_tokens += totals_.restored_tokens;
      totals->forks += totals_.forks;
      totals->swaps += totals_.swaps;
      totals->demotes += totals_.demotes;
      totals->host_restores += totals_.host_restores;
      totals->drafts += totals_.drafts;
      totals->accepted += totals_.accepted;
    }
    return error_;
  }

 private:
  // What the engine knows of a sequence: its tokens, and where this step's computation
  // starts (its computed tokens before the step's first allocation).
  struct Seq {
    std::vector<TokenId> tokens;
    int32_t step_start = -1;  // -1: not scheduled in this step
    // A draft step's drafts, and per state group the slots of their states.
    std::vector<TokenId> draft;
    std::map<int32_t, std::vector<int64_t>> draft_slots;
  };
  static constexpr uint64_t kUnknown = ~uint64_t{0};

  // A claim released to make room takes back the restore: the sequence starts again.
  class Hooks : public PreemptionHooks {
   public:
    explicit Hooks(StateOpRunner* runner) : runner_(runner) {}
    void on_preempt(SeqId, PreemptionMode) override {}
    void on_claim_released(SeqId seq) override { runner_->seqs_[seq].step_start = -1; }

   private:
    StateOpRunner* runner_;
  };

  static uint64_t extend(uint64_t fp, std::span<const TokenId> tokens) {
    for (const TokenId t : tokens) fp = fp * 0x100000001b3ULL + static_cast<uint64_t>(t) + 1;
    return fp;
  }

  bool create() {
    uint8_t a = in_.u8();
    speculative_ = a == kSpeculativeMarker;
    if (speculative_) a = in_.u8();
    const uint8_t b = in_.u8();
    KvCacheManager::Options options;
    options.block_size = 4;
    options.preemption_hooks = &hooks_;
    options.enable_prefix_caching = (a & 7) != 0;
    options.state_checkpoint_interval_blocks = (a >> 3) % 4 == 0 ? 2 : 0;
    options.watermark_blocks = (a >> 5) % 4 == 0 ? 1 : 0;
    // The largest host pools (b % 3 == 2) hold the host tier too, K/V blocks and
    // checkpoints, some with HostAdmission::kReused.
    options.enable_host_cache = options.enable_prefix_caching && b % 3 == 2;
    options.host_admission = (b >> 5) % 2 == 0 ? HostAdmission::kAll : HostAdmission::kReused;
    options.layer_groups.push_back(
        {.kind = AttentionKind::kFull, .num_blocks = 12 + b % 32, .num_host_blocks = b % 3 * 8});
    if ((b >> 6) == 1) {
      options.layer_groups.push_back({.kind = AttentionKind::kSlidingWindow,
                                      .window = 6,
                                      .num_blocks = 8 + b % 16,
                                      .num_host_blocks = b % 3 * 8});
    }
    const int state_groups = 1 + (b >> 7);
    for (int i = 0; i < state_groups; ++i) {
      options.layer_groups.push_back({.kind = AttentionKind::kState,
                                      .num_blocks = 3 + (a + 5 * i) % 8,
                                      .num_host_blocks = b % 3 * 2});
    }
    absl::StatusOr<KvCacheManager> m = KvCacheManager::create(options);
    if (!m.ok()) return fail("create: ", m.status().ToString());
    manager_.emplace(*std::move(m));
    for (int32_t g = 0; g < manager_->num_groups(); ++g) {
      if (manager_->layer_group(g)->kind != AttentionKind::kState) continue;
      state_groups_.push_back(g);
      slots_[g].assign(manager_->layer_group(g)->num_blocks, kUnknown);
      host_slots_[g].assign(manager_->layer_group(g)->num_host_blocks, kUnknown);
    }
    return true;
  }

  // A prompt from shared pieces: one of three system prompts (6 to 18 tokens, not always
  // whole blocks) or none, then a user turn from a small alphabet, so that prompts share
  // prefixes and branch.
  std::vector<TokenId> prompt() {
    const uint8_t p = in_.u8();
    std::vector<TokenId> tokens;
    const int system = p % 4;
    if (system < 3) {
      for (int i = 0; i < 6 + 5 * system + (p >> 4) % 3; ++i) tokens.push_back(1000 * system + i);
    }
    const int user = 1 + in_.u8() % 14;
    for (int i = 0; i < user; ++i) tokens.push_back(5000 + in_.u8() % 4);
    return tokens;
  }

  void one_op() {
    ++totals_.operations;
    const uint8_t op = in_.u8();
    switch (op % 10) {
      case 0:
      case 1:
        add_and_start();
        break;
      case 2:
      case 3:
        if (speculative_ && (op >> 4) % 2 == 1) {
          draft_step(pick(SequenceState::kRunning, /*unscheduled=*/true));
        } else {
          advance(pick_running());
        }
        break;
      case 4:  // a waiting one: a new claim, or one preempted by recompute
        advance(pick(SequenceState::kWaiting, /*unscheduled=*/false));
        break;
      case 5:
        fork(pick_running());
        break;
      case 6:
        preempt(pick_running(),
                (op >> 4) % 2 == 0 ? PreemptionMode::kRecompute : PreemptionMode::kSwap);
        break;
      case 7:
        swap_in();
        break;
      case 8:
        free_one();
        break;
      default:
        if ((op >> 4) == 15) {
          manager_->reset_prefix_cache();
        } else {
          match_waiting();
        }
        break;
    }
    if (error_.empty()) check("after op ", op % 10);
  }

  SeqId pick(SequenceState state, bool unscheduled) {
    std::vector<SeqId> ids;
    for (const auto& [id, s] : seqs_) {
      const auto view = manager_->sequence(id);
      if (view->state == state && (!unscheduled || s.step_start < 0)) ids.push_back(id);
    }
    return ids.empty() ? -1 : ids[in_.u8() % ids.size()];
  }
  SeqId pick_running() { return pick(SequenceState::kRunning, /*unscheduled=*/false); }

  void add_and_start() {
    const SeqId id = next_id_++;
    seqs_[id].tokens = prompt();
    if (!manager_->add_sequence(id, seqs_[id].tokens).ok()) {
      seqs_.erase(id);
      return;
    }
    match(id);
    advance(id);
  }

  void match(SeqId id) {
    const absl::StatusOr<int32_t> hit = manager_->match_prefix(id);
    if (!hit.ok()) return;
    if (*hit > 0 && manager_->sequence(id, state_groups_[0])->block_table.size() == 1) {
      ++totals_.restores;
      totals_.restored_tokens += *hit;
      schedule(id, *hit);
    }
  }

  void match_waiting() {
    const SeqId id = pick(SequenceState::kWaiting, /*unscheduled=*/true);
    if (id < 0) return;
    if (manager_->sequence(id)->num_computed_tokens > 0) {
      (void)manager_->release_claim(id);
      return;
    }
    match(id);
  }

  void schedule(SeqId id, int32_t start) {
    if (seqs_[id].step_start < 0) seqs_[id].step_start = start;
  }

  // A sequence whose tokens are all computed samples its next one; false when the manager
  // refuses it (max_model_len).
  bool sample_if_computed(SeqId id, int32_t computed) {
    Seq& s = seqs_[id];
    if (computed != static_cast<int32_t>(s.tokens.size())) return true;
    const TokenId t = 5000 + in_.u8() % 4;
    if (!manager_->append_tokens(id, {&t, 1}).ok()) return false;
    s.tokens.push_back(t);
    return true;
  }

  // The next chunk of a waiting or running sequence (a decode token once its prompt is in).
  void advance(SeqId id) {
    if (id < 0) return;
    Seq& s = seqs_[id];
    const int32_t computed = manager_->sequence(id)->num_computed_tokens;
    if (!sample_if_computed(id, computed)) return;
    const auto left = static_cast<int32_t>(s.tokens.size()) - computed;
    const int32_t chunk = 1 + in_.u8() % left;
    const bool or_preempt = in_.u8() % 4 == 0;
    const auto slots = or_preempt ? manager_->allocate_slots_or_preempt(id, chunk)
                                  : manager_->allocate_slots(id, chunk);
    if (slots.ok()) schedule(id, computed);
  }

  // A decode step with drafts: the next token and 1 to 3 drafts after it.
  void draft_step(SeqId id) {
    if (id < 0) return;
    Seq& s = seqs_[id];
    const int32_t computed = manager_->sequence(id)->num_computed_tokens;
    if (!sample_if_computed(id, computed)) return;
    std::vector<TokenId> draft(1 + in_.u8() % 3);
    for (TokenId& t : draft) t = 5000 + in_.u8() % 4;
    const int32_t n = static_cast<int32_t>(s.tokens.size()) - computed;
    if (!manager_->allocate_draft_slots(id, n, draft).ok()) return;
    schedule(id, computed);
    s.draft = draft;
    for (const int32_t g : state_groups_) {
      const std::span<const int64_t> slots = *manager_->slot_mapping(g);
      s.draft_slots[g].assign(slots.end() - std::ssize(draft), slots.end());
    }
    totals_.drafts += std::ssize(draft);
  }

  // After the step's computation: the drafts' verdicts, the accepted ones joining the tokens.
  void judge_drafts() {
    for (auto& [id, s] : seqs_) {
      if (s.draft.empty()) continue;
      const int32_t accepted = in_.u8() % (std::ssize(s.draft) + 1);
      if (!manager_->accept_draft(id, accepted).ok()) return fail_void("accept_draft ", id);
      s.tokens.insert(s.tokens.end(), s.draft.begin(), s.draft.begin() + accepted);
      totals_.accepted += accepted;
      s.draft.clear();
      s.draft_slots.clear();
      check("accept_draft", 0);
    }
  }

  void fork(SeqId parent) {
    if (parent < 0) return;
    const SeqId child = next_id_++;
    if (!manager_->fork(parent, child).ok()) return;
    seqs_[child].tokens = seqs_[parent].tokens;
    ++totals_.forks;
  }

  void preempt(SeqId id, PreemptionMode mode) {
    if (id < 0) return;
    if (manager_->preempt(id, mode).ok()) totals_.swaps += mode == PreemptionMode::kSwap;
  }

  void swap_in() {
    const SeqId id = pick(SequenceState::kSwapped, /*unscheduled=*/false);
    if (id >= 0) (void)manager_->swap_in(id);
  }

  // The engine frees a sequence once the step that computes it is over.
  void free_one() {
    std::vector<SeqId> ids;
    for (const auto& [id, s] : seqs_) {
      if (s.step_start < 0) ids.push_back(id);
    }
    if (ids.empty()) return;
    const SeqId id = ids[in_.u8() % ids.size()];
    if (!manager_->free(id).ok()) return fail_void("free ", id);
    seqs_.erase(id);
  }

  // The engine's step: the copies, then the computation with its saves.
  void end_step() {
    ++totals_.steps;
    const StepOps ops = manager_->take_step_ops();
    check("take_step_ops", 0);
    for (const BlockCopy& c : ops.swap_out) {
      if (is_state(c.group)) host_slots_[c.group][c.dst] = slots_[c.group][c.src];
    }
    for (const BlockCopy& c : ops.demote) {
      if (!is_state(c.group)) continue;
      host_slots_[c.group][c.dst] = slots_[c.group][c.src];
      ++totals_.demotes;
    }
    for (const BlockCopy& c : ops.copy_state) slots_[c.group][c.dst] = slots_[c.group][c.src];
    for (const BlockCopy& c : ops.swap_in) {
      if (is_state(c.group)) slots_[c.group][c.dst] = host_slots_[c.group][c.src];
    }
    for (const BlockCopy& c : ops.promote) {
      if (!is_state(c.group)) continue;
      slots_[c.group][c.dst] = host_slots_[c.group][c.src];
      ++totals_.host_restores;
    }
    // Before the computation every running sequence's slot holds its computed prefix's
    // state: the zero state for one that starts at token 0.
    for (auto& [id, s] : seqs_) {
      const auto view = manager_->sequence(id);
      if (view->state != SequenceState::kRunning) continue;
      const int32_t start = s.step_start >= 0 ? s.step_start : view->num_computed_tokens;
      for (const int32_t g : state_groups_) {
        const BlockId slot = manager_->sequence(id, g)->block_table[0];
        if (start == 0 && s.step_start == 0) slots_[g][slot] = 0;
        const uint64_t want = extend(0, std::span(s.tokens).first(start));
        if (slots_[g][slot] != want) {
          return fail_void("seq ", id, " group ", g, " slot ", slot, ": state of another prefix ",
                           "before the step's computation from token ", start);
        }
      }
    }
    for (const StateSave& save : ops.save_state) {
      const Seq& s = seqs_.count(save.seq) ? seqs_[save.seq] : Seq{};
      if (s.step_start < 0 || save.position < s.step_start ||
          save.position > static_cast<int32_t>(s.tokens.size())) {
        return fail_void("save of seq ", save.seq, " at ", save.position,
                         " outside its computation this step");
      }
      const auto tokens = std::span(s.tokens).subspan(s.step_start, save.position - s.step_start);
      slots_[save.group][save.dst] = extend(slots_[save.group][save.src], tokens);
      ++totals_.saves;
    }
    // The state after each verified token is updated in place; after each draft it goes to
    // the draft's slot.
    for (auto& [id, s] : seqs_) {
      if (s.step_start < 0) continue;
      const auto view = manager_->sequence(id);
      if (view->state == SequenceState::kRunning) {
        const auto verified = view->num_computed_tokens - std::ssize(s.draft);
        const auto tokens = std::span(s.tokens).subspan(s.step_start, verified - s.step_start);
        for (const int32_t g : state_groups_) {
          const BlockId slot = manager_->sequence(id, g)->block_table[0];
          slots_[g][slot] = extend(slots_[g][slot], tokens);
          uint64_t state = slots_[g][slot];
          for (size_t j = 0; j < s.draft.size(); ++j) {
            state = extend(state, std::span(s.draft).subspan(j, 1));
            slots_[g][s.draft_slots[g][j]] = state;
          }
        }
      }
      s.step_start = -1;
    }
    judge_drafts();
  }

  bool is_state(int32_t group) const { return slots_.count(group) != 0; }

  template <typename... Parts>
  void check(const Parts&... where) {
    if (const absl::Status s = manager_->check_invariants(); !s.ok()) {
      fail(where..., ": ", s.ToString());
    }
  }

  // A first input byte that adds draft steps (no saved input starts with it).
  static constexpr uint8_t kSpeculativeMarker = 254;

  ByteSource in_;
  Hooks hooks_;
  bool speculative_ = false;
  std::optional<KvCacheManager> manager_;
  std::vector<int32_t> state_groups_;
  std::map<int32_t, std::vector<uint64_t>> slots_;  // per state group: per slot, its state
  std::map<int32_t, std::vector<uint64_t>> host_slots_;
  std::map<SeqId, Seq> seqs_;
  SeqId next_id_ = 1;
  StateOpsTotals totals_;
};

inline std::string run_state_ops(std::span<const uint8_t> data, StateOpsTotals* totals = nullptr) {
  return StateOpRunner(data).run(totals);
}

}  // namespace pagedkv::testing

#endif  // PAGEDKV_TESTS_SUPPORT_STATE_OPS_H_
