// libFuzzer target for the hashing and verification path: like manager_fuzzer, but the
// manager gets an injected weak BlockHashFn chosen by the input (constant, first token only,
// no parent, no salt, two bits, ...), so that distinct blocks collide all the time, and
// prompts are built from adversarial contents (two-token alphabets, repeated block patterns,
// INT32_MIN/MAX tokens, salts). The reference model uses the same hash function and checks
// exact hit lengths; the data-flow simulation checks that no sequence ever reads a block
// whose content (prefix tokens and extra keys) differs from its own. An input whose first
// byte is ManagerOpRunner::kGroupsMarker (252) runs layer groups: windowed groups verify
// their blocks along the first full group's chain, so collisions must not be shared there
// either.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "support/manager_ops.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string error =
      pagedkv::testing::run_manager_ops({data, size}, pagedkv::testing::OpProfile::kHash);
  if (!error.empty()) {
    std::fprintf(stderr, "%s", error.c_str());
    std::abort();
  }
  return 0;
}
