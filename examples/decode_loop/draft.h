// File: examples/decode_loop/draft.h
//
// The drafters of --speculative, which propose the tokens a step verifies.
//   lookup  prompt lookup (vLLM's "ngram" speculator): a sequence's next tokens are guessed
//           from what followed the latest earlier occurrence of its last n tokens (n from
//           kMaxNgram down to 1). Repeats in prompts and outputs make guesses right; a wrong
//           one costs only its verification. No second model: only the target's K/V is
//           cached.
//   replay  the tokens a run of the same workload without speculation generated, each
//           replaced by another with probability kReplayErrorRate: a drafter as good as the
//           target model made wrong on purpose, so that steps accept every number of
//           drafts (the seeded model's text repeats too little for lookup to be accepted
//           often). Greedy decoding is deterministic, so the speculative run must generate
//           what the rehearsal did.
#ifndef PAGEDKV_EXAMPLES_DECODE_LOOP_DRAFT_H_
#define PAGEDKV_EXAMPLES_DECODE_LOOP_DRAFT_H_

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "pagedkv/types.h"
#include "scheduler.h"

namespace decode_loop {

inline constexpr int32_t kMaxNgram = 3;
// Most drafts a sequence proposes per step (--speculative N).
inline constexpr int32_t kMaxSpeculative = 16;
inline constexpr double kReplayErrorRate = 0.25;

// Up to `max_tokens` tokens that followed the latest earlier occurrence of the longest
// suffix of `tokens` (at most kMaxNgram long) found before it; empty when none is.
std::vector<pagedkv::TokenId> propose_draft(std::span<const pagedkv::TokenId> tokens,
                                            int32_t max_tokens);

class ReplayDrafter {
 public:
  // Wrong tokens are drawn from [0, vocab_size) by a hash of (seed, request, sample,
  // position): runs with one seed propose the same drafts.
  ReplayDrafter(double error_rate, uint64_t seed, int32_t vocab_size);

  // EngineOptions::on_finish of the rehearsal: keeps `finished`'s generated tokens.
  void record(const SequenceRecord& finished);

  // Up to `max_tokens` tokens after `rec`'s, from its recorded output; empty past its end
  // or for a sequence the rehearsal did not finish.
  std::vector<pagedkv::TokenId> propose(const SequenceRecord& rec, int32_t max_tokens) const;

 private:
  double error_rate_;
  uint64_t seed_;
  int32_t vocab_size_;
  absl::flat_hash_map<std::pair<int64_t, int32_t>, std::vector<pagedkv::TokenId>> outputs_;
};

}  // namespace decode_loop

#endif  // PAGEDKV_EXAMPLES_DECODE_LOOP_DRAFT_H_
