// Names of the K/V mechanisms (see mechanism.h).
#include "mechanism.h"

namespace decode_loop {

const char* mechanism_name(Mechanism mechanism) {
  switch (mechanism) {
    case Mechanism::kCowCopy:
      return "cow-copy";
    case Mechanism::kSwapIn:
      return "swap-in";
    case Mechanism::kRecompute:
      return "recompute";
    case Mechanism::kFork:
      return "fork";
    case Mechanism::kPromote:
      return "promote";
    case Mechanism::kExchange:
      return "exchange";
    case Mechanism::kDemote:
      return "demote";
    case Mechanism::kPrefixHit:
      return "prefix-hit";
    case Mechanism::kStateRestore:
      return "state-restore";
    case Mechanism::kStateHostRestore:
      return "state-host-restore";
    case Mechanism::kRemote:
      return "remote";
    case Mechanism::kRollback:
      return "rollback";
    case Mechanism::kTransfer:
      return "transfer";
  }
  return "unknown";
}

const char* picked_as(Mechanism mechanism) {
  switch (mechanism) {
    case Mechanism::kCowCopy:
      return "copy-on-write copy";
    case Mechanism::kSwapIn:
      return "swap-preempted";
    case Mechanism::kRecompute:
      return "recompute-preempted";
    case Mechanism::kFork:
      return "forked sample";
    case Mechanism::kPromote:
      return "host-tier hit";
    case Mechanism::kExchange:
      return "host-tier exchange";
    case Mechanism::kDemote:
      return "hit a demoted block";
    case Mechanism::kPrefixHit:
      return "prefix-cache hit";
    case Mechanism::kStateRestore:
      return "restored from a checkpoint";
    case Mechanism::kStateHostRestore:
      return "restored from a host-tier checkpoint";
    case Mechanism::kRemote:
      return "loaded from the remote tier";
    case Mechanism::kRollback:
      return "drafts rolled back";
    case Mechanism::kTransfer:
      return "imported from the prefill engine";
  }
  return "unknown";
}

std::string mechanism_names(MechanismSet set) {
  std::string names;
  for (const Mechanism m : kMechanisms) {
    if (!set.contains(m)) continue;
    if (!names.empty()) names += ", ";
    names += mechanism_name(m);
  }
  return names.empty() ? "none" : names;
}

}  // namespace decode_loop
