// Unit tests of the decode loop's drafters: prompt lookup of the tokens after the latest
// earlier occurrence of a sequence's last tokens, and replayed outputs made wrong on purpose.
#include <catch2/catch.hpp>

#include <utility>
#include <vector>

#include "draft.h"

namespace decode_loop {
namespace {

using Tokens = std::vector<pagedkv::TokenId>;

TEST_CASE("prompt lookup drafts what followed the latest earlier match of the last tokens",
          "[decode_loop]") {
  // The last 3 tokens (7 8 9) occurred at 1; what followed: 4 5 7 8 ...
  CHECK(propose_draft(Tokens{1, 7, 8, 9, 4, 5, 7, 8, 9}, 3) == Tokens{4, 5, 7});
  // The latest of two matches wins, and the draft stops at the sequence's end.
  CHECK(propose_draft(Tokens{5, 1, 5, 2, 5}, 4) == Tokens{2, 5});
  // No 3- or 2-token match: a 1-token one.
  CHECK(propose_draft(Tokens{3, 6, 1, 2, 6}, 2) == Tokens{1, 2});
  // No match at all, or nothing before the suffix: no draft.
  CHECK(propose_draft(Tokens{1, 2, 3}, 4).empty());
  CHECK(propose_draft(Tokens{4}, 4).empty());
  CHECK(propose_draft(Tokens{}, 4).empty());
  // A longer match is preferred over a later shorter one: 2 3 at 0 (followed by 9), though
  // 3 alone occurs later (followed by 1).
  CHECK(propose_draft(Tokens{2, 3, 9, 3, 1, 2, 3}, 1) == Tokens{9});
}

SequenceRecord finished(int64_t request, int32_t sample, Tokens prompt, const Tokens& output) {
  SequenceRecord rec;
  rec.request = request;
  rec.sample = sample;
  rec.prompt_len = static_cast<int32_t>(prompt.size());
  rec.tokens = std::move(prompt);
  rec.tokens.insert(rec.tokens.end(), output.begin(), output.end());
  return rec;
}

TEST_CASE("replayed drafts are the recorded output, a share of them replaced", "[decode_loop]") {
  constexpr int32_t kVocab = 50;
  Tokens output(2000);
  for (size_t i = 0; i < output.size(); ++i) output[i] = static_cast<pagedkv::TokenId>(i % kVocab);
  ReplayDrafter exact(0.0, 7, kVocab), noisy(0.25, 7, kVocab);
  for (ReplayDrafter* d : {&exact, &noisy}) d->record(finished(3, 1, {9, 9, 9}, output));

  // A sequence partway through: the drafts continue after its generated tokens.
  SequenceRecord running = finished(3, 1, {9, 9, 9}, Tokens(output.begin(), output.begin() + 5));
  CHECK(exact.propose(running, 4) == Tokens(output.begin() + 5, output.begin() + 9));
  // Never past the recorded end, nothing for an unknown sequence.
  SequenceRecord near_end = finished(3, 1, {9, 9, 9}, Tokens(output.begin(), output.end() - 2));
  CHECK(exact.propose(near_end, 4).size() == 2);
  CHECK(exact.propose(finished(3, 2, {9, 9, 9}, {}), 4).empty());

  // From the start, every position: a wrong token is never the right one, about a quarter
  // are wrong, and the same seed proposes the same drafts.
  SequenceRecord fresh = finished(3, 1, {9, 9, 9}, {});
  const Tokens all = noisy.propose(fresh, static_cast<int32_t>(output.size()));
  REQUIRE(all.size() == output.size());
  int32_t wrong = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    CHECK(all[i] >= 0);
    CHECK(all[i] < kVocab);
    wrong += all[i] != output[i] ? 1 : 0;
  }
  CHECK(wrong > 400);  // 500 expected; binomial sd ~19
  CHECK(wrong < 600);
  ReplayDrafter again(0.25, 7, kVocab);
  again.record(finished(3, 1, {9, 9, 9}, output));
  CHECK(again.propose(fresh, 64) == Tokens(all.begin(), all.begin() + 64));
}

}  // namespace
}  // namespace decode_loop
