// The small value functions of kv_transfer.h.
#include "pagedkv/kv_transfer.h"

namespace pagedkv {

std::string_view kv_transfer_outcome_name(KvTransferOutcome outcome) {
  switch (outcome) {
    case KvTransferOutcome::kComplete:
      return "complete";
    case KvTransferOutcome::kFailed:
      return "failed";
    case KvTransferOutcome::kCancelled:
      return "cancelled";
    case KvTransferOutcome::kTimedOut:
      return "timed out";
  }
  return "unknown";
}

int32_t KvReceiveCompletion::verified_prefix(int32_t group) const {
  int32_t prefix = 0;
  for (const KvBlockResult& block : blocks) {
    if (block.group != group) continue;
    if (block.state != KvBlockState::kVerified) break;
    ++prefix;
  }
  return prefix;
}

int32_t KvReceiveCompletion::count(KvBlockState state) const {
  int32_t n = 0;
  for (const KvBlockResult& block : blocks) n += block.state == state ? 1 : 0;
  return n;
}

}  // namespace pagedkv
