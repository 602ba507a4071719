// File: examples/simulator/studies/contiguous_arena.h
//
// The pre-paging baseline's memory: one contiguous range of token slots from which each
// request reserves a contiguous extent, placed first-fit (lowest address that fits), and
// returned whole when the request finishes. Adjacent free extents coalesce.
//   internal fragmentation: reserved slots that never hold a token (the reservation is
//                           the maximum length, the request is shorter);
//   external fragmentation: free slots split into holes too small for a reservation.
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_STUDIES_CONTIGUOUS_ARENA_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_STUDIES_CONTIGUOUS_ARENA_H_

#include <cstdint>
#include <map>

#include "absl/status/statusor.h"

namespace pagedkv::sim {

class ContiguousArena {
 public:
  // An arena of `num_slots` token slots (>= 0).
  explicit ContiguousArena(int64_t num_slots);

  // Reserves `size` (> 0) contiguous slots at the lowest offset that fits and returns the
  // offset. Errors: InvalidArgument for a non-positive size; ResourceExhausted
  // ("need N contiguous slots, largest hole H, F free of T") when no hole fits.
  [[nodiscard]] absl::StatusOr<int64_t> allocate(int64_t size);

  // Returns the extent [offset, offset + size) reserved by allocate(). Errors:
  // InvalidArgument when it is not a reserved extent.
  [[nodiscard]] absl::Status release(int64_t offset);

  int64_t num_slots() const { return num_slots_; }
  int64_t free_slots() const { return free_slots_; }
  int64_t reserved_slots() const { return num_slots_ - free_slots_; }
  int64_t largest_hole() const;
  int64_t num_holes() const { return static_cast<int64_t>(holes_.size()); }

 private:
  int64_t num_slots_ = 0;
  int64_t free_slots_ = 0;
  std::map<int64_t, int64_t> holes_;     // offset -> size, disjoint, never adjacent
  std::map<int64_t, int64_t> reserved_;  // offset -> size
};

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_STUDIES_CONTIGUOUS_ARENA_H_
