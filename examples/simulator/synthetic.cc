#include "synthetic.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pagedkv::sim {
namespace {

absl::Status check_options(const SyntheticOptions& o) {
  if (o.num_requests < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_requests ", o.num_requests, " < 0"));
  }
  if (!(o.rate_per_s > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("rate_per_s ", o.rate_per_s, " <= 0"));
  }
  if (!(o.prompt_mean > 0) || !(o.output_mean > 0) || o.prompt_sigma < 0 || o.output_sigma < 0) {
    return absl::InvalidArgumentError("length means must be > 0 and sigmas >= 0");
  }
  if (o.min_length < 1 || o.max_length < o.min_length) {
    return absl::InvalidArgumentError(absl::StrCat("need 1 <= min_length (", o.min_length,
                                                   ") <= max_length (", o.max_length, ")"));
  }
  for (double f : {o.system_prompt_fraction, o.parallel_fraction, o.beam_fraction}) {
    if (f < 0 || f > 1) {
      return absl::InvalidArgumentError(absl::StrCat("fraction ", f, " outside [0, 1]"));
    }
  }
  if (o.num_system_prompts < 0 || o.system_prompt_length < 0 || o.num_samples < 1 ||
      o.beam_width < 1) {
    return absl::InvalidArgumentError(
        "num_system_prompts and system_prompt_length must be >= 0, num_samples and "
        "beam_width >= 1");
  }
  return absl::OkStatus();
}

// A log-normal length with the given mean: mu = log(mean) - sigma^2 / 2.
int32_t draw_length(std::mt19937_64& rng, double mean, double sigma, int32_t lo, int32_t hi) {
  std::lognormal_distribution<double> dist(std::log(mean) - sigma * sigma / 2, sigma);
  const double x = std::round(dist(rng));
  return static_cast<int32_t>(std::clamp(x, static_cast<double>(lo), static_cast<double>(hi)));
}

}  // namespace

absl::StatusOr<Trace> generate_synthetic(const SyntheticOptions& o) {
  if (absl::Status s = check_options(o); !s.ok()) return s;
  std::mt19937_64 rng(o.seed);
  std::exponential_distribution<double> gap(o.rate_per_s);
  std::uniform_real_distribution<double> unit(0, 1);
  Trace trace;
  trace.name = "generated";
  double t = 0;
  for (int32_t i = 0; i < o.num_requests; ++i) {
    Request r;
    if (i > 0) t += gap(rng);
    r.arrival_s = t;
    r.input_length = draw_length(rng, o.prompt_mean, o.prompt_sigma, o.min_length, o.max_length);
    r.output_length = draw_length(rng, o.output_mean, o.output_sigma, o.min_length, o.max_length);
    if (o.num_system_prompts > 0 && o.system_prompt_length > 0 &&
        unit(rng) < o.system_prompt_fraction) {
      r.system_prompt_id = std::uniform_int_distribution<int32_t>(0, o.num_system_prompts - 1)(rng);
      r.system_prompt_length = o.system_prompt_length;
      r.input_length += o.system_prompt_length;
    }
    const double kind = unit(rng);
    if (kind < o.parallel_fraction) {
      r.num_samples = o.num_samples;
    } else if (kind < o.parallel_fraction + o.beam_fraction) {
      r.beam_width = o.beam_width;
    }
    trace.requests.push_back(std::move(r));
  }
  return trace;
}

}  // namespace pagedkv::sim
