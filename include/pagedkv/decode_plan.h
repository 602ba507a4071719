// File: pagedkv/decode_plan.h
//
// DecodePlan: how paged decode attention splits each sequence's context (split-K, a.k.a.
// flash-decoding). Planned on the host from the batch shape and the machine (SM count and
// CTAs per SM on CUDA; one "SM" on CPU), and consumed alike by the CPU reference and the
// CUDA kernels, so both split the same way. No Abseil dependency.
//
// Splits are per-sequence chunks of tokens_per_split tokens: split z of a sequence of
// `len` tokens covers tokens [z * tokens_per_split, (z + 1) * tokens_per_split) clipped to
// len, so a short sequence of a skewed batch has few non-empty splits and a long one many;
// the last split also takes any tokens beyond num_splits * tokens_per_split, so a
// max_context_len hint that is too small costs balance, never correctness. For a windowed
// layer group the splits cover the window (from its start rounded down to a block), and
// plan_decode_for() passes the window's length (window + block_size - 1 at most) as
// max_context_len: the plan follows the window, not the context. A sequence
// that fits one split is finished by split 0 (no partials, no combine); an empty split
// exits at once, which keeps the grid (num_seqs, num_kv_heads, num_splits) fixed for
// CUDA graphs.
//
// Example:
//   DecodePlan plan = plan_decode({.num_seqs = 1, .num_kv_heads = 8,
//                                  .max_context_len = 32768, .block_size = 16,
//                                  .num_sms = 132, .ctas_per_sm = 3});
//   // plan.num_splits == 43, plan.tokens_per_split == 768: 344 CTAs in 396 slots
#ifndef PAGEDKV_DECODE_PLAN_H_
#define PAGEDKV_DECODE_PLAN_H_

#include <algorithm>
#include <cstdint>

namespace pagedkv {

// Fewest tokens the automatic plan gives one split, and the multiple its split sizes are
// rounded to (the CUDA kernel's tile).
inline constexpr int32_t kMinTokensPerSplit = 256;
inline constexpr int32_t kSplitGranularity = 64;
// Most splits a plan may have, forced or automatic (the CUDA grid's z limit).
inline constexpr int32_t kMaxSplits = 65535;

struct DecodePlanInputs {
  int32_t num_seqs = 0;
  int32_t num_kv_heads = 0;
  int32_t max_context_len = 0;    // tokens; an upper bound of the batch's context lengths
  int64_t total_context_len = 0;  // sum of the context lengths; 0: num_seqs x max_context_len
  int32_t block_size = 16;        // tokens per block; forced splits are whole blocks
  int32_t num_sms = 1;            // streaming multiprocessors (1 on CPU)
  int32_t ctas_per_sm = 1;        // resident decode CTAs per SM
  int32_t requested_splits = 0;   // 0: automatic; 1: no split; n > 1: exactly n splits
};

struct DecodePlan {
  int32_t num_splits = 1;        // CTAs per (sequence, KV head)
  int32_t tokens_per_split = 0;  // 0 when num_splits == 1
};

namespace internal {

// Fraction of the CTA slots of its last wave that `items` equal work items keep busy.
inline double wave_efficiency(int64_t items, int64_t slots) {
  const int64_t waves = (items + slots - 1) / slots;
  return static_cast<double>(items) / static_cast<double>(waves * slots);
}

// Splits of the longest sequence for the automatic plan: the batch counts as
// total / max_len sequences of the longest length (a skewed batch's short sequences add
// little work); the fewest splits whose CTAs fill >= 90% of the slots of their last wave,
// or the best filling when none does, with splits of at least kMinTokensPerSplit tokens
// and at most 4 splits or two waves of CTAs, whichever allows more.
inline int64_t auto_splits(const DecodePlanInputs& in, int64_t max_len) {
  const int64_t slots = int64_t{std::max(in.num_sms, 1)} * std::max(in.ctas_per_sm, 1);
  const int64_t total =
      in.total_context_len > 0 ? in.total_context_len : int64_t{in.num_seqs} * max_len;
  const int64_t ctas = std::max<int64_t>(1, total / max_len) * std::max(in.num_kv_heads, 1);
  const int64_t most =
      std::min<int64_t>({std::max<int64_t>(1, max_len / kMinTokensPerSplit),
                         std::max<int64_t>(4, (2 * slots + ctas - 1) / ctas), kMaxSplits});
  int64_t best = 1;
  for (int64_t s = 1; s <= most; ++s) {
    const double e = wave_efficiency(ctas * s, slots);
    if (e >= 0.9) return s;
    if (e > wave_efficiency(ctas * best, slots)) best = s;
  }
  return best;
}

}  // namespace internal

// Plans the split of a decode batch. Automatic: internal::auto_splits() splits of the
// longest sequence, as equal chunks rounded up to kSplitGranularity tokens. Forced:
// requested_splits (capped at kMaxSplits) splits of equal whole-block size.
inline DecodePlan plan_decode(const DecodePlanInputs& in) {
  DecodePlan plan;
  const int64_t max_len = std::max(in.max_context_len, 0);
  const int64_t block_size = std::max(in.block_size, 1);
  if (max_len == 0 || in.requested_splits == 1) return plan;
  if (in.requested_splits > 1) {
    const int64_t splits = std::min(in.requested_splits, kMaxSplits);
    const int64_t blocks = (max_len + block_size - 1) / block_size;
    plan.num_splits = static_cast<int32_t>(splits);
    plan.tokens_per_split = static_cast<int32_t>((blocks + splits - 1) / splits * block_size);
    return plan;
  }
  const int64_t splits = internal::auto_splits(in, max_len);
  int64_t tokens = (max_len + splits - 1) / splits;
  tokens = (tokens + kSplitGranularity - 1) / kSplitGranularity * kSplitGranularity;
  if (tokens >= max_len) return plan;
  plan.num_splits = static_cast<int32_t>((max_len + tokens - 1) / tokens);
  plan.tokens_per_split = static_cast<int32_t>(tokens);
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
