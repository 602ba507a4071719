// Preemption policy: which claim to release, which running sequence to preempt.
#include "cache/preemption_policy.h"

#include <algorithm>

namespace pagedkv::internal {

namespace {

// Lowest priority first, then latest arrival.
template <typename T>
bool preempt_before(const T& a, const T& b) {
  if (a.priority != b.priority) return a.priority < b.priority;
  return a.arrival > b.arrival;
}

}  // namespace

Sequence* claim_to_release(const SequenceMap& sequences, SeqId requester,
                           absl::FunctionRef<bool(const Sequence&)> frees_a_block) {
  Sequence* chosen = nullptr;
  for (const auto& [id, owned] : sequences) {
    const Sequence* s = owned.get();  // clang 14 cannot capture a structured binding
    if (id == requester || s->state != SequenceState::kWaiting) continue;
    if (frees_a_block(*s) && (chosen == nullptr || preempt_before(*s, *chosen))) {
      chosen = owned.get();
    }
  }
  return chosen;
}

std::optional<Preemption> choose_victim(std::span<const SequenceInfo> candidates, SeqId requester,
                                        const VictimPolicy& policy, PreemptionMode mode,
                                        absl::FunctionRef<bool(SeqId)> fits_host) {
  if (candidates.empty()) return std::nullopt;
  std::optional<Preemption> choice;
  if (policy) {
    choice = policy(candidates, requester);
  } else {
    const SequenceInfo& victim =
        *std::min_element(candidates.begin(), candidates.end(), preempt_before<SequenceInfo>);
    choice = Preemption{victim.id, mode == PreemptionMode::kSwap && !fits_host(victim.id)
                                       ? PreemptionMode::kRecompute
                                       : mode};
  }
  if (!choice.has_value()) return std::nullopt;
  const bool is_candidate =
      std::any_of(candidates.begin(), candidates.end(),
                  [&](const SequenceInfo& info) { return info.id == choice->victim; });
  return is_candidate ? choice : std::nullopt;
}

}  // namespace pagedkv::internal
