// File: examples/simulator/studies/contiguous_allocator.h
//
// The pre-paging baselines of the engine model (sim_allocator.h): each sequence reserves one
// contiguous extent of a ContiguousArena at admission and keeps it until it finishes,
// max_model_len slots (contiguous-max, Orca "Max") or exactly prompt + output
// (contiguous-oracle, Orca "Oracle", which needs the output length in advance: an upper
// bound for any reservation scheme). Forks take reservations of their own. A sequence never
// grows past its reservation, so it is never preempted. Not pagedkv: what paging is
// measured against.
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_STUDIES_CONTIGUOUS_ALLOCATOR_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_STUDIES_CONTIGUOUS_ALLOCATOR_H_

#include <cstdint>
#include <memory>

#include "sim_allocator.h"

namespace pagedkv::sim {

// An arena of `budget_tokens` slots; `oracle` reserves prompt + output, else max_model_len.
std::unique_ptr<SimAllocator> make_contiguous_allocator(int64_t budget_tokens,
                                                        int32_t max_model_len, bool oracle);

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_STUDIES_CONTIGUOUS_ALLOCATOR_H_
