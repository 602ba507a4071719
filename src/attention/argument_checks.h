// Argument checks shared by the attention and cache-write wrappers (attention.cc): each
// returns InvalidArgument naming the function, the value and the limit. CUDA arguments in
// device memory (table entries, sink logits) are the caller's contract and not read.
#ifndef PAGEDKV_SRC_ATTENTION_ARGUMENT_CHECKS_H_
#define PAGEDKV_SRC_ATTENTION_ARGUMENT_CHECKS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "pagedkv/attention.h"

namespace pagedkv::internal {

absl::Status invalid(const char* fn, const std::string& what);
// FailedPrecondition for kCuda without a usable device.
absl::Status check_device(const char* fn, Device device);
// `need_v`: false for an MLA cache (one latent pool, the K pool).
absl::Status validate_cache(const char* fn, Device device, const KvCacheView& c,
                            bool need_v = true);
absl::Status validate_dtypes(const char* fn, DType q_dtype, const KvCacheView& c);
absl::Status validate_attention_types(const char* fn, DType q_dtype, const KvCacheView& c,
                                      int32_t num_q_heads);
// The table's shape and pointers (both devices).
absl::Status validate_table_shape(const char* fn, Device device, const KvCacheView& c,
                                  const BlockTableView& t);
// The first token the query at `pos` attends (first_attended of a validated kind), for
// the table check.
int32_t first_read_token(AttentionKind kind, int32_t window, int64_t pos);
absl::Status validate_window(const char* fn, AttentionKind kind, int32_t window);
// CPU: sink logits are finite or -inf (no sink); CUDA: in device memory, unchecked.
absl::Status validate_sinks(const char* fn, Device device, const float* sinks, int32_t num_q_heads);

// CPU: every context length, and every table entry the kernel reads: those from the block
// of `first_read(i, len)` (the first token sequence i's queries attend: 0 for kFull) to
// ceil(len / block_size). On CUDA the ids and lengths are in device memory: the caller's
// contract.
template <typename FirstRead>
absl::Status validate_table_entries(const char* fn, Device device, const KvCacheView& c,
                                    const BlockTableView& t, FirstRead first_read) {
  if (device == Device::kCuda) return absl::OkStatus();
  const int64_t capacity = int64_t{t.max_blocks} * t.block_size;
  for (int32_t i = 0; i < t.num_seqs; ++i) {
    const int32_t len = t.context_lens[i];
    if (len < 0 || len > capacity) {
      return invalid(
          fn, absl::StrCat("sequence ", i, ": context length ", len, " outside [0, max_blocks ",
                           t.max_blocks, " x block_size ", t.block_size, " = ", capacity, "]"));
    }
    const int32_t used = num_blocks_for_tokens(len, t.block_size);
    const int32_t* row = t.block_table + int64_t{i} * t.max_blocks;
    for (int32_t e = first_read(i, len) / t.block_size; e < used; ++e) {
      if (row[e] < 0 || row[e] >= c.num_blocks) {
        return invalid(fn, absl::StrCat("sequence ", i, ": block table entry ", e, " is ", row[e],
                                        ", outside [0, num_blocks ", c.num_blocks, ")"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace pagedkv::internal

#endif  // PAGEDKV_SRC_ATTENTION_ARGUMENT_CHECKS_H_
