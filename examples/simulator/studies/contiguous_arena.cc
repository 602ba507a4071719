#include "studies/contiguous_arena.h"

#include <algorithm>
#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pagedkv::sim {

ContiguousArena::ContiguousArena(int64_t num_slots)
    : num_slots_(std::max<int64_t>(num_slots, 0)), free_slots_(num_slots_) {
  if (num_slots_ > 0) holes_.emplace(0, num_slots_);
}

int64_t ContiguousArena::largest_hole() const {
  int64_t largest = 0;
  for (const auto& [offset, size] : holes_) largest = std::max(largest, size);
  return largest;
}

absl::StatusOr<int64_t> ContiguousArena::allocate(int64_t size) {
  if (size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("allocate: size ", size, " must be > 0"));
  }
  // First fit: the lowest-addressed hole that is large enough.
  for (auto it = holes_.begin(); it != holes_.end(); ++it) {
    if (it->second < size) continue;
    const int64_t offset = it->first;
    const int64_t rest = it->second - size;
    holes_.erase(it);
    if (rest > 0) holes_.emplace(offset + size, rest);
    reserved_.emplace(offset, size);
    free_slots_ -= size;
    return offset;
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("need ", size, " contiguous slots, largest hole ", largest_hole(), ", ",
                   free_slots_, " free of ", num_slots_));
}

absl::Status ContiguousArena::release(int64_t offset) {
  auto it = reserved_.find(offset);
  if (it == reserved_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("release: offset ", offset, " is not a reserved extent"));
  }
  int64_t start = offset;
  int64_t size = it->second;
  reserved_.erase(it);
  free_slots_ += size;
  // Coalesce with the hole after and the hole before.
  auto next = holes_.lower_bound(start);
  if (next != holes_.end() && next->first == start + size) {
    size += next->second;
    next = holes_.erase(next);
  }
  if (next != holes_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      holes_.erase(prev);
    }
  }
  holes_.emplace(start, size);
  return absl::OkStatus();
}

}  // namespace pagedkv::sim
