// File: pagedkv/decode_plan.h
//
// DecodePlan: how paged decode attention splits each sequence's context (split-K, a.k.a.
// flash-decoding). Planned on the host from the batch shape and the machine (SM count and
// CTAs per SM on CUDA; one "SM" on CPU), and consumed alike by the CPU reference and the
// CUDA kernels, so both split the same way. No Abseil dependency.
//
// The grid is fixed by the plan: (num_seqs, num_kv_heads, num_splits) CTAs. Split z of a
// sequence of `len` tokens covers tokens [z * tokens_per_split, (z + 1) * tokens_per_split)
// clipped to len; the last split also takes any tokens beyond num_splits *
// tokens_per_split, so a max_context_len hint that is too small costs balance, never
// correctness. A split with no tokens exits early and contributes an empty state (zeros),
// which keeps the grid fixed for CUDA graphs.
//
// Example:
//   DecodePlan plan = plan_decode({.num_seqs = 1, .num_kv_heads = 8,
//                                  .max_context_len = 32768, .block_size = 16,
//                                  .num_sms = 132, .ctas_per_sm = 4});
//   // plan.num_splits == 64, plan.tokens_per_split == 512
#ifndef PAGEDKV_DECODE_PLAN_H_
#define PAGEDKV_DECODE_PLAN_H_

#include <algorithm>
#include <cstdint>

namespace pagedkv {

// Most splits the automatic plan uses, and the fewest tokens it gives one split.
inline constexpr int32_t kMaxAutoSplits = 64;
inline constexpr int32_t kMinTokensPerSplit = 256;
// Most splits a caller may force.
inline constexpr int32_t kMaxSplits = 1024;

struct DecodePlanInputs {
  int32_t num_seqs = 0;
  int32_t num_kv_heads = 0;
  int32_t max_context_len = 0;   // tokens; an upper bound of the batch's context lengths
  int32_t block_size = 16;       // tokens per block; splits are whole blocks
  int32_t num_sms = 1;           // streaming multiprocessors (1 on CPU)
  int32_t ctas_per_sm = 1;       // resident decode CTAs per SM
  int32_t requested_splits = 0;  // 0: automatic; 1: no split; n > 1: exactly n splits
};

struct DecodePlan {
  int32_t num_splits = 1;        // CTAs per (sequence, KV head)
  int32_t tokens_per_split = 0;  // multiple of block_size; 0 when num_splits == 1
};

// Plans the split of a decode batch. Automatic: split only when the batch has fewer CTAs
// (num_seqs * num_kv_heads) than the machine holds (num_sms * ctas_per_sm), into as many
// splits as still fit in one wave, at most kMaxAutoSplits and at least kMinTokensPerSplit
// tokens each.
// Forced: requested_splits (capped at kMaxSplits) splits of equal whole-block size.
inline DecodePlan plan_decode(const DecodePlanInputs& in) {
  DecodePlan plan;
  const int64_t max_blocks =
      (int64_t{std::max(in.max_context_len, 0)} + in.block_size - 1) / std::max(in.block_size, 1);
  int64_t splits = 1;
  if (in.requested_splits > 1) {
    splits = std::min(in.requested_splits, kMaxSplits);
  } else if (in.requested_splits == 0 && max_blocks > 0) {
    const int64_t ctas = int64_t{in.num_seqs} * in.num_kv_heads;
    const int64_t slots = int64_t{std::max(in.num_sms, 1)} * std::max(in.ctas_per_sm, 1);
    if (ctas > 0 && ctas < slots) {
      // Whole multiples only: ceil would start a partial second wave whose few CTAs
      // cannot saturate memory bandwidth on their own.
      const int64_t by_occupancy = slots / ctas;
      const int64_t by_length = std::max<int64_t>(1, in.max_context_len / kMinTokensPerSplit);
      splits = std::min<int64_t>({by_occupancy, by_length, kMaxAutoSplits});
    }
  }
  if (splits <= 1 || max_blocks == 0) return plan;
  const int64_t blocks_per_split = (max_blocks + splits - 1) / splits;
  plan.num_splits = static_cast<int32_t>(splits);
  plan.tokens_per_split = static_cast<int32_t>(blocks_per_split * in.block_size);
  return plan;
}

// Bytes of fp32 partials a split plan needs: o [num_splits, num_seqs, num_q_heads,
// head_dim] and (m, l) [num_splits, num_seqs, num_q_heads, 2]. Zero without a split.
inline int64_t decode_workspace_bytes(const DecodePlan& plan, int32_t num_seqs, int32_t num_q_heads,
                                      int32_t head_dim) {
  if (plan.num_splits <= 1) return 0;
  return int64_t{plan.num_splits} * num_seqs * num_q_heads * (head_dim + 2) *
         static_cast<int64_t>(sizeof(float));
}

}  // namespace pagedkv

#endif  // PAGEDKV_DECODE_PLAN_H_
