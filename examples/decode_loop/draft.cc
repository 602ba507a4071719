// The drafters: prompt lookup over a sequence's own tokens, and replayed outputs.
#include "draft.h"

#include <algorithm>
#include <array>

#include "xxhash.h"

namespace decode_loop {

std::vector<pagedkv::TokenId> propose_draft(std::span<const pagedkv::TokenId> tokens,
                                            int32_t max_tokens) {
  const auto len = static_cast<int64_t>(tokens.size());
  for (int64_t n = std::min<int64_t>(kMaxNgram, len - 1); n >= 1; --n) {
    const std::span<const pagedkv::TokenId> suffix = tokens.last(static_cast<size_t>(n));
    // The latest start before the suffix's own; what follows it must be a token.
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      const int64_t first = start + n;
      const int64_t end = std::min(len, first + max_tokens);
      return {tokens.begin() + first, tokens.begin() + end};
    }
  }
  return {};
}

ReplayDrafter::ReplayDrafter(double error_rate, uint64_t seed, int32_t vocab_size)
    : error_rate_(error_rate), seed_(seed), vocab_size_(vocab_size) {}

void ReplayDrafter::record(const SequenceRecord& finished) {
  outputs_[{finished.request, finished.sample}].assign(
      finished.tokens.begin() + finished.prompt_len, finished.tokens.end());
}

std::vector<pagedkv::TokenId> ReplayDrafter::propose(const SequenceRecord& rec,
                                                     int32_t max_tokens) const {
  const auto it = outputs_.find(std::pair{rec.request, rec.sample});
  if (it == outputs_.end()) return {};
  const std::vector<pagedkv::TokenId>& output = it->second;
  const int32_t first = rec.num_generated();
  const int32_t end = std::min(static_cast<int32_t>(output.size()), first + max_tokens);
  std::vector<pagedkv::TokenId> draft;
  for (int32_t i = first; i < end; ++i) {
    const std::array<int64_t, 3> key = {rec.request, rec.sample, i};
    const uint64_t h = XXH3_64bits_withSeed(key.data(), sizeof(key), seed_);
    const bool wrong = static_cast<double>(h >> 11) * 0x1.0p-53 < error_rate_;
    // A wrong token is never the right one: 1 to vocab - 1 after it.
    const auto offset = static_cast<pagedkv::TokenId>(1 + h % (vocab_size_ - 1));
    draft.push_back(wrong ? (output[i] + offset) % vocab_size_ : output[i]);
  }
  return draft;
}

}  // namespace decode_loop
