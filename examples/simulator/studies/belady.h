// File: examples/simulator/studies/belady.h
//
// The offline optimum of the eviction studies (eviction.h): Belady's MIN under the same
// replay rule, counting hits the same way. Not an allocator: it knows the future. On a miss
// with a full pool, it evicts the cached block whose next use (in the flattened reference
// stream) is farthest in the future; a missing block whose own next use is farther than
// every cached block's is not inserted (bypass), which is what makes MIN optimal. Parents
// are always used no later than their children, so the pool stays prefix-closed and "longest
// cached prefix" equals "blocks present".
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_STUDIES_BELADY_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_STUDIES_BELADY_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "eviction.h"

namespace pagedkv::sim {

// Belady (MIN) replay with `capacity` blocks. Errors: InvalidArgument when capacity < 1.
[[nodiscard]] absl::StatusOr<ReplayResult> replay_belady(const BlockStreams& streams,
                                                         int64_t capacity);

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_STUDIES_BELADY_H_
