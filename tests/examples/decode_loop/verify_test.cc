// Unit tests of the decode loop's verifier: the teacher-forced comparison's verdicts and
// near-tie criteria, and the choice of sequences as they finish.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "sampling.h"
#include "verify.h"

namespace decode_loop {
namespace {

constexpr int32_t kVocab = 16;
constexpr float kBound = 0.125f;

// A finished sequence with a one-token prompt whose generated tokens are the engine's picks
// from `logits` ([steps, kVocab]).
SequenceRecord record_from(const std::vector<float>& logits, float temperature) {
  SequenceRecord rec;
  rec.seq = 1;
  rec.tokens = {0};
  rec.prompt_len = 1;
  rec.sampling = {.temperature = temperature, .seed = 7, .request = 3, .sample = 1};
  rec.logits = logits;
  const auto steps = static_cast<int32_t>(logits.size()) / kVocab;
  for (int32_t t = 0; t < steps; ++t) {
    const std::span<const float> row(logits.data() + static_cast<size_t>(t) * kVocab, kVocab);
    rec.tokens.push_back(pick_token(row, rec.sampling, t));
  }
  return rec;
}

VerifiedSequence compare(const SequenceRecord& rec, const std::vector<float>& ref) {
  VerifiedSequence v;
  compare_logits(rec, ref, kVocab, kBound, &v);
  return v;
}

std::vector<float> ramp() {  // distinct logits, token 15 the largest
  std::vector<float> l(kVocab);
  for (int32_t i = 0; i < kVocab; ++i) l[i] = 0.5f * static_cast<float>(i);
  return l;
}

TEST_CASE("compare_logits: equal logits are identical, differences beyond the bound fail") {
  const std::vector<float> logits = ramp();
  const SequenceRecord rec = record_from(logits, 0.0f);
  VerifiedSequence v = compare(rec, logits);
  CHECK(v.verdict == Verdict::kIdentical);
  CHECK(v.identical_tokens == 1);
  CHECK(v.max_logit_diff == 0.0f);

  std::vector<float> ref = logits;
  ref[3] += 2 * kBound;  // the picked token is unchanged, a logit is not
  v = compare(rec, ref);
  CHECK(v.verdict == Verdict::kFail);
  CHECK(v.identical_tokens == 1);
  CHECK(v.max_logit_diff == Approx(2 * kBound));
  CHECK_THAT(v.detail, Catch::Contains("exceeds the bound"));

  ref = logits;
  ref[5] = std::numeric_limits<float>::quiet_NaN();
  v = compare(rec, ref);
  CHECK(v.verdict == Verdict::kFail);
  CHECK(std::isinf(v.max_logit_diff));
}

TEST_CASE("compare_logits: greedy near-ties need top-k membership and gaps within the bound") {
  std::vector<float> engine = ramp();
  engine[14] = engine[15] - 0.02f;  // a near tie between 15 and 14
  const SequenceRecord rec = record_from(engine, 0.0f);
  REQUIRE(rec.tokens[1] == 15);

  std::vector<float> ref = engine;
  ref[14] = engine[15] + 0.01f;  // the reference prefers 14, by 0.01
  VerifiedSequence v = compare(rec, ref);
  CHECK(v.verdict == Verdict::kNearTie);
  CHECK(v.identical_tokens == 0);
  CHECK(v.differing_tokens == 1);
  CHECK_THAT(v.detail, Catch::Contains("near-tie"));

  // Logits within the bound, but the reference's token is 6th in the engine's ranking: the
  // top of both distributions is a cluster of six nearly equal logits.
  std::vector<float> crowded = ramp();
  for (int32_t i = 10; i < 16; ++i) crowded[i] = 7.0f + 0.001f * static_cast<float>(i);
  const SequenceRecord crowded_rec = record_from(crowded, 0.0f);
  REQUIRE(crowded_rec.tokens[1] == 15);
  ref = crowded;
  ref[10] = 7.05f;  // lowest of the cluster for the engine, first for the reference
  v = compare(crowded_rec, ref);
  CHECK(v.verdict == Verdict::kFail);
  CHECK_THAT(v.detail, Catch::Contains("NOT a near-tie"));
}

TEST_CASE("compare_logits: a token that is not the pick of its own logits fails") {
  const std::vector<float> logits = ramp();
  SequenceRecord rec = record_from(logits, 0.0f);
  rec.tokens[1] = 2;
  const VerifiedSequence v = compare(rec, logits);
  CHECK(v.verdict == Verdict::kFail);
  CHECK_THAT(v.detail, Catch::Contains("not the pick of its own logits"));
}

// The sampled criterion rests on a bound: logits that differ by at most d move the
// cumulative softmax(logits / T) by at most tanh(d / 2T). Random perturbations must never
// produce a differing token outside it, and at this size some must flip a token.
TEST_CASE("compare_logits: sampled tokens flipped by small logit differences are near-ties") {
  constexpr int32_t kSteps = 4000;
  constexpr float kTemperature = 0.8f;
  uint64_t state = 12345;
  auto uniform = [&state] {  // SplitMix64 -> [0, 1)
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
  };
  std::vector<float> engine(static_cast<size_t>(kSteps) * kVocab);
  std::vector<float> ref(engine.size());
  for (int32_t t = 0; t < kSteps; ++t) {
    const auto d = static_cast<float>(0.05 * uniform());
    for (int32_t i = 0; i < kVocab; ++i) {
      const size_t k = static_cast<size_t>(t) * kVocab + i;
      engine[k] = static_cast<float>(4.0 * (uniform() - 0.5));
      ref[k] = engine[k] + static_cast<float>(d * (2.0 * uniform() - 1.0));
    }
  }
  const SequenceRecord rec = record_from(engine, kTemperature);
  const VerifiedSequence v = compare(rec, ref);
  INFO(v.detail);
  CHECK(v.verdict != Verdict::kFail);
  CHECK(v.differing_tokens > 0);
  CHECK(v.max_logit_diff <= 0.05f);
}

// A finished sequence that was swapped, recomputed, forked and hit `cached` tokens in the
// device prefix cache, as the engine marks them.
SequenceRecord finished(SeqId seq, int32_t swaps, int32_t recomputes, bool forked, int32_t cached) {
  SequenceRecord rec;
  rec.seq = seq;
  rec.tokens = {1, 2};
  rec.prompt_len = 1;
  if (swaps > 0) rec.mechanisms.add(Mechanism::kSwapIn);
  if (recomputes > 0) rec.mechanisms.add(Mechanism::kRecompute);
  if (forked) rec.mechanisms.add(Mechanism::kFork);
  if (cached > 0) rec.mechanisms.add(Mechanism::kPrefixHit);
  rec.logits.assign(kVocab, static_cast<float>(seq));
  return rec;
}

TEST_CASE("VerifySelection: a category pick replaces the latest spread pick when full") {
  VerifySelection selection(/*count=*/3, /*total_sequences=*/9);  // spread stride 3
  std::vector<SequenceRecord> recs = {
      finished(0, 0, 0, false, 0),   // spread (finish index 0)
      finished(1, 0, 0, false, 0),   // not picked
      finished(2, 0, 0, false, 0),   // not picked
      finished(3, 0, 0, false, 0),   // spread (index 3)
      finished(4, 0, 1, false, 0),   // recompute-preempted: the third pick
      finished(5, 1, 0, false, 0),   // swap-preempted: full, replaces spread 3
      finished(6, 1, 0, false, 0),   // swap already claimed; spread index, but full
      finished(7, 0, 0, true, 0),    // forked: replaces spread 0
      finished(8, 0, 0, false, 16),  // prefix hit: full, no spread pick left to replace
  };
  for (SequenceRecord& rec : recs) selection.offer(rec);
  const std::vector<VerifySelection::Pick> picks = selection.take_picks();
  REQUIRE(picks.size() == 3);
  CHECK(picks[0].why == "swap-preempted");
  CHECK(picks[0].record.seq == 5);
  CHECK(picks[0].record.logits == std::vector<float>(kVocab, 5.0f));
  CHECK(picks[1].why == "recompute-preempted");
  CHECK(picks[1].record.seq == 4);
  CHECK(picks[2].why == "forked sample");
  CHECK(picks[2].record.seq == 7);
  CHECK(recs[5].logits.empty());           // moved out of the engine's record
  CHECK(recs[8].logits.size() == kVocab);  // not picked: left to the engine to release
}

TEST_CASE("VerifySelection: a sequence served from the host tier gets its own pick") {
  VerifySelection selection(/*count=*/3, /*total_sequences=*/100);  // spread stride 33
  std::vector<SequenceRecord> recs = {
      finished(1, 0, 0, false, 32),  // device hit only: the prefix-cache pick
      finished(2, 0, 0, false, 32),  // host-tier hit: its own pick, not the prefix-cache one
      finished(3, 0, 0, false, 32),  // a second host-tier hit: not picked
      finished(4, 0, 0, true, 32),   // forked child of a host-tier hit: the forked pick
  };
  recs[1].mechanisms.add(Mechanism::kPromote);
  recs[2].mechanisms.add(Mechanism::kPromote);
  recs[3].mechanisms.add(Mechanism::kPromote);  // a child shares its parent's promoted blocks
  for (SequenceRecord& rec : recs) selection.offer(rec);
  const std::vector<VerifySelection::Pick> picks = selection.take_picks();
  REQUIRE(picks.size() == 3);
  CHECK(picks[0].why == "forked sample");
  CHECK(picks[0].record.seq == 4);
  CHECK(picks[1].why == "host-tier hit");
  CHECK(picks[1].record.seq == 2);
  CHECK(picks[2].why == "prefix-cache hit");
  CHECK(picks[2].record.seq == 1);
}

TEST_CASE("VerifySelection: a pick whose mechanisms the others cover makes room for a new one") {
  VerifySelection selection(/*count=*/2, /*total_sequences=*/100);
  std::vector<SequenceRecord> recs = {
      finished(1, 0, 0, false, 32),  // prefix hit
      finished(2, 0, 0, true, 32),   // forked, prefix hit: covers what 1 covers
      finished(3, 1, 0, false, 0),   // swapped: full, replaces 1, not 2 (the only fork)
  };
  for (SequenceRecord& rec : recs) selection.offer(rec);
  const std::vector<VerifySelection::Pick> picks = selection.take_picks();
  REQUIRE(picks.size() == 2);
  CHECK(picks[0].why == "swap-preempted");
  CHECK(picks[0].record.seq == 3);
  CHECK(picks[1].why == "forked sample");
  CHECK(picks[1].record.seq == 2);
}

TEST_CASE("VerifySelection: kMechanisms.size() picks cover every mechanism a run exercised") {
  constexpr auto kCount = static_cast<int32_t>(kMechanisms.size());
  std::mt19937 rng(42);
  std::bernoulli_distribution through(0.08);
  for (int32_t trial = 0; trial < 500; ++trial) {
    const int32_t total = std::uniform_int_distribution<int32_t>(1, 60)(rng);
    VerifySelection selection(kCount, total);
    MechanismSet exercised;
    for (SeqId seq = 0; seq < total; ++seq) {
      SequenceRecord rec = finished(seq, 0, 0, false, 0);
      for (const Mechanism m : kMechanisms) {
        if (through(rng)) rec.mechanisms.add(m);
      }
      exercised |= rec.mechanisms;
      selection.offer(rec);
    }
    const std::vector<VerifySelection::Pick> picks = selection.take_picks();
    MechanismSet covered;
    for (const VerifySelection::Pick& p : picks) covered |= p.record.mechanisms;
    INFO("trial " << trial << ": " << total << " sequences, exercised "
                  << mechanism_names(exercised) << ", covered " << mechanism_names(covered));
    CHECK(covered == exercised);
    CHECK(static_cast<int32_t>(picks.size()) == std::min(kCount, total));
  }
}

TEST_CASE("VerifySelection: picks min(count, total) sequences") {
  VerifySelection selection(/*count=*/4, /*total_sequences=*/5);
  std::vector<SequenceRecord> recs;
  for (SeqId s = 0; s < 5; ++s) recs.push_back(finished(s, 0, 0, false, 0));
  for (SequenceRecord& rec : recs) selection.offer(rec);
  const std::vector<VerifySelection::Pick> picks = selection.take_picks();
  REQUIRE(picks.size() == 4);
  CHECK(picks[0].record.seq == 0);  // stride 1: the first ones
  CHECK(picks[3].record.seq == 3);
  for (const VerifySelection::Pick& p : picks) CHECK(p.why == "spread");
}

}  // namespace
}  // namespace decode_loop
