// libFuzzer target: the input bytes decode to a manager with one or two state groups (and
// now and then a sliding-window group, or a host tier that demotes and restores
// checkpoints) and a run of operations and steps
// (tests/support/state_ops.h), checked after every operation by check_invariants() and,
// every step, by a simulated engine whose states are fingerprints of the tokens they
// cover: a sequence that starts a step with another prefix's state fails. A first byte of
// 254 adds draft steps (a state per draft, the accepted one kept). A failed check prints the
// report and aborts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "support/state_ops.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string error = pagedkv::testing::run_state_ops({data, size});
  if (!error.empty()) {
    std::fprintf(stderr, "%s", error.c_str());
    std::abort();
  }
  return 0;
}
