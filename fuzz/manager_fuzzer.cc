// libFuzzer target: the input bytes decode to manager options and a sequence of valid and
// invalid KvCacheManager operations (tests/support/manager_ops.h), checked after every
// operation against check_invariants(), the reference model and the KV data-flow simulation.
// An input whose first byte is ManagerOpRunner::kGroupsMarker (252) runs a manager of 1 to 3
// layer groups (full, sliding window, chunked local), checked group by group; one whose first
// byte is ManagerOpRunner::kSpeculativeMarker (254) adds speculative decoding: draft slots and
// their verdicts (fuzz/corpus/manager/speculative-* seed it). Uses the real XXH3-128 block
// hash. A failed check prints the report and aborts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "support/manager_ops.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string error =
      pagedkv::testing::run_manager_ops({data, size}, pagedkv::testing::OpProfile::kManager);
  if (!error.empty()) {
    std::fprintf(stderr, "%s", error.c_str());
    std::abort();
  }
  return 0;
}
