// File: examples/decode_loop/verify.h
//
// --verify N: regenerates N of the engine's sequences with the dense, cache-free reference
// and requires identical tokens. The sequences are picked to cover what could go wrong:
// ones preempted by swap and by recompute, forked samples (copy-on-write), and prompts
// served from the prefix cache, then others spread over the workload.
#ifndef PAGEDKV_EXAMPLES_DECODE_LOOP_VERIFY_H_
#define PAGEDKV_EXAMPLES_DECODE_LOOP_VERIFY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model.h"
#include "pagedkv/dtype.h"
#include "scheduler.h"

namespace decode_loop {

struct VerifiedSequence {
  SeqId seq = 0;
  int64_t request = 0;
  int32_t sample = 0;
  std::string why;  // what this sequence went through ("swap-preempted", "forked", ...)
  int32_t num_tokens = 0;
  bool identical = false;
  int32_t first_mismatch = -1;   // generation step, or -1
  float gap_at_mismatch = 0.0f;  // dense top-2 logit gap there
};

struct VerifyResult {
  int32_t requested = 0;
  std::vector<VerifiedSequence> sequences;
  double seconds = 0.0;
  bool passed() const;
};

absl::StatusOr<VerifyResult> verify(const Model& model, const Engine& engine, int32_t count,
                                    pagedkv::DType kv_dtype);

}  // namespace decode_loop

#endif  // PAGEDKV_EXAMPLES_DECODE_LOOP_VERIFY_H_
