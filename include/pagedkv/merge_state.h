// File: pagedkv/merge_state.h
//
// MergeState: the softmax state of attention over a subset of the keys, and its
// log-sum-exp merge. One type serves the split-K combine on CUDA, the online softmax of
// both kernels, and the CPU reference. No Abseil dependency.
//
// Scores are kept in base 2 (the kernels fold log2(e) into the softmax scale and use
// exp2). For keys j of the subset with scaled scores s_j:
//   m = max_j s_j          (-inf for an empty subset)
//   l = sum_j 2^(s_j - m)  (0 for an empty subset)
//   o = sum_j 2^(s_j - m) v_j   (unnormalized; the caller owns the vector)
// The attention output of the subset is o / l, and its natural log-sum-exp is
// (m + log2 l) * ln 2.
//
// Merging a into b scales a's vector by 2^(m_a - m) and b's by 2^(m_b - m), m = max(m_a,
// m_b). An empty state has m = -inf: its scale is exp2(-inf) = 0, its l and o are 0, so it
// merges as an exact no-op, and two empty states merge to an empty state (never NaN: the
// both-empty case is selected before any -inf - -inf is formed).
//
// Example (merging split z's state part[z] and vector part_o[z] in order, head_dim D):
//   MergeState total;
//   float o[D] = {};
//   for (int z = 0; z < num_splits; ++z) {
//     const MergeScales s = merge_into(total, part[z]);
//     for (int d = 0; d < D; ++d) o[d] = o[d] * s.self + part_o[z][d] * s.other;
//   }
//   // output = o[d] * inv_sum(total); lse = natural_lse(total)
#ifndef PAGEDKV_MERGE_STATE_H_
#define PAGEDKV_MERGE_STATE_H_

#include <cmath>

#include "pagedkv/host_device.h"

namespace pagedkv {

struct MergeState {
  float m = -INFINITY;  // max scaled score, base 2; -inf when empty
  float l = 0.0f;       // sum of 2^(s - m)
};

// Factors to apply to the two vectors being merged.
struct MergeScales {
  float self;   // multiplies the vector of the state merged into
  float other;  // multiplies the vector of the state merged from
};

// Merges `other` into `state` and returns the vector scales.
PAGEDKV_HOST_DEVICE PAGEDKV_INLINE MergeScales merge_into(MergeState& state,
                                                          const MergeState& other) {
  const float m = fmaxf(state.m, other.m);
  if (m == -INFINITY) return {1.0f, 0.0f};  // both empty: stays empty
  const float self = exp2f(state.m - m);    // exp2(-inf) == 0 for an empty side
  const float scale_other = exp2f(other.m - m);
  state.m = m;
  state.l = state.l * self + other.l * scale_other;
  return {self, scale_other};
}

// Raises the running max of `state` to at least `new_max` (the max of a tile of scores)
// and returns the factor for the state's vector; the caller then adds 2^(s - state.m)
// for each score of the tile to l and o.
PAGEDKV_HOST_DEVICE PAGEDKV_INLINE float raise_max(MergeState& state, float new_max) {
  if (new_max <= state.m) return 1.0f;
  const float scale = exp2f(state.m - new_max);  // 0 when the state was empty
  state.m = new_max;
  state.l *= scale;
  return scale;
}

// 1 / l, or 0 for an empty state (its output is zeros).
PAGEDKV_HOST_DEVICE PAGEDKV_INLINE float inv_sum(const MergeState& state) {
  return state.l > 0.0f ? 1.0f / state.l : 0.0f;
}

// Natural log-sum-exp of the scaled scores: (m + log2 l) * ln 2, or -inf when empty.
PAGEDKV_HOST_DEVICE PAGEDKV_INLINE float natural_lse(const MergeState& state) {
  return state.l > 0.0f ? (state.m + log2f(state.l)) * 0.69314718055994531f : -INFINITY;
}

}  // namespace pagedkv

#endif  // PAGEDKV_MERGE_STATE_H_
