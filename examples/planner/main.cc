// pagedkv-plan: the capacity planner. Reads a Hugging Face config.json and prints the KV
// bytes per token of each layer group, pagedkv's pools for a GPU memory budget, the
// sequences that fit at given lengths, and vLLM's grouping waste beside it. See --help.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "command_line.h"
#include "pagedkv/capacity_plan.h"
#include "pagedkv/hf_model_config.h"
#include "trace_lengths.h"

ABSL_FLAG(std::string, config, "", "a Hugging Face config.json (required)");
ABSL_FLAG(std::optional<double>, gpu_memory_gib, std::nullopt,
          "GiB of GPU memory given to the KV cache (required; weights and activations are "
          "not counted)");
ABSL_FLAG(std::string, kv_dtype, "",
          "KV cache dtype: bf16, fp16, fp32 or fp8; default: the config's torch_dtype");
ABSL_FLAG(std::optional<int64_t>, max_model_len, std::nullopt,
          "longest sequence in tokens; default: the config's max_position_embeddings");
ABSL_FLAG(std::optional<int64_t>, target_len, std::nullopt,
          "the sequence length the pools are split for (every pool then holds the same "
          "number of such sequences); default: the trace's p50 with --trace, else "
          "max_model_len");
ABSL_FLAG(std::optional<int64_t>, cached_tokens, std::nullopt,
          "tokens of prompt content the prefix cache should keep in every group: no pool gets "
          "more than that plus one target-length sequence while another is below it (the "
          "windowed pools then cache more at large budgets); default 0, the split counts "
          "running sequences only. With --trace, the report names the trace's distinct prompt "
          "content");
ABSL_FLAG(std::vector<std::string>, lengths, {},
          "sequence lengths in tokens to report, comma-separated or repeated; default: the "
          "trace's p50 and p99 with --trace, else the target and max_model_len");
ABSL_FLAG(std::string, trace, "",
          "a request trace (.jsonl Mooncake, .csv Azure; shared/traces/README.md): its p50 "
          "and p99 prompt + output lengths become the lengths to report, its p50 the target");
ABSL_FLAG(int32_t, block_size, 16, "tokens per block");
ABSL_FLAG(bool, json, false, "print the report as JSON instead of text");
ABSL_FLAG(std::string, out, "", "also write the JSON report to this file");

namespace {

constexpr const char* kUsage =
    R"(Usage: pagedkv-plan --config config.json --gpu-memory-gib G [options]

Plans a KV cache from a model's Hugging Face config.json: the KV bytes per token of each
layer group (full attention, sliding window, chunked local, MLA latent; Mamba2 and Gated
DeltaNet state layers by their slot of per-sequence state, with vLLM's attention block size
for the model beside ours), the blocks of
pagedkv's pools (one pool per group, pages of exactly the group's layers, the budget split
in proportion to one sequence of the target length, or with --cached-tokens also counting
what the prefix cache should keep), the sequences that fit at each
length beside vLLM's shared pool, what one sequence keeps against the analytic minimum,
and the memory lost to padding: none for pagedkv, vLLM's padded layers
(kv_cache_utils.py) beside it. Text by default, JSON with --json or --out FILE.
Flags take --flag=value or --flag value; dashes may stand for the underscores.

Example:
  pagedkv-plan --config gemma-3-27b-it/config.json \
      --gpu-memory-gib 40 --target-len 32768 --lengths 4096,32768,131072)";

int fail(const std::string& message) {
  std::fprintf(stderr, "pagedkv-plan: %s\n", message.c_str());
  return 2;
}

constexpr int64_t kMaxTokens = int64_t{1} << 31;  // beyond any model's context

absl::Status validate_flags() {
  using absl::GetFlag;
  using pagedkv::examples::check_flag;
  const auto tokens_ok = [](const std::optional<int64_t>& v) {
    return !v || (*v >= 1 && *v <= kMaxTokens);
  };
  const std::optional<double> gib = GetFlag(FLAGS_gpu_memory_gib);
  for (const absl::Status& status : {
           check_flag(FLAGS_config, !GetFlag(FLAGS_config).empty(), "a config.json path"),
           check_flag(FLAGS_gpu_memory_gib, gib.has_value(), "given (GiB for the KV cache)"),
           check_flag(FLAGS_gpu_memory_gib, !gib || (*gib > 0 && *gib <= 1 << 20),
                      "in (0, 1048576] GiB"),
           check_flag(FLAGS_max_model_len, tokens_ok(GetFlag(FLAGS_max_model_len)),
                      "in [1, 2^31] tokens"),
           check_flag(FLAGS_target_len, tokens_ok(GetFlag(FLAGS_target_len)),
                      "in [1, 2^31] tokens"),
           check_flag(FLAGS_cached_tokens,
                      GetFlag(FLAGS_cached_tokens).value_or(0) >= 0 &&
                          GetFlag(FLAGS_cached_tokens).value_or(0) <= int64_t{1} << 50,
                      "in [0, 2^50] tokens"),
           check_flag(FLAGS_block_size,
                      GetFlag(FLAGS_block_size) >= 1 && GetFlag(FLAGS_block_size) <= 1 << 16,
                      "in [1, 65536] tokens"),
       }) {
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

// --lengths, each a positive token count.
absl::StatusOr<std::vector<int64_t>> lengths_from_flag() {
  std::vector<int64_t> out;
  for (const std::string& text : absl::GetFlag(FLAGS_lengths)) {
    int64_t tokens = 0;
    if (!absl::SimpleAtoi(text, &tokens) || tokens < 1 || tokens > kMaxTokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("--lengths: '", text, "' is not a token count in [1, 2^31]"));
    }
    out.push_back(tokens);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  constexpr absl::string_view kRepeatableFlags[] = {"lengths"};
  const std::vector<std::string> positional =
      pagedkv::examples::parse_command_line(argc, argv, kUsage, __FILE__, kRepeatableFlags);
  if (!positional.empty()) return fail("unexpected argument '" + positional[0] + "'; see --help");
  if (absl::Status status = validate_flags(); !status.ok()) {
    return fail(std::string(status.message()));
  }
  absl::StatusOr<std::vector<int64_t>> lengths = lengths_from_flag();
  if (!lengths.ok()) return fail(std::string(lengths.status().message()));

  pagedkv::HfConfigOptions read_options{.block_size = absl::GetFlag(FLAGS_block_size)};
  if (const std::string name = absl::GetFlag(FLAGS_kv_dtype); !name.empty()) {
    absl::StatusOr<pagedkv::DType> dtype = pagedkv::parse_kv_dtype(name);
    if (!dtype.ok()) return fail(absl::StrCat("--kv_dtype: ", dtype.status().message()));
    read_options.kv_dtype = *dtype;
  }
  absl::StatusOr<pagedkv::HfModelConfig> model =
      pagedkv::read_hf_config(absl::GetFlag(FLAGS_config), read_options);
  if (!model.ok()) return fail(std::string(model.status().message()));

  pagedkv::PlanOptions options{
      .budget_bytes = static_cast<int64_t>(
          std::floor(*absl::GetFlag(FLAGS_gpu_memory_gib) * static_cast<double>(int64_t{1} << 30))),
      .max_model_len = absl::GetFlag(FLAGS_max_model_len).value_or(model->max_position_embeddings),
      .target_tokens = absl::GetFlag(FLAGS_target_len).value_or(0),
      .cached_tokens = absl::GetFlag(FLAGS_cached_tokens).value_or(0),
      .lengths = *lengths};
  std::optional<pagedkv::plan::TraceLengths> trace;
  if (const std::string path = absl::GetFlag(FLAGS_trace); !path.empty()) {
    absl::StatusOr<pagedkv::plan::TraceLengths> read = pagedkv::plan::read_trace_lengths(path);
    if (!read.ok()) return fail(std::string(read.status().message()));
    trace = *read;
    if (options.lengths.empty()) options.lengths = {trace->p50, trace->p99};
    // A trace's median sequence may exceed the model's context; the split cannot.
    if (options.target_tokens == 0 && options.max_model_len > 0) {
      options.target_tokens = std::min(trace->p50, options.max_model_len);
    }
  }
  absl::StatusOr<pagedkv::CapacityPlan> plan = pagedkv::plan_capacity(*model, options);
  if (!plan.ok()) return fail(std::string(plan.status().message()));
  if (trace) {
    plan->notes.push_back(absl::StrCat("trace ", trace->name, ": ", trace->requests,
                                       " requests; prompt + output tokens p50 ", trace->p50,
                                       ", p99 ", trace->p99, ", max ", trace->max));
    if (trace->prompt_footprint_tokens > 0) {
      plan->notes.push_back(
          absl::StrCat("trace ", trace->name, ": ", trace->prompt_footprint_tokens,
                       " tokens of distinct prompt content (--cached_tokens ",
                       trace->prompt_footprint_tokens, " splits the pools to cache all of it)"));
    }
  }

  const std::string json = pagedkv::format_plan_json(*plan);
  if (const std::string out = absl::GetFlag(FLAGS_out); !out.empty()) {
    std::ofstream file(out, std::ios::binary);
    if (!(file << json) || !file.flush()) return fail("cannot write " + out);
  }
  const std::string report = absl::GetFlag(FLAGS_json) ? json : pagedkv::format_plan_text(*plan);
  std::fwrite(report.data(), 1, report.size(), stdout);
  return 0;
}
