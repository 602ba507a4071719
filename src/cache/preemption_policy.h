// Internal: whom KvCacheManager::allocate_slots_or_preempt() makes room with, when the
// pool lacks blocks. First the claims of waiting sequences (a claimed prefix is cheap to
// give back: its blocks stay cached), then running sequences chosen by the victim policy.
// The manager carries the choices out; these functions only choose.
#ifndef PAGEDKV_CACHE_PREEMPTION_POLICY_H_
#define PAGEDKV_CACHE_PREEMPTION_POLICY_H_

#include <memory>
#include <optional>
#include <span>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "cache/sequence.h"
#include "pagedkv/kv_cache_manager.h"

namespace pagedkv::internal {

using SequenceMap = absl::flat_hash_map<SeqId, std::unique_ptr<Sequence>>;

// The waiting sequence (other than `requester`) whose claim to release first: among those
// whose release frees a block (frees_a_block(s): one it alone holds, in any group), the
// lowest priority, then the latest arrival. nullptr when there is none.
Sequence* claim_to_release(const SequenceMap& sequences, SeqId requester,
                           absl::FunctionRef<bool(const Sequence&)> frees_a_block);

// The victim among `candidates` (running, not `requester`, not scheduled in this step):
// `policy`'s choice, or the default (lowest priority, then latest arrival, in `mode`;
// recompute when the host pools cannot hold it: fits_host(id)). nullopt when the
// candidates are empty, the policy gives up, or it names a sequence that is not a
// candidate.
std::optional<Preemption> choose_victim(std::span<const SequenceInfo> candidates, SeqId requester,
                                        const VictimPolicy& policy, PreemptionMode mode,
                                        absl::FunctionRef<bool(SeqId)> fits_host);

}  // namespace pagedkv::internal

#endif  // PAGEDKV_CACHE_PREEMPTION_POLICY_H_
