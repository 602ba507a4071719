#include "studies/contiguous_allocator.h"

#include <algorithm>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "studies/contiguous_arena.h"

namespace pagedkv::sim {
namespace {

class ContiguousAllocator final : public SimAllocator {
 public:
  ContiguousAllocator(int64_t budget_tokens, int32_t max_model_len, bool oracle)
      : arena_(budget_tokens), max_model_len_(max_model_len), oracle_(oracle) {}

  absl::Status add(SeqId seq, std::span<const TokenId> prompt, int32_t final_tokens,
                   int32_t num_forks) override {
    if (seqs_.contains(seq)) {
      return absl::AlreadyExistsError(absl::StrCat("add: sequence ", seq, " exists"));
    }
    if (prompt.empty() || final_tokens < static_cast<int32_t>(prompt.size()) ||
        final_tokens > max_model_len_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "add(seq ", seq, "): need 0 < prompt (", prompt.size(), ") <= final_tokens (",
          final_tokens, ") <= max_model_len (", max_model_len_, ")"));
    }
    Seq s;
    s.num_tokens = static_cast<int32_t>(prompt.size());
    s.region = oracle_ ? final_tokens : max_model_len_;
    s.num_forks = num_forks;
    if (s.region * int64_t{1 + num_forks} > arena_.num_slots()) {
      return absl::InvalidArgumentError(
          absl::StrCat("add(seq ", seq, "): ", 1 + num_forks, " reservations of ", s.region,
                       " slots exceed the budget of ", arena_.num_slots(), " slots"));
    }
    seqs_.emplace(seq, s);
    return absl::OkStatus();
  }

  absl::StatusOr<Work> admit(SeqId seq, int32_t max_tokens) override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("admit: unknown ", seq));
    Seq& s = it->second;
    if (s.offset >= 0) {
      return absl::FailedPreconditionError(absl::StrCat("admit(seq ", seq, "): already running"));
    }
    // The sequence and the children it forks are reserved together, all or nothing.
    std::vector<int64_t> taken;
    for (int32_t i = 0; i <= s.num_forks; ++i) {
      absl::StatusOr<int64_t> offset = arena_.allocate(s.region);
      if (!offset.ok()) {
        for (int64_t o : taken) (void)arena_.release(o);
        return offset.status();
      }
      taken.push_back(*offset);
    }
    s.offset = taken[0];
    s.spare.assign(taken.begin() + 1, taken.end());
    s.num_forks = 0;
    return compute(s, max_tokens);
  }

  absl::StatusOr<Work> reserve(SeqId seq, bool /*may_preempt*/, int32_t max_tokens) override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("reserve: unknown ", seq));
    Seq& s = it->second;
    if (s.offset < 0) {
      return absl::FailedPreconditionError(absl::StrCat("reserve(seq ", seq, "): not running"));
    }
    return compute(s, max_tokens);
  }

  absl::Status preempt(SeqId seq) override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end() || it->second.offset < 0) {
      return absl::FailedPreconditionError(absl::StrCat("preempt(seq ", seq, "): not running"));
    }
    release_regions(it->second);
    it->second.computed = 0;
    ++preemptions_;
    notify_preempted(seq, PreemptionMode::kRecompute);
    return absl::OkStatus();
  }

  absl::Status swap_in(SeqId seq) override {
    return absl::FailedPreconditionError(
        absl::StrCat("swap_in(seq ", seq, "): contiguous sequences are never swapped"));
  }

  absl::Status append(SeqId seq, TokenId /*token*/) override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("append: unknown ", seq));
    Seq& s = it->second;
    if (s.num_tokens + 1 > s.region) {
      return absl::InvalidArgumentError(absl::StrCat("append(seq ", seq, "): ", s.num_tokens + 1,
                                                     " tokens exceed its reservation of ",
                                                     s.region));
    }
    ++s.num_tokens;
    return absl::OkStatus();
  }

  absl::Status fork(SeqId parent, SeqId child) override {
    auto it = seqs_.find(parent);
    if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("fork: unknown ", parent));
    if (seqs_.contains(child)) {
      return absl::AlreadyExistsError(absl::StrCat("fork: child ", child, " exists"));
    }
    Seq& p = it->second;
    if (p.offset < 0) {
      return absl::FailedPreconditionError(absl::StrCat("fork(parent ", parent, "): not running"));
    }
    Seq c = p;
    c.spare.clear();
    c.num_forks = 0;
    if (!p.spare.empty()) {
      c.offset = p.spare.back();
      p.spare.pop_back();
    } else {
      // A contiguous child copies the parent's KV into a reservation of its own.
      absl::StatusOr<int64_t> offset = arena_.allocate(p.region);
      if (!offset.ok()) return offset.status();
      c.offset = *offset;
    }
    seqs_.emplace(child, std::move(c));
    return absl::OkStatus();
  }

  absl::Status free(SeqId seq) override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("free: unknown ", seq));
    release_regions(it->second);
    seqs_.erase(it);
    return absl::OkStatus();
  }

  AllocatorUsage usage(std::span<const SeqId> running) const override {
    AllocatorUsage u;
    for (SeqId id : running) {
      auto it = seqs_.find(id);
      if (it != seqs_.end() && it->second.offset >= 0) u.token_slots += it->second.computed;
    }
    u.reserved_slots = arena_.reserved_slots();
    return u;
  }

  AllocatorCounters counters() const override { return {.preemptions_recompute = preemptions_}; }

  std::string describe() const override {
    return absl::StrCat(seqs_.size(), " sequences, ", arena_.reserved_slots(), " of ",
                        arena_.num_slots(), " slots reserved, largest hole ",
                        arena_.largest_hole());
  }

 private:
  struct Seq {
    int32_t num_tokens = 0;
    int32_t computed = 0;
    int64_t region = 0;   // slots reserved per sequence
    int64_t offset = -1;  // -1: not admitted
    int32_t num_forks = 0;
    std::vector<int64_t> spare;  // reserved for children not yet forked
  };

  // Up to max_tokens of the sequence's uncomputed tokens (its region is reserved already).
  static Work compute(Seq& s, int32_t max_tokens) {
    const int32_t work = std::min(s.num_tokens - s.computed, std::max(max_tokens, 0));
    s.computed += work;
    return {.tokens = work, .remaining = s.num_tokens - s.computed};
  }

  void release_regions(Seq& s) {
    if (s.offset >= 0) (void)arena_.release(s.offset);
    for (int64_t o : s.spare) (void)arena_.release(o);
    s.offset = -1;
    s.spare.clear();
  }

  ContiguousArena arena_;
  int32_t max_model_len_;
  bool oracle_;
  int64_t preemptions_ = 0;
  absl::flat_hash_map<SeqId, Seq> seqs_;
};

}  // namespace

std::unique_ptr<SimAllocator> make_contiguous_allocator(int64_t budget_tokens,
                                                        int32_t max_model_len, bool oracle) {
  return std::make_unique<ContiguousAllocator>(budget_tokens, max_model_len, oracle);
}

}  // namespace pagedkv::sim
