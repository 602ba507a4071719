// File: examples/decode_loop/dense_reference.h
//
// The verification baseline: a plain dense transformer with no KV cache at all. It runs
// the model over a whole sequence from position 0 with causal attention over plain
// arrays. No paging, prefix cache, copy-on-write or preemption is involved, so when its
// logits match the paged engine's, those mechanisms changed nothing about the output.
//
// Teacher forcing: dense_logits() is fed the engine's own tokens, so it gives the logits
// the reference computes at every position the engine generated, in one pass, even after
// a position where the two would have picked different tokens. (Each row's arithmetic is
// independent of the rows after it, so this equals regenerating step by step.)
//
// The K/V it attends over are rounded as the paged cache stores them (KvFormat), and q and
// out as the kernels take them, so the two paths differ only in the order of attention's
// floating-point sums and in where those sums cross a rounding boundary.
#ifndef PAGEDKV_EXAMPLES_DECODE_LOOP_DENSE_REFERENCE_H_
#define PAGEDKV_EXAMPLES_DECODE_LOOP_DENSE_REFERENCE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kv_format.h"
#include "model.h"

namespace decode_loop {

// Logits [num_rows, vocab_size] of the last `num_rows` positions of `tokens`: row i
// predicts the token after tokens[size - num_rows + i]. InvalidArgument when num_rows is
// outside [1, tokens.size()] or a token is outside the vocabulary.
absl::StatusOr<std::vector<float>> dense_logits(const Model& model, std::span<const TokenId> tokens,
                                                int32_t num_rows, const KvFormat& format);

// An fp8 e4m3 KvFormat with per-tensor scales calibrated on `tokens`: for each layer,
// the largest |K| (and |V|) of the dense fp32 pass maps to half of e4m3's largest value,
// leaving 2x headroom for tokens the calibration did not see (beyond it, the cache
// saturates). InvalidArgument for an empty or out-of-vocabulary calibration sequence.
absl::StatusOr<KvFormat> calibrate_fp8(const Model& model, std::span<const TokenId> tokens);

}  // namespace decode_loop

#endif  // PAGEDKV_EXAMPLES_DECODE_LOOP_DENSE_REFERENCE_H_
