// Teacher-forced verification against the dense reference (see verify.h).
#include "verify.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <span>
#include <thread>
#include <utility>

#include "dense_reference.h"
#include "fmt/format.h"

namespace decode_loop {
namespace {

constexpr auto kSpreadRank = static_cast<int32_t>(kMechanisms.size());

// max |a - b|; +inf when either holds a non-finite value.
float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  float max = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) {
    const float d = std::abs(a[i] - b[i]);
    if (!std::isfinite(d)) return std::numeric_limits<float>::infinity();
    max = std::max(max, d);
  }
  return max;
}

// Tokens with a larger logit than `token` (lower id first on ties, as greedy picks).
int32_t rank_of(std::span<const float> logits, TokenId token) {
  int32_t rank = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const bool ahead = logits[i] > logits[token] ||
                       (logits[i] == logits[token] && static_cast<TokenId>(i) < token);
    rank += ahead ? 1 : 0;
  }
  return rank;
}

// A differing greedy token: each side's pick within the other's top-k, and each side's
// log-probability gap (= logit gap within one distribution) at most the bound.
bool greedy_near_tie(std::span<const float> engine, std::span<const float> ref, TokenId e,
                     TokenId r, float bound, std::string* detail) {
  const int32_t e_rank = rank_of(ref, e);
  const int32_t r_rank = rank_of(engine, r);
  const float ref_gap = ref[r] - ref[e];
  const float engine_gap = engine[e] - engine[r];
  *detail = fmt::format(
      "engine token {} is rank {} of the reference (log-prob gap {:.3g}), reference token {} "
      "rank {} of the engine (gap {:.3g})",
      e, e_rank, ref_gap, r, r_rank, engine_gap);
  return e_rank < kNearTieTopK && r_rank < kNearTieTopK && ref_gap <= bound && engine_gap <= bound;
}

// A differing sampled token: logits that differ by at most d move any point of the
// cumulative softmax(logits / T) by at most tanh(d / 2T), so the draw must lie that close
// to the reference's interval for the engine's token.
bool sampled_near_tie(std::span<const float> ref, TokenId e, const SamplingParams& sampling,
                      int32_t step, float diff, std::string* detail) {
  const double u = sampling_draw(sampling, step);
  const DrawInterval interval = draw_interval(ref, sampling.temperature, e);
  const double distance = u < interval.lo ? interval.lo - u : u - interval.hi;
  const double reach = std::tanh(static_cast<double>(diff) / (2.0 * sampling.temperature));
  *detail = fmt::format(
      "draw {:.6f} is {:.3g} from the reference's interval [{:.6f}, {:.6f}) for the engine's "
      "token {} (a logit difference of {:.3g} reaches {:.3g})",
      u, distance, interval.lo, interval.hi, e, diff, reach);
  return distance <= reach;
}

}  // namespace

// The detail names the first failure, or when there is none the first near-tie.
void compare_logits(const SequenceRecord& rec, std::span<const float> ref_logits, int32_t vocab,
                    float bound, VerifiedSequence* v) {
  const int32_t n = rec.num_generated();
  auto fail = [v](std::string why) {
    if (v->verdict != Verdict::kFail) v->detail = std::move(why);
    v->verdict = Verdict::kFail;
  };
  for (int32_t t = 0; t < n; ++t) {
    const std::span<const float> engine(rec.logits.data() + static_cast<size_t>(t) * vocab, vocab);
    const std::span<const float> ref(ref_logits.data() + static_cast<size_t>(t) * vocab, vocab);
    const float diff = max_abs_diff(engine, ref);
    if (!(diff <= v->max_logit_diff)) {
      v->max_logit_diff = diff;
      v->max_diff_position = t;
    }
    if (!(diff <= bound)) {
      fail(fmt::format("step {}: logit diff {:.3g} exceeds the bound {:.3g}", t, diff, bound));
    }
    const TokenId e = rec.tokens[rec.prompt_len + t];
    if (pick_token(engine, rec.sampling, t) != e) {  // the record itself is inconsistent
      fail(fmt::format("step {}: engine token {} is not the pick of its own logits", t, e));
    }
    const TokenId r = pick_token(ref, rec.sampling, t);
    if (e == r) {
      if (v->differing_tokens == 0) v->identical_tokens = t + 1;
      continue;
    }
    ++v->differing_tokens;
    std::string evidence;
    const bool near_tie =
        diff <= bound && (rec.sampling.temperature <= 0.0f
                              ? greedy_near_tie(engine, ref, e, r, bound, &evidence)
                              : sampled_near_tie(ref, e, rec.sampling, t, diff, &evidence));
    std::string what = fmt::format("step {}: engine {}, reference {}: {} ({}; logit diff {:.3g})",
                                   t, e, r, near_tie ? "near-tie" : "NOT a near-tie",
                                   evidence.empty() ? "logits beyond the bound" : evidence, diff);
    if (!near_tie) {
      fail(std::move(what));
    } else if (v->verdict == Verdict::kIdentical) {
      v->verdict = Verdict::kNearTie;
      v->detail = std::move(what);
    }
  }
}

// Attention is the only computation the two paths do differently. In fp32 they differ by
// summation order alone (relative ~1e-7). With a 16-bit or fp8 cache both round q, out and
// K/V to the same formats, but where the two fp32 sums straddle a rounding boundary an
// element differs by one unit in the last place (at most 2u relative, unit roundoff u =
// 2^-11 fp16, 2^-8 bf16, 2^-4 for fp8 K/V), and that difference reaches the logits
// (standard deviation 4) through the later layers. The measured largest differences follow that
// order; each bound is 4x the largest measured on CPU over issue 10's rows (95 sequences per row,
// all of them verified), rounded up to a power of two. docs/decode-loop.md has the figures.
//
// The bounds are the model's: swa has 4 layers where llama has 2, and differences grow
// with the layers they pass through (measured 4.9e-5 fp32, 0.014 fp16, 0.083 bf16, 0.40
// fp8 over 95 sequences of 64 requests, seeds 1 and 2). MLA: the engine attends with
// absorbed queries (q_nope W_UK) and gets back weighted latents that W_UV then projects;
// with a 16-bit or fp8 cache both are rounded to the attention dtype, while the reference
// up-projects the latents and rounds neither (it must not share the absorption). Those
// are roundings of u relative, not flips of one unit in the last place, so the
// differences are larger: measured 3.0e-5 (fp32), 0.019 (fp16), 0.124 (bf16), 0.78 (fp8).
// Each bound is again 4x the largest measured, rounded up to a power of two.
float logit_bound(pagedkv::DType dtype, ModelKind model) {
  struct Bounds {
    float fp32, fp16, bf16, fp8;
  };
  constexpr Bounds kLlamaBounds{1.0f / 4096, 1.0f / 32, 1.0f / 8, 1.0f};  // 3.4e-5 .. 0.19
  constexpr Bounds kSwaBounds{1.0f / 4096, 1.0f / 16, 0.5f, 2.0f};
  constexpr Bounds kMlaBounds{1.0f / 4096, 1.0f / 8, 0.5f, 4.0f};
  const Bounds& b = model == ModelKind::kSwa   ? kSwaBounds
                    : model == ModelKind::kMla ? kMlaBounds
                                               : kLlamaBounds;
  switch (dtype) {
    case pagedkv::DType::kFloat32:
      return b.fp32;
    case pagedkv::DType::kFloat16:
      return b.fp16;
    case pagedkv::DType::kBFloat16:
      return b.bf16;
    case pagedkv::DType::kFloat8E4M3:
      return b.fp8;
  }
  return 0.0f;
}

const char* verdict_name(Verdict verdict) {
  switch (verdict) {
    case Verdict::kIdentical:
      return "identical";
    case Verdict::kNearTie:
      return "near-tie";
    case Verdict::kFail:
      return "FAIL";
  }
  return "unknown";
}

VerifySelection::VerifySelection(int32_t count, int64_t total_sequences)
    : count_(count),
      total_(total_sequences),
      stride_(std::max<int64_t>(1, total_sequences / std::max(1, count))) {}

void VerifySelection::add(SequenceRecord& finished, std::string why, int32_t rank) {
  std::vector<float> logits = std::move(finished.logits);
  finished.logits.clear();
  Pick pick{.record = finished, .why = std::move(why), .rank = rank};
  pick.record.logits = std::move(logits);
  picks_.push_back(std::move(pick));
}

MechanismSet VerifySelection::covered() const {
  MechanismSet set;
  for (const Pick& p : picks_) set |= p.record.mechanisms;
  return set;
}

bool VerifySelection::drop_redundant_pick() {
  for (auto it = picks_.rbegin(); it != picks_.rend(); ++it) {
    MechanismSet others;
    for (const Pick& p : picks_) {
      if (&p != &*it) others |= p.record.mechanisms;
    }
    if (it->record.mechanisms.minus(others).empty()) {
      picks_.erase(std::next(it).base());
      return true;
    }
  }
  return false;
}

void VerifySelection::offer(SequenceRecord& finished) {
  const int64_t index = finished_++;
  const MechanismSet uncovered = finished.mechanisms.minus(covered());
  if (!uncovered.empty()) {
    if (static_cast<int32_t>(picks_.size()) >= count_ && !drop_redundant_pick()) return;
    const auto first = std::find_if(kMechanisms.begin(), kMechanisms.end(),
                                    [&](Mechanism m) { return uncovered.contains(m); });
    add(finished, picked_as(*first), static_cast<int32_t>(first - kMechanisms.begin()));
    return;
  }
  // Spread over the finishing order, and take the last ones when the rest would fall short.
  const int64_t open = count_ - static_cast<int64_t>(picks_.size());
  if (open > 0 && (index % stride_ == 0 || total_ - index <= open)) {
    add(finished, "spread", kSpreadRank);
  }
}

std::vector<VerifySelection::Pick> VerifySelection::take_picks() {
  std::stable_sort(picks_.begin(), picks_.end(),
                   [](const Pick& a, const Pick& b) { return a.rank < b.rank; });
  return std::move(picks_);
}

bool VerifyResult::passed() const {
  return std::none_of(sequences.begin(), sequences.end(),
                      [](const VerifiedSequence& s) { return s.verdict == Verdict::kFail; });
}

MechanismSet VerifyResult::covered() const {
  MechanismSet set;
  for (const VerifiedSequence& s : sequences) set |= s.mechanisms;
  return set;
}

float VerifyResult::max_logit_diff() const {
  float max = 0.0f;
  for (const VerifiedSequence& s : sequences) {
    if (!(s.max_logit_diff <= max)) max = s.max_logit_diff;
  }
  return max;
}

absl::StatusOr<VerifyResult> verify(const Model& model, std::vector<VerifySelection::Pick> picks,
                                    int32_t requested, const KvFormat& format) {
  const auto start = std::chrono::steady_clock::now();
  const int32_t vocab = model.config().vocab_size;
  VerifyResult result;
  result.requested = requested;
  result.cache_dtype = format.cache_dtype;
  result.bound = logit_bound(format.cache_dtype, model.config().kind);
  result.sequences.resize(picks.size());
  // One sequence per thread, each with its own reference pass.
  std::vector<absl::Status> errors(picks.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < picks.size(); i = next++) {
      const SequenceRecord& rec = picks[i].record;
      VerifiedSequence& v = result.sequences[i];
      v.seq = rec.seq;
      v.request = rec.request;
      v.sample = rec.sample;
      v.why = picks[i].why;
      v.mechanisms = rec.mechanisms;
      v.temperature = rec.sampling.temperature;
      v.num_tokens = rec.num_generated();
      const size_t expected = static_cast<size_t>(v.num_tokens) * vocab;
      if (v.num_tokens < 1 || rec.logits.size() != expected) {
        errors[i] = absl::FailedPreconditionError(
            fmt::format("verify: sequence {} has {} logits for {} generated tokens x vocab {}",
                        rec.seq, rec.logits.size(), v.num_tokens, vocab));
        continue;
      }
      // The reference sees every token but the last generated one, and gives the logits of
      // the positions that predicted the generated tokens.
      const std::span<const TokenId> context(rec.tokens.data(), rec.tokens.size() - 1);
      absl::StatusOr<std::vector<float>> ref = dense_logits(model, context, v.num_tokens, format);
      if (!ref.ok()) {
        errors[i] = ref.status();
        continue;
      }
      compare_logits(rec, *ref, vocab, result.bound, &v);
    }
  };
  const size_t num_threads =
      std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), picks.size());
  std::vector<std::thread> threads;
  for (size_t t = 1; t < num_threads; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
  for (const absl::Status& status : errors) {
    if (!status.ok()) return status;
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace decode_loop
