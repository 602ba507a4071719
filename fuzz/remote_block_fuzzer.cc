// libFuzzer target for the remote block value format (pagedkv/remote_block_format.h):
// arbitrary bytes are decoded against a fixed block (refused unless they are its exact
// encoding, never a read outside the input), and a block built from the input round-trips
// and is refused after one identity change, bit flip or truncation the input chooses.
// The checks live in tests/support/remote_block_checks.h, which the unit tests replay.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "support/remote_block_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string error = pagedkv::testing::run_remote_block_checks({data, size});
  if (!error.empty()) {
    std::fprintf(stderr, "%s\n", error.c_str());
    std::abort();
  }
  return 0;
}
