// File: examples/decode_loop/dense_reference.h
//
// The verification baseline: a plain dense transformer with no KV cache at all. Every step
// runs the model over the whole sequence from position 0 (prompt and every token generated
// so far), with causal attention over plain arrays, and takes the last row's logits. No
// paging, prefix cache, copy-on-write or preemption is involved, so when its tokens equal
// the paged engine's, those mechanisms changed nothing about the output.
//
// The K/V it attends over are rounded to the cache's dtype, as the paged cache stores them,
// so the two paths differ only in the order of attention's floating-point sums.
#ifndef PAGEDKV_EXAMPLES_DECODE_LOOP_DENSE_REFERENCE_H_
#define PAGEDKV_EXAMPLES_DECODE_LOOP_DENSE_REFERENCE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "model.h"
#include "pagedkv/dtype.h"
#include "sampling.h"

namespace decode_loop {

struct DenseResult {
  std::vector<TokenId> tokens;   // generated tokens, num_new of them
  std::vector<float> top2_gaps;  // logit gap of the top two at each step
};

// Generates `num_new` tokens after `prompt`, recomputing the whole prefix every step.
absl::StatusOr<DenseResult> dense_generate(const Model& model, std::span<const TokenId> prompt,
                                           int32_t num_new, const SamplingParams& sampling,
                                           pagedkv::DType kv_dtype);

}  // namespace decode_loop

#endif  // PAGEDKV_EXAMPLES_DECODE_LOOP_DENSE_REFERENCE_H_
