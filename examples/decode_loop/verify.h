// File: examples/decode_loop/verify.h
//
// --verify N: checks N of the engine's sequences against the dense, cache-free reference
// by teacher forcing. The reference is fed the engine's own tokens (dense_logits()), and
// at every generated position the logits the engine sampled from are compared with the
// reference's:
//   1. max |engine - reference| over the vocabulary must stay within the bound of the
//      cache dtype (logit_bound(); non-finite logits always fail);
//   2. the engine's token must be what the reference picks from its own logits with the
//      same sampling draw, or else a near-tie:
//        greedy   each side's token is in the other's top kNearTieTopK, and each side's
//                 log-probability gap between the two tokens is at most the bound (the
//                 criterion vLLM's tests use for low-precision runs);
//        sampled  the draw lies within tanh(d / 2T) of the reference's interval for the
//                 engine's token, d being the logit difference measured at that position:
//                 the largest shift of the cumulative distribution that d can cause.
// Teacher forcing keeps comparing after a near-tie: every position is checked.
//
// Which sequences: VerifySelection picks them as they finish (the engine keeps logits
// only for running sequences and for those picked). Where the faults are: a finished
// sequence whose K/V went through a mechanism (mechanism.h) that no pick went through yet
// is picked, making room when full by dropping the latest pick whose mechanisms the
// other picks cover; the rest are spread over the finishing order. Dropping only such
// picks never uncovers a mechanism. While one of the E mechanisms a run exercises is
// missing, at most E - 1 picks can each be the only one through some mechanism, so with
// count >= E (at most kMechanisms.size()) a full selection always has a pick to drop:
// every mechanism the run exercised is covered. `--verify all` verifies every sequence.
#ifndef PAGEDKV_EXAMPLES_DECODE_LOOP_VERIFY_H_
#define PAGEDKV_EXAMPLES_DECODE_LOOP_VERIFY_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kv_format.h"
#include "mechanism.h"
#include "model.h"
#include "pagedkv/dtype.h"
#include "scheduler.h"

namespace decode_loop {

// Top-k of the greedy near-tie criterion.
inline constexpr int32_t kNearTieTopK = 5;

// Largest |engine logit - reference logit| accepted with a cache of `dtype` for the model
// preset `model` (see docs/decode-loop.md for the derivation and the measured differences).
float logit_bound(pagedkv::DType dtype, ModelKind model = ModelKind::kLlama);

class VerifySelection {
 public:
  // Picks up to `count` of the run's `total_sequences` sequences.
  VerifySelection(int32_t count, int64_t total_sequences);

  // EngineOptions::on_finish: keeps `finished` (moving out its logits) if it is picked.
  void offer(SequenceRecord& finished);

  struct Pick {
    SequenceRecord record;  // with its logits
    std::string why;        // picked_as() of the first mechanism it covered, or "spread"
    int32_t rank = 0;       // that mechanism's index in kMechanisms; spread picks last
  };
  // In rank order, then finishing order.
  std::vector<Pick> take_picks();
  int32_t count() const { return count_; }

 private:
  void add(SequenceRecord& finished, std::string why, int32_t rank);
  // Drops the latest pick whose mechanisms the other picks cover; false if there is none.
  bool drop_redundant_pick();
  MechanismSet covered() const;

  int32_t count_;
  int64_t total_;
  int64_t stride_;
  int64_t finished_ = 0;
  std::vector<Pick> picks_;
};

enum class Verdict {
  kIdentical,  // every token the reference's pick, logits within the bound
  kNearTie,    // tokens differ only at near-ties, logits within the bound
  kFail,
};

struct VerifiedSequence {
  SeqId seq = 0;
  int64_t request = 0;
  int32_t sample = 0;
  std::string why;
  MechanismSet mechanisms;  // every mechanism that reached its K/V
  float temperature = 0.0f;
  int32_t num_tokens = 0;
  int32_t identical_tokens =
      0;  // tokens equal to the reference's picks before the first difference
  int32_t differing_tokens = 0;   // positions whose tokens differ
  float max_logit_diff = 0.0f;    // over every position and token (inf: non-finite logits)
  int32_t max_diff_position = 0;  // where it occurred
  Verdict verdict = Verdict::kIdentical;
  std::string detail;  // the first difference or failure, with its evidence
};

struct VerifyResult {
  int32_t requested = 0;
  pagedkv::DType cache_dtype = pagedkv::DType::kFloat32;
  float bound = 0.0f;
  std::vector<VerifiedSequence> sequences;
  double seconds = 0.0;
  bool passed() const;
  float max_logit_diff() const;
  MechanismSet covered() const;  // the mechanisms of the verified sequences
};

// Compares `rec` (its tokens and recorded logits) with the reference's teacher-forced
// logits [num_generated, vocab] and fills v's counts, largest difference, verdict and
// detail (v's identity fields are left as they are).
void compare_logits(const SequenceRecord& rec, std::span<const float> ref_logits, int32_t vocab,
                    float bound, VerifiedSequence* v);

// Verifies the picked sequences (in parallel threads) against the dense reference.
absl::StatusOr<VerifyResult> verify(const Model& model, std::vector<VerifySelection::Pick> picks,
                                    int32_t requested, const KvFormat& format);

const char* verdict_name(Verdict verdict);

}  // namespace decode_loop

#endif  // PAGEDKV_EXAMPLES_DECODE_LOOP_VERIFY_H_
