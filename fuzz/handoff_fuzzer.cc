// libFuzzer target: the input bytes decode to two engines, a prefill engine that exports
// computed prompts and a decode engine that imports them through a simulated transfer
// (lost and corrupt blocks, delays, lost senders, cancels), then decodes them with draft
// steps and preemption (tests/support/handoff_ops.h). Both managers are checked after every
// operation by check_invariants(), and each engine's K/V and states are fingerprints that
// must read back right wherever a sequence attends. A failed check prints the report and
// aborts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "support/handoff_ops.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string error = pagedkv::testing::run_handoff_ops({data, size});
  if (!error.empty()) {
    std::fprintf(stderr, "%s", error.c_str());
    std::abort();
  }
  return 0;
}
