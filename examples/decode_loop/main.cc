// pagedkv-decode: end-to-end generation on the pagedkv library.
//
// A small Llama-layout model with seeded weights (or, with --model, a hybrid of sliding-window
// and full layers, or an MLA model) serves a workload through a scheduler on KvCacheManager
// (prefix caching, copy-on-write forks, preemption by recompute and swap, layer groups),
// with the KV cache in paged storage read by the library's attention kernels. --verify N
// checks N sequences against a dense no-cache reference fed the engine's tokens (teacher
// forcing): logits within the cache dtype's bound, tokens equal or near-ties; it picks
// first, for every mechanism the run exercised, a sequence whose K/V went through it.
// See docs/decode-loop.md.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/marshalling.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cache_plan.h"
#include "checkpoint.h"
#include "dense_reference.h"
#include "disaggregation.h"
#include "draft.h"
#include "kv_event_feed.h"
#include "kv_format.h"
#include "metrics_server.h"
#include "model.h"
#include "pagedkv/block_pool.h"
#include "pagedkv/device.h"
#include "pagedkv/kv_cache_spec.h"
#if PAGEDKV_HAVE_REMOTE
#include "remote.h"
#endif
#include "scheduler.h"
#include "summary.h"
#include "verify.h"
#include "workload.h"

namespace decode_loop {

// --verify: a number of sequences, or all of them.
struct VerifyCount {
  bool all = false;
  int32_t count = 0;  // when not all
};

bool AbslParseFlag(absl::string_view text, VerifyCount* verify, std::string* error) {
  if (text == "all") {
    *verify = {.all = true};
    return true;
  }
  int32_t count = 0;
  if (!absl::ParseFlag(text, &count, error) || count < 0) {
    *error = "expected a number of sequences >= 0, or all";
    return false;
  }
  *verify = {.count = count};
  return true;
}

std::string AbslUnparseFlag(VerifyCount verify) {
  return verify.all ? "all" : absl::UnparseFlag(verify.count);
}

}  // namespace decode_loop

// The flags; defaults that the option structs have come from them. Names take '-' or '_'
// alike (normalize_names()), and --help lists them spelled with '-' (print_help()).
ABSL_FLAG(std::string, device, "auto",
          "where the KV cache and kernels run: auto|cpu|cuda (auto: CUDA if usable)");
ABSL_FLAG(double, kv_budget_mb, 2.0, "device KV cache budget, MiB");
ABSL_FLAG(double, swap_space_mb, -1.0,
          "host pool for swapped blocks, MiB (negative: the KV budget)");
ABSL_FLAG(double, host_cache_mb, 0.0,
          "host memory for the prefix cache's host tier, MiB, added to the host pool (0: no "
          "host tier): evicted cached blocks are demoted there and promoted back on a prefix "
          "hit");
ABSL_FLAG(std::string, host_admission, "all",
          "which evicted blocks the host tier takes: all|reused (reused: only blocks hit, or "
          "computed again while their hash was a ghost; docs/results.md)");
ABSL_FLAG(std::string, eviction_policy, "lru",
          "the order the prefix cache evicts cached blocks in: lru|adaptive (adaptive: recency "
          "against frequency, steered by ghost lists; docs/results.md)");
ABSL_FLAG(int32_t, block_size, pagedkv::KvCacheConfig{}.block_size, "tokens per block");
ABSL_FLAG(std::string, kv_dtype, "fp32",
          "KV cache element type: fp32|bf16|fp16|fp8 (fp8: e4m3 with per-layer K and V scales "
          "calibrated on the first prompt, attention in bf16)");
ABSL_FLAG(int32_t, requests, decode_loop::WorkloadOptions{}.num_requests, "requests to serve");
ABSL_FLAG(int32_t, max_new_tokens, decode_loop::WorkloadOptions{}.max_new_tokens,
          "tokens generated per sample, at most");
ABSL_FLAG(int32_t, samples, decode_loop::WorkloadOptions{}.max_samples,
          "most samples per multi-sample request; 1 disables forks");
ABSL_FLAG(int32_t, system_prompt_len, decode_loop::WorkloadOptions{}.system_prompt_len,
          "shared prompt tokens of the synthetic workload");
ABSL_FLAG(int32_t, system_prompts, decode_loop::WorkloadOptions{}.num_system_prompts,
          "distinct system prompts; request i uses prompt i mod N");
ABSL_FLAG(std::string, preemption, "mixed",
          "victim mode: mixed|recompute|swap (mixed: alternate swap and recompute)");
ABSL_FLAG(int32_t, max_running, decode_loop::EngineOptions{}.max_running,
          "sequences decoding at once");
ABSL_FLAG(int32_t, max_prefill_tokens, decode_loop::EngineOptions{}.max_prefill_tokens,
          "prompt tokens per step");
ABSL_FLAG(int32_t, prefill_chunk, -1,
          "prompt tokens a sequence computes per step (0: its whole prompt; -1: the preset's, "
          "32 for swa, whose windowed groups then hold a chunk and a window per prefilling "
          "sequence instead of the whole prompt, else 0)");
ABSL_FLAG(int32_t, speculative, 0,
          "speculative decoding: a greedy sequence proposes up to N draft tokens by prompt "
          "lookup (n-grams of its own tokens) and one step verifies them; rejected drafts are "
          "rolled back (0: off; at most 16)");
ABSL_FLAG(std::string, draft, "lookup",
          "--speculative's drafter: lookup|replay (lookup: prompt lookup; replay: the workload "
          "runs first without speculation, and its outputs, a quarter of their tokens made "
          "wrong, are the drafts: every number of drafts gets accepted, and the outputs must "
          "match; not with --remote, --kv-events or --metrics-port)");
ABSL_FLAG(std::string, model, "llama",
          "model preset: llama|swa|mla|ssm (llama: full-attention GQA layers; swa: "
          "sliding-window layers of 40 and 12 tokens beside full ones, each kind a layer group "
          "of its own; mla: multi-head latent attention with small latent and rope dims; ssm: "
          "three state-space layers (a gated diagonal scan) per attention layer, their states "
          "in state slots, prefix hits restored from checkpoints; CPU only)");
ABSL_FLAG(std::string, checkpoint, "",
          "a Hugging Face Llama checkpoint directory (config.json, model.safetensors in F32, "
          "BF16 or F16) as the model, instead of --model's seeded weights; its config gives "
          "the sizes");
ABSL_FLAG(std::string, prompts, "",
          "a file of prompts, one per line as token ids separated by spaces, each a greedy "
          "request of --max-new-tokens tokens (instead of the synthetic workload)");
ABSL_FLAG(std::string, logits_out, "",
          "write each finished sequence's tokens and the logits each generated token was "
          "sampled from, one JSON object per line: request, sample, prompt_len, tokens, "
          "logits");
ABSL_FLAG(bool, treat_as_full, false,
          "keep every layer in one full-attention layer group, as an allocator without layer "
          "groups does (windowed layers still attend to their windows only): the comparison "
          "for the hybrid model's concurrency gain");
ABSL_FLAG(int64_t, split_tokens, 0,
          "sequence length the KV budget's split between layer groups balances (0: the "
          "workload's mean prompt + output length)");
ABSL_FLAG(int32_t, kv_lora_rank, 0,
          "mla: latent dims per token before the rope dims (0: the preset's 64; the CUDA MLA "
          "kernel takes 512 only)");
ABSL_FLAG(int32_t, qk_rope_dim, 0,
          "mla: RoPE dims of the latent and of each query head (0: the preset's 16; CUDA: 64 "
          "only)");
ABSL_FLAG(int32_t, layers, 0,
          "transformer layers (0: the preset's, llama 2, swa 4, mla 2; swa repeats its "
          "pattern)");
ABSL_FLAG(int32_t, d_model, decode_loop::ModelConfig{}.d_model, "model width");
ABSL_FLAG(int32_t, ffn_dim, decode_loop::ModelConfig{}.ffn_dim, "SwiGLU hidden width");
ABSL_FLAG(uint64_t, seed, decode_loop::WorkloadOptions{}.seed, "weights, prompts and sampling");
ABSL_FLAG(uint64_t, request_seed, 0,
          "the synthetic requests' user suffixes and lengths (0: --seed): engines with one "
          "--seed and different request seeds share system prompts only");
ABSL_FLAG(std::string, trace, "", "replay a trace (Mooncake .jsonl or Azure .csv)");
ABSL_FLAG(double, trace_scale, decode_loop::WorkloadOptions{}.trace_scale,
          "multiply trace lengths by this factor");
ABSL_FLAG(decode_loop::VerifyCount, verify, decode_loop::VerifyCount{.count = 4},
          "check N sequences against the dense reference (0: off; all: every sequence); "
          "first one per mechanism the run exercised (cow-copy, swap-in, recompute, fork, "
          "promote, exchange, demote, prefix-hit), then spread: N >= the number exercised (8 "
          "at most) covers every one");
ABSL_FLAG(bool, json, false, "print the summary as JSON on stdout");
ABSL_FLAG(std::string, fault, "none",
          "break the KV on purpose, to show that --verify catches it: "
          "none|skip-copies|skip-swap-in|corrupt-swap-in|skip-promote|skip-restore|"
          "corrupt-remote|keep-rejected (drop copy-on-write, swap-in, host-tier promotion or "
          "state-checkpoint restore copies, or flip an exponent bit in every block a swap-in "
          "fills; corrupt-remote flips a payload byte of every block fetched from --remote, "
          "which the checksums must reject: verification passes; keep-rejected keeps the "
          "--speculative drafts the model rejected)");
ABSL_FLAG(int32_t, metrics_port, -1,
          "serve Prometheus metrics on http://127.0.0.1:N/metrics (0: a free port; -1: off)");
ABSL_FLAG(std::string, kv_events, "",
          "publish KV events for routers (vLLM format), e.g. tcp://127.0.0.1:5557");
ABSL_FLAG(std::string, kv_events_replay, "",
          "replay/snapshot socket for those events, e.g. tcp://127.0.0.1:5558");
ABSL_FLAG(std::string, kv_events_curve_secret_key, "",
          "encrypt and authenticate the KV events with ZeroMQ CURVE: this engine's secret "
          "certificate (NAME.key_secret, from pagedkv-curve-keygen or zmq.auth); needs "
          "--kv-events-curve-clients");
ABSL_FLAG(std::string, kv_events_curve_clients, "",
          "with CURVE: a directory of the public certificates (*.key) of the routers allowed "
          "to connect");
ABSL_FLAG(double, min_step_ms, 0.0,
          "pace the loop: a step takes at least this long (0: as fast as it runs), e.g. to "
          "keep a small model publishing for a while");
ABSL_FLAG(std::string, kv_index_out, "",
          "write the final prefix index there (one hex block hash per line)");
ABSL_FLAG(std::string, remote, "",
          "the prefix cache's remote tier, shared by engines: redis://HOST:PORT[/DB] or "
          "dir:PATH (docs/remote.md)");
ABSL_FLAG(std::string, remote_wait, "timeout",
          "when a sequence whose remote lookup is in flight is admitted: "
          "best-effort|wait|timeout (best-effort: at once; wait: when every get completed; "
          "timeout: that or --remote-timeout-ms)");
ABSL_FLAG(int32_t, remote_timeout_ms, pagedkv::RemoteTierOptions{}.timeout_ms,
          "--remote-wait timeout's limit");
ABSL_FLAG(std::string, remote_write, "through",
          "which blocks go to the remote tier: through|selective (through: every computed "
          "block once; selective: blocks found as local prefix hits)");
ABSL_FLAG(std::string, disaggregate, "none",
          "serve with two engines in this process: a prefill engine computes each prompt and "
          "its first token and hands the sequence to a decode engine, the K/V over "
          "pagedkv::transfer on loopback: none|tcp|shm (each engine gets --kv-budget-mb; not "
          "with --remote, --kv-events or --metrics-port)");
ABSL_FLAG(std::string, transfer_fault, "none",
          "--disaggregate: break transfers on purpose: none|drop|corrupt|delay|peer-killed "
          "(drop or corrupt one block of every fourth transfer; delay three transfers, by half "
          "and twice --transfer-timeout-ms; peer-killed: the prefill engine dies mid-block "
          "halfway through): the decode engine recomputes what did not arrive verified");
ABSL_FLAG(int32_t, transfer_timeout_ms, 10000, "--disaggregate: a transfer's deadline, ms");
ABSL_FLAG(double, hold_s, 0.0,
          "keep serving metrics and replay this many seconds after the summary");

namespace decode_loop {
namespace {

constexpr const char* kUsage = R"(usage: pagedkv-decode [flags]

Generates text for a workload with a small seeded transformer whose KV cache is managed
by pagedkv, then prints a summary. Defaults: 32 requests sharing a 192-token system
prompt, some with 2..4 forked samples, a KV budget small enough to force preemption, and
verification of 4 sequences against a dense no-cache reference (teacher-forced: logits
within the KV dtype's bound at every generated position, tokens equal or near-ties).

Flag names take '-' or '_' alike (--kv-budget-mb 4 or --kv_budget_mb=4). Exit status:
0 done and verified; 1 verification failed, a request did not complete, a --fault went
unverified, or a flag did not parse; 2 a flag value out of range.
See docs/decode-loop.md.)";

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "pagedkv-decode: %s\n", message.c_str());
  std::exit(2);
}

// absl flag names are identifiers; ours were always written with hyphens. Rewrites
// "--kv-budget-mb" (and "--kv-budget-mb=2") to "--kv_budget_mb", and -h to --help; values
// and everything after "--" are left alone.
std::vector<std::string> normalize_names(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& arg = args[i];
    if (arg == "--") break;
    if (arg == "-h") arg = "--help";
    if (!absl::StartsWith(arg, "--")) continue;
    const size_t name_end = std::min(arg.find('='), arg.size());
    std::replace(arg.begin() + 2, arg.begin() + static_cast<std::ptrdiff_t>(name_end), '-', '_');
  }
  return args;
}

// `text` broken into lines of at most `width` characters, all but the first indented by
// `indent` spaces.
std::string wrap(const std::string& text, size_t indent, size_t width) {
  std::string out;
  size_t line_len = indent;
  for (const absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (line_len > indent && line_len + 1 + word.size() > width) {
      absl::StrAppend(&out, "\n", std::string(indent, ' '));
      line_len = indent;
    } else if (line_len > indent) {
      out += ' ';
      ++line_len;
    }
    absl::StrAppend(&out, word);
    line_len += word.size();
  }
  return out;
}

// --help: the usage message and this file's flags, spelled with hyphens, with their
// defaults. (Abseil's own --help spells them with underscores and exits 1.)
[[noreturn]] void print_help() {
  constexpr size_t kHelpColumn = 30;
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), "decode_loop/main.cc")) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  std::string out = absl::StrCat(absl::ProgramUsageMessage(), "\n\nflags (default after =):\n");
  for (const absl::CommandLineFlag* flag : flags) {
    std::string name = absl::StrCat("  --", flag->Name(), "=", flag->DefaultValue());
    std::replace(name.begin(), name.end(), '_', '-');
    name.resize(std::max(name.size() + 2, kHelpColumn), ' ');
    if (name.size() > kHelpColumn) absl::StrAppend(&name, "\n", std::string(kHelpColumn, ' '));
    absl::StrAppend(&out, name, wrap(flag->Help(), kHelpColumn, 92), "\n");
  }
  std::fputs(out.c_str(), stdout);
  std::exit(0);
}

void parse_flags(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<std::string> args = normalize_names(argc, argv);
  if (std::find(args.begin() + 1, args.end(), "--help") != args.end()) print_help();
  std::vector<char*> arg_ptrs;
  for (std::string& arg : args) arg_ptrs.push_back(arg.data());
  const std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  if (positional.size() > 1) {
    fail(absl::StrCat("unexpected argument ", positional[1], " (flags start with --; see --help)"));
  }
}

// A flag value among named choices.
template <typename T>
struct Choice {
  const char* name;
  T value;
};

// The value named `value`; exits with the flag and its choices when there is none.
template <typename T, size_t N>
T choose(const char* flag, const std::string& value, const Choice<T> (&choices)[N]) {
  std::vector<std::string> names;
  for (const Choice<T>& choice : choices) {
    if (value == choice.name) return choice.value;
    names.push_back(choice.name);
  }
  const std::string last = names.back();
  names.pop_back();
  fail(absl::StrCat("--", flag, " ", value, ": expected ", absl::StrJoin(names, ", "), " or ",
                    last));
}

constexpr Choice<std::optional<pagedkv::Device>> kDevices[] = {
    {"auto", std::nullopt}, {"cpu", pagedkv::Device::kCpu}, {"cuda", pagedkv::Device::kCuda}};
constexpr Choice<pagedkv::DType> kKvDtypes[] = {{"fp32", pagedkv::DType::kFloat32},
                                                {"bf16", pagedkv::DType::kBFloat16},
                                                {"fp16", pagedkv::DType::kFloat16},
                                                {"fp8", pagedkv::DType::kFloat8E4M3}};
constexpr Choice<PreemptionPolicy> kPreemptionPolicies[] = {
    {"mixed", PreemptionPolicy::kMixed},
    {"recompute", PreemptionPolicy::kRecompute},
    {"swap", PreemptionPolicy::kSwap}};
constexpr Choice<pagedkv::HostAdmission> kHostAdmissions[] = {
    {"all", pagedkv::HostAdmission::kAll}, {"reused", pagedkv::HostAdmission::kReused}};
constexpr Choice<pagedkv::EvictionPolicy> kEvictionPolicies[] = {
    {"lru", pagedkv::EvictionPolicy::kLru}, {"adaptive", pagedkv::EvictionPolicy::kAdaptive}};
constexpr Choice<ModelKind> kModels[] = {{"llama", ModelKind::kLlama},
                                         {"swa", ModelKind::kSwa},
                                         {"mla", ModelKind::kMla},
                                         {"ssm", ModelKind::kSsm}};
constexpr Choice<Fault> kFaults[] = {{"none", Fault::kNone},
                                     {"skip-copies", Fault::kSkipCopies},
                                     {"skip-swap-in", Fault::kSkipSwapIn},
                                     {"corrupt-swap-in", Fault::kCorruptSwapIn},
                                     {"skip-promote", Fault::kSkipPromote},
                                     {"skip-restore", Fault::kSkipRestore},
                                     {"corrupt-remote", Fault::kCorruptRemote},
                                     {"keep-rejected", Fault::kKeepRejected}};
constexpr Choice<TransferFault> kTransferFaults[] = {{"none", TransferFault::kNone},
                                                     {"drop", TransferFault::kDrop},
                                                     {"corrupt", TransferFault::kCorrupt},
                                                     {"delay", TransferFault::kDelay},
                                                     {"peer-killed", TransferFault::kPeerKilled}};
constexpr Choice<bool> kDrafters[] = {{"lookup", false}, {"replay", true}};  // replay?
constexpr Choice<pagedkv::RemoteWaitPolicy> kRemoteWaits[] = {
    {"best-effort", pagedkv::RemoteWaitPolicy::kBestEffort},
    {"wait", pagedkv::RemoteWaitPolicy::kWaitComplete},
    {"timeout", pagedkv::RemoteWaitPolicy::kTimeout}};
constexpr Choice<pagedkv::RemoteWritePolicy> kRemoteWrites[] = {
    {"through", pagedkv::RemoteWritePolicy::kWriteThrough},
    {"selective", pagedkv::RemoteWritePolicy::kSelective}};

// Auto picks CUDA when the library was built with it and a GPU is usable.
pagedkv::Device choose_device() {
  const std::optional<pagedkv::Device> device =
      choose("device", absl::GetFlag(FLAGS_device), kDevices);
  if (!device.has_value()) return pagedkv::default_device();
  if (*device == pagedkv::Device::kCuda && !pagedkv::cuda_device_available()) {
    fail(absl::StrCat("--device cuda: ", pagedkv::cuda_unavailable_reason()));
  }
  return *device;
}

// --logits-out: one finished sequence as a line of JSON.
void write_logits(const SequenceRecord& rec, int32_t vocab_size, std::ofstream& out) {
  out << "{\"request\": " << rec.request << ", \"sample\": " << rec.sample
      << ", \"prompt_len\": " << rec.prompt_len << ", \"tokens\": ["
      << absl::StrJoin(rec.tokens, ", ") << "], \"logits\": [";
  for (int32_t i = 0; i < rec.num_generated(); ++i) {
    const auto row = std::span(rec.logits).subspan(static_cast<size_t>(i) * vocab_size, vocab_size);
    out << (i > 0 ? ", [" : "[");
    for (int32_t v = 0; v < vocab_size; ++v) {
      char number[32];
      std::snprintf(number, sizeof(number), "%.9g", static_cast<double>(row[v]));
      out << (v > 0 ? ", " : "") << number;
    }
    out << "]";
  }
  out << "]}\n";
}

WorkloadOptions workload_options() {
  WorkloadOptions w;
  w.num_requests = absl::GetFlag(FLAGS_requests);
  w.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  w.max_samples = absl::GetFlag(FLAGS_samples);
  w.system_prompt_len = absl::GetFlag(FLAGS_system_prompt_len);
  w.num_system_prompts = absl::GetFlag(FLAGS_system_prompts);
  w.seed = absl::GetFlag(FLAGS_seed);
  w.request_seed = absl::GetFlag(FLAGS_request_seed);
  w.trace_path = absl::GetFlag(FLAGS_trace);
  w.trace_scale = absl::GetFlag(FLAGS_trace_scale);
  w.prompts_path = absl::GetFlag(FLAGS_prompts);
  return w;
}

int64_t kv_budget_bytes() {
  return static_cast<int64_t>(absl::GetFlag(FLAGS_kv_budget_mb) * (1 << 20));
}

// The pools of every layer group from --kv-budget-mb, --swap-space-mb and --host-cache-mb,
// split for sequences of `split_tokens` tokens.
void size_kv_pools(int64_t split_tokens, EngineOptions* engine) {
  const double kv_budget_mb = absl::GetFlag(FLAGS_kv_budget_mb);
  // One host pool per group for swapped sequences and the host tier (kv_storage.h: swap
  // first, the tier caches in the rest): the swap space's blocks plus the host cache's.
  const double swap_space_mb = absl::GetFlag(FLAGS_swap_space_mb);
  const double swap_mb = swap_space_mb < 0 ? kv_budget_mb : swap_space_mb;
  const double host_cache_mb = absl::GetFlag(FLAGS_host_cache_mb);
  if (swap_mb < 0 || host_cache_mb < 0) {
    fail(absl::StrCat("--swap-space-mb ", swap_mb, " and --host-cache-mb ", host_cache_mb,
                      " must be >= 0"));
  }
  auto bytes = [](double mb) { return static_cast<int64_t>(mb * (1 << 20)); };
  if (kv_budget_mb < 0 || kv_budget_mb > (1 << 30)) {
    fail(absl::StrCat("--kv-budget-mb ", kv_budget_mb, " must be in [0, 2^30]"));
  }
  const absl::Status sized = size_pools({.device_bytes = kv_budget_bytes(),
                                         .swap_bytes = bytes(swap_mb),
                                         .host_cache_bytes = bytes(host_cache_mb)},
                                        split_tokens, &engine->cache);
  if (!sized.ok()) fail(absl::StrCat("KV cache: ", sized.message()));
  engine->enable_host_cache = host_cache_mb > 0;
  engine->host_admission =
      choose("host-admission", absl::GetFlag(FLAGS_host_admission), kHostAdmissions);
  engine->eviction_policy =
      choose("eviction-policy", absl::GetFlag(FLAGS_eviction_policy), kEvictionPolicies);
  engine->watermark_blocks = watermark_blocks(engine->cache);
}

// The mean prompt + output length of the workload's requests: the length the budget split
// balances.
int64_t mean_sequence_tokens(const Workload& workload) {
  int64_t tokens = 0;
  for (const Request& r : workload.requests) {
    tokens += static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens;
  }
  return std::max<int64_t>(1, tokens / std::max<int64_t>(1, std::ssize(workload.requests)));
}

// What the budget holds at the split length with the model's layer groups and with every
// layer treated as full, from KvCacheConfig (no run needed).
CapacityFigures capacity_figures(const ModelConfig& config, const EngineOptions& engine) {
  CapacityFigures f;
  const CachePlan& plan = engine.cache;
  f.tokens = plan.split_tokens;
  const pagedkv::DType dtype = plan.config.dtype;
  // State layers hold no K/V to treat as full: no comparison.
  bool has_state = false;
  for (int32_t l = 0; l < config.num_layers; ++l) has_state = has_state || config.is_state_layer(l);
  for (const bool as_full : {false, true}) {
    if (as_full && has_state) {
      f.sequences_as_full = f.sequences;
      f.held_bytes_as_full = f.held_bytes;
      break;
    }
    absl::StatusOr<CachePlan> p = plan_cache(config, dtype, plan.config.block_size, as_full);
    if (!p.ok()) fail(std::string(p.status().message()));
    absl::StatusOr<pagedkv::PoolSplit> split =
        p->config.split_budget(plan.budget_bytes, plan.split_tokens);
    if (!split.ok()) fail(std::string(split.status().message()));
    (as_full ? f.sequences_as_full : f.sequences) = p->config.max_sequences(*split, f.tokens);
    (as_full ? f.held_bytes_as_full : f.held_bytes) = p->config.held_bytes_per_sequence(f.tokens);
    if (!as_full) f.min_bytes = p->config.min_bytes_per_sequence(f.tokens);
  }
  return f;
}

// The same workload under contiguous max-length reservation: every sequence reserves the
// longest prompt + output of the workload, up front.
void compare_with_contiguous(const Workload& workload, const EngineOptions& engine,
                             Report* report) {
  int64_t real_tokens = 0;
  int64_t num_seqs = 0;
  for (const Request& r : workload.requests) {
    const auto len = static_cast<int32_t>(r.prompt.size()) + r.max_new_tokens;
    report->contiguous_max_len = std::max(report->contiguous_max_len, len);
    real_tokens += int64_t{len} * r.num_samples;
    num_seqs += r.num_samples;
  }
  // The pools' bytes, each sequence reserving max_len tokens of every layer.
  const CachePlan& plan = engine.cache;
  const int64_t reserved = int64_t{report->contiguous_max_len} * plan.bytes_per_block_all_groups() /
                           plan.config.block_size;
  // Capacity-bound, and never more than the workload's sequences.
  report->contiguous_peak_concurrency =
      static_cast<int32_t>(std::min(plan.pool_bytes() / reserved, num_seqs));
  report->contiguous_utilization =
      static_cast<double>(real_tokens) / static_cast<double>(num_seqs * report->contiguous_max_len);
}

// --draft replay: runs the workload without speculation (nor faults) and returns a drafter
// that replays its outputs, and their digest.
std::pair<Drafter, uint64_t> rehearse(const Model& model, EngineOptions options,
                                      const std::vector<Request>& requests) {
  auto replay =
      std::make_shared<ReplayDrafter>(kReplayErrorRate, options.seed, model.config().vocab_size);
  options.speculative = 0;
  options.fault = Fault::kNone;
  options.record_logits = false;
  options.progress = false;
  options.on_step = nullptr;
  options.on_finish = [&replay](SequenceRecord& rec) { replay->record(rec); };
  absl::StatusOr<std::unique_ptr<Engine>> created = Engine::create(model, options);
  if (!created.ok()) fail(std::string(created.status().message()));
  if (absl::Status s = (*created)->run(requests); !s.ok()) {
    fail(absl::StrCat("--draft replay: the rehearsal failed: ", s.ToString()));
  }
  Drafter drafter = [replay](const SequenceRecord& rec, int32_t max_tokens) {
    return replay->propose(rec, max_tokens);
  };
  return {std::move(drafter), (*created)->stats().output_digest};
}

// --disaggregate: the pair's options from the flags, or nullopt for one engine.
std::optional<DisaggregationOptions> disaggregation_options() {
  const std::string transport = absl::GetFlag(FLAGS_disaggregate);
  const TransferFault fault =
      choose("transfer-fault", absl::GetFlag(FLAGS_transfer_fault), kTransferFaults);
  const int32_t timeout_ms = absl::GetFlag(FLAGS_transfer_timeout_ms);
  if (timeout_ms < 1 || timeout_ms > 600'000) {
    fail(absl::StrCat("--transfer-timeout-ms ", timeout_ms, " must be in [1, 600000]"));
  }
  if (transport == "none") {
    if (fault != TransferFault::kNone) fail("--transfer-fault needs --disaggregate");
    return std::nullopt;
  }
  DisaggregationOptions options{.fault = fault, .transfer_timeout = absl::Milliseconds(timeout_ms)};
  if (transport == "shm") {
    options.endpoint = absl::StrCat("shm://pagedkv-decode-", getpid());
  } else if (transport != "tcp") {
    fail(absl::StrCat("--disaggregate ", transport, ": expected none, tcp or shm"));
  }
  return options;
}

// --disaggregate: a prefill engine beside `decode`, from the same options, and the pair
// serving `requests`.
DisaggregationStats serve_disaggregated(const Model& model, EngineOptions options, Engine& decode,
                                        const std::vector<Request>& requests,
                                        const DisaggregationOptions& pair) {
  options.hand_off = true;
  options.progress = false;
  absl::StatusOr<std::unique_ptr<Engine>> prefill = Engine::create(model, options);
  if (!prefill.ok()) fail(std::string(prefill.status().message()));
  absl::StatusOr<DisaggregationStats> stats = run_disaggregated(**prefill, decode, requests, pair);
  if (!stats.ok()) fail(absl::StrCat("run failed: ", stats.status().ToString()));
  return *std::move(stats);
}

// A --fault run shows the fault only if a verified sequence went through what it breaks.
// Returns false (after saying why) when the run exercised it but verified none.
bool check_fault_coverage(const Report& report) {
  if (report.engine.fault == Fault::kNone) return true;
  if (report.engine.fault == Fault::kCorruptRemote) {
    // Shown when some corrupt block was fetched (and, as every run, verification passes).
    if (report.remote->tier.corrupt_blocks > 0) return true;
    std::fprintf(stderr,
                 "pagedkv-decode: --fault corrupt-remote: no corrupt block was fetched, so the run "
                 "cannot show the checksums rejecting one (run a second engine on the store)\n");
    return false;
  }
  const MechanismSet broken = faulted_mechanisms(report.engine.fault);
  const MechanismSet exercised = report.fault_exercised();
  if (exercised.empty()) {
    std::fprintf(stderr,
                 "pagedkv-decode: --fault %s: no sequence went through %s, so the run cannot "
                 "show the fault (docs/decode-loop.md lists flags that exercise it)\n",
                 report.fault.c_str(), mechanism_names(broken).c_str());
    return true;
  }
  if (report.fault_covered()) return true;
  std::fprintf(stderr,
               "pagedkv-decode: --fault %s: the run exercised %s but no verified sequence went "
               "through %s; --verify %d or more covers every mechanism it exercised\n",
               report.fault.c_str(), mechanism_names(exercised).c_str(),
               mechanism_names(exercised.minus(report.covered())).c_str(),
               report.run.exercised().size());
  return false;
}

int run(int argc, char** argv) {
  parse_flags(argc, argv);
  const pagedkv::Device device = choose_device();
  const pagedkv::DType kv_dtype = choose("kv-dtype", absl::GetFlag(FLAGS_kv_dtype), kKvDtypes);

  EngineOptions engine;
  engine.device = device;
  engine.seed = absl::GetFlag(FLAGS_seed);
  engine.max_running = absl::GetFlag(FLAGS_max_running);
  engine.max_prefill_tokens = absl::GetFlag(FLAGS_max_prefill_tokens);
  engine.progress = isatty(STDERR_FILENO) != 0;
  const std::string preemption = absl::GetFlag(FLAGS_preemption);
  engine.preemption = choose("preemption", preemption, kPreemptionPolicies);
  const std::string fault = absl::GetFlag(FLAGS_fault);
  engine.fault = choose("fault", fault, kFaults);

  const std::string model_name = absl::GetFlag(FLAGS_model);
  ModelConfig config;
  switch (choose("model", model_name, kModels)) {
    case ModelKind::kLlama:
      config = llama_preset();
      break;
    case ModelKind::kSwa:
      config = swa_preset();
      break;
    case ModelKind::kMla:
      config = mla_preset();
      break;
    case ModelKind::kSsm:
      config = ssm_preset();
      break;
  }
  if (const int32_t layers = absl::GetFlag(FLAGS_layers); layers != 0) config.num_layers = layers;
  for (const auto& [flag, value, field] :
       {std::tuple<const char*, int32_t, int32_t*>{
            "kv-lora-rank", absl::GetFlag(FLAGS_kv_lora_rank), &config.kv_lora_rank},
        {"qk-rope-dim", absl::GetFlag(FLAGS_qk_rope_dim), &config.qk_rope_head_dim}}) {
    if (value == 0) continue;
    if (!config.mla()) fail(absl::StrCat("--", flag, " applies to --model mla only"));
    *field = value;
  }
  engine.speculative = absl::GetFlag(FLAGS_speculative);
  if (engine.speculative < 0 || engine.speculative > kMaxSpeculative) {
    fail(absl::StrCat("--speculative ", engine.speculative, " must be in [0, ", kMaxSpeculative,
                      "]"));
  }
  if (engine.fault == Fault::kKeepRejected && engine.speculative == 0) {
    fail("--fault keep-rejected needs --speculative");
  }
  const std::string drafter = absl::GetFlag(FLAGS_draft);
  const bool replay = choose("draft", drafter, kDrafters);
  engine.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
  if (engine.prefill_chunk < 0) engine.prefill_chunk = config.kind == ModelKind::kSwa ? 32 : 0;
  config.d_model = absl::GetFlag(FLAGS_d_model);
  config.ffn_dim = absl::GetFlag(FLAGS_ffn_dim);
  config.seed = engine.seed;
  std::optional<Model> loaded;
  if (const std::string checkpoint = absl::GetFlag(FLAGS_checkpoint); !checkpoint.empty()) {
    if (config.kind != ModelKind::kLlama || absl::GetFlag(FLAGS_layers) != 0) {
      fail("--checkpoint gives the model: not with --model other than llama, or --layers");
    }
    absl::StatusOr<Model> model = load_llama_checkpoint(checkpoint);
    if (!model.ok()) fail(absl::StrCat("--checkpoint: ", model.status().message()));
    loaded.emplace(*std::move(model));
    config = loaded->config();
  }
  if (absl::Status s = validate(config); !s.ok()) fail(std::string(s.message()));

  const bool treat_as_full = absl::GetFlag(FLAGS_treat_as_full);
  absl::StatusOr<CachePlan> plan =
      plan_cache(config, kv_dtype, absl::GetFlag(FLAGS_block_size), treat_as_full);
  if (!plan.ok()) fail(std::string(plan.status().message()));
  engine.cache = *std::move(plan);

  WorkloadOptions workload_opts = workload_options();
  workload_opts.vocab_size = config.vocab_size;
  // The budget split balances the workload's mean length (before prompts are cut to fit).
  int64_t split_tokens = absl::GetFlag(FLAGS_split_tokens);
  if (split_tokens < 0) fail(absl::StrCat("--split-tokens ", split_tokens, " must be >= 0"));
  if (split_tokens == 0) {
    absl::StatusOr<Workload> uncut = make_workload(workload_opts);
    if (!uncut.ok()) fail(std::string(uncut.status().message()));
    split_tokens = mean_sequence_tokens(*uncut);
  }
  size_kv_pools(split_tokens, &engine);
  // Every sequence must fit the pools alone, or it could never run.
  absl::StatusOr<int32_t> max_tokens = max_sequence_tokens(engine.cache, engine.prefill_chunk);
  if (!max_tokens.ok()) fail(absl::StrCat("KV cache: ", max_tokens.status().message()));
  workload_opts.max_total_len = *max_tokens;
  absl::StatusOr<Workload> workload = make_workload(workload_opts);
  if (!workload.ok()) fail(std::string(workload.status().message()));

  std::unique_ptr<pagedkv::RemoteKvStore> remote_store;
  const std::string remote = absl::GetFlag(FLAGS_remote);
  if (!remote.empty()) {
#if PAGEDKV_HAVE_REMOTE
    absl::StatusOr<std::unique_ptr<pagedkv::RemoteKvStore>> opened =
        open_remote_store(remote, engine.fault == Fault::kCorruptRemote);
    if (!opened.ok()) fail(std::string(opened.status().message()));
    remote_store = *std::move(opened);
    engine.remote_store = remote_store.get();
    engine.remote.wait_policy =
        choose("remote-wait", absl::GetFlag(FLAGS_remote_wait), kRemoteWaits);
    engine.remote.timeout_ms = absl::GetFlag(FLAGS_remote_timeout_ms);
    engine.remote.write_policy =
        choose("remote-write", absl::GetFlag(FLAGS_remote_write), kRemoteWrites);
#else
    fail("--remote: this pagedkv-decode was built without hiredis (scripts/install-deps.sh)");
#endif
  } else if (engine.fault == Fault::kCorruptRemote) {
    fail("--fault corrupt-remote needs --remote");
  }

  const std::optional<DisaggregationOptions> pair = disaggregation_options();
  if (pair.has_value() && (!remote.empty() || absl::GetFlag(FLAGS_metrics_port) >= 0 ||
                           !absl::GetFlag(FLAGS_kv_events).empty())) {
    fail("--disaggregate: not with --remote, --kv-events or --metrics-port");
  }
  std::unique_ptr<MetricsServer> metrics;
  if (const int32_t port = absl::GetFlag(FLAGS_metrics_port); port >= 0) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> started = MetricsServer::start(port);
    if (!started.ok()) fail(std::string(started.status().message()));
    metrics = *std::move(started);
  }
  std::unique_ptr<KvEventFeed> events;
  if (const std::string endpoint = absl::GetFlag(FLAGS_kv_events); !endpoint.empty()) {
    absl::StatusOr<std::unique_ptr<KvEventFeed>> started = KvEventFeed::start(
        {.endpoint = endpoint,
         .replay_endpoint = absl::GetFlag(FLAGS_kv_events_replay),
         .curve_secret_key_file = absl::GetFlag(FLAGS_kv_events_curve_secret_key),
         .curve_allowed_clients_dir = absl::GetFlag(FLAGS_kv_events_curve_clients)});
    if (!started.ok()) fail(std::string(started.status().message()));
    events = *std::move(started);
    engine.event_sink = events->sink();
  } else if (!absl::GetFlag(FLAGS_kv_events_curve_secret_key).empty() ||
             !absl::GetFlag(FLAGS_kv_events_curve_clients).empty()) {
    fail("--kv-events-curve-secret-key and --kv-events-curve-clients need --kv-events");
  }
  const double min_step_ms = absl::GetFlag(FLAGS_min_step_ms);
  if (!(min_step_ms >= 0 && min_step_ms <= 60000)) {
    fail(absl::StrCat("--min-step-ms ", min_step_ms, " must be in [0, 60000]"));
  }
  const auto min_step = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double, std::milli>(min_step_ms));
  auto next_step = std::chrono::steady_clock::now() + min_step;
  const Engine* running_engine = nullptr;  // set once created: the remote tier's metrics
  if (metrics != nullptr || events != nullptr || min_step_ms > 0) {
    engine.on_step = [&](const pagedkv::KvCacheManager::Stats& s) {
      if (events != nullptr) events->end_step();  // one batch of KV events per step
      if (metrics != nullptr) {
        metrics->update(s);
        if (events != nullptr) metrics->update(events->stats());
        if (const pagedkv::RemoteTier* tier = running_engine->remote(); tier != nullptr) {
          metrics->update(tier->stats(), remote_store->stats());
        }
      }
      if (min_step_ms > 0) {
        std::this_thread::sleep_until(next_step);
        next_step = std::max(next_step + min_step, std::chrono::steady_clock::now());
      }
    };
  }

  std::optional<Model> seeded;
  const Model& model = loaded.has_value() ? *loaded : seeded.emplace(config);
  engine.kv_format.cache_dtype = kv_dtype;
  if (kv_dtype == pagedkv::DType::kFloat8E4M3 && !workload->requests.empty()) {
    absl::StatusOr<KvFormat> fp8 = calibrate_fp8(model, workload->requests.front().prompt);
    if (!fp8.ok()) fail(std::string(fp8.status().message()));
    engine.kv_format = *std::move(fp8);
  }
  if (engine.remote_store != nullptr) {
    // What makes the K/V: the preset's weights, sized by these flags, from the seed, and
    // fp8's scales (calibrated on this run's first prompt: engines whose scales differ
    // must not share).
    engine.remote_model_id = absl::StrCat(
        "pagedkv-decode/", model_name, "/checkpoint=", absl::GetFlag(FLAGS_checkpoint),
        "/seed=", config.seed, "/layers=", config.num_layers, "/d_model=", config.d_model,
        "/ffn_dim=", config.ffn_dim, "/k_scales=", absl::StrJoin(engine.kv_format.k_scales, ","),
        "/v_scales=", absl::StrJoin(engine.kv_format.v_scales, ","));
  }
  std::optional<uint64_t> rehearsal_digest;
  if (replay) {
    if (engine.speculative == 0) fail("--draft replay needs --speculative");
    if (engine.remote_store != nullptr || events != nullptr || metrics != nullptr) {
      fail(
          "--draft replay runs the workload twice: not with --remote, --kv-events or "
          "--metrics-port");
    }
    std::tie(engine.drafter, rehearsal_digest) = rehearse(model, engine, workload->requests);
  }
  // Verification: the engine keeps the logits of running sequences, and of finished ones
  // only when the selection picks them.
  int64_t num_sequences = 0;
  for (const Request& r : workload->requests) num_sequences += r.num_samples;
  const VerifyCount verify_flag = absl::GetFlag(FLAGS_verify);
  const auto num_verify = static_cast<int32_t>(verify_flag.all ? num_sequences : verify_flag.count);
  VerifySelection selection(num_verify, num_sequences);
  const std::string logits_out = absl::GetFlag(FLAGS_logits_out);
  std::ofstream logits_file;
  if (!logits_out.empty()) {
    logits_file.open(logits_out);
    if (!logits_file) fail(absl::StrCat("--logits-out ", logits_out, ": cannot write"));
  }
  if (num_verify > 0 || logits_file.is_open()) {
    engine.record_logits = true;
    engine.on_finish = [&](SequenceRecord& rec) {
      if (logits_file.is_open()) write_logits(rec, config.vocab_size, logits_file);
      if (num_verify > 0) selection.offer(rec);
    };
  }
  absl::StatusOr<std::unique_ptr<Engine>> created = Engine::create(model, engine);
  if (!created.ok()) fail(std::string(created.status().message()));
  Engine& eng = **created;
  running_engine = &eng;
  std::optional<Report::Disaggregation> disaggregated;
  if (pair.has_value()) {
    disaggregated = {.transport = absl::GetFlag(FLAGS_disaggregate),
                     .fault = absl::GetFlag(FLAGS_transfer_fault),
                     .stats = serve_disaggregated(model, engine, eng, workload->requests, *pair)};
  } else if (absl::Status s = eng.run(workload->requests); !s.ok()) {
    fail(absl::StrCat("run failed: ", s.ToString()));
  }

  Report report;
  report.device = pagedkv::device_name(device);
  report.workload = workload->description;
  if (workload->truncated_prompts > 0) {
    absl::StrAppend(&report.workload, " (", workload->truncated_prompts,
                    " prompts cut to fit the pool)");
  }
  report.kv_dtype = pagedkv::dtype_name(kv_dtype);
  report.preemption_policy = preemption;
  report.fault = fault;
  report.model = config;
  report.model_name = model_name;
  report.engine = eng.options();
  report.kv_budget_bytes = kv_budget_bytes();
  report.bytes_per_block = engine.cache.bytes_per_block_all_groups();
  report.capacity = capacity_figures(config, engine);
  report.run = disaggregated.has_value() ? disaggregated->stats.combined : eng.stats();
  report.disaggregation = std::move(disaggregated);
  report.rehearsal_digest = rehearsal_digest;
  if (eng.remote() != nullptr) {
    report.remote = Report::Remote{remote, eng.remote()->stats(), remote_store->stats()};
  }
  compare_with_contiguous(*workload, engine, &report);

  if (num_verify > 0) {
    if (engine.progress) {
      std::fprintf(stderr, "verifying %d sequences against the dense no-cache reference...",
                   num_verify);
      std::fflush(stderr);
    }
    absl::StatusOr<VerifyResult> result =
        verify(model, selection.take_picks(), num_verify, engine.kv_format);
    if (engine.progress) std::fprintf(stderr, "\r\033[K");
    if (!result.ok()) fail(absl::StrCat("verify failed: ", result.status().ToString()));
    report.verify = *std::move(result);
  }
  const std::string kv_index_out = absl::GetFlag(FLAGS_kv_index_out);
  if (!kv_index_out.empty() && !write_prefix_index(eng.manager(), kv_index_out)) {
    fail(absl::StrCat("--kv-index-out ", kv_index_out, ": cannot write"));
  }
  if (events != nullptr) {
    // Announce the final seq only once every batch is sent, so that a router that replays
    // up to it finds them all in the replay buffer.
    if (!events->wait_until_sent(/*timeout_s=*/10)) {
      std::fprintf(stderr, "pagedkv-decode: kv events: the publisher did not send every batch\n");
    }
    // The summary and the metrics show the same counters.
    report.kv_events = events->stats();
    if (metrics != nullptr) metrics->update(*report.kv_events);
    std::fprintf(stderr, "pagedkv-decode: kv events: next seq %lld\n",
                 static_cast<long long>(report.kv_events->next_seq));
  }
  const std::string text = absl::GetFlag(FLAGS_json) ? format_json(report) : format_text(report);
  std::fputs(text.c_str(), stdout);
  if (const double hold_s = absl::GetFlag(FLAGS_hold_s); hold_s > 0) {
    // Let scrapers and routers read the final state; the metrics keep counting the replay
    // and snapshot requests served meanwhile (the summary shows them up to now).
    std::fflush(stdout);
    std::fflush(stderr);
    const auto end = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(hold_s));
    while (std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_until(
          std::min(end, std::chrono::steady_clock::now() + std::chrono::milliseconds(100)));
      if (metrics != nullptr && events != nullptr) metrics->update(events->stats());
    }
  }
  if (logits_file.is_open() && !logits_file.flush()) {
    fail(absl::StrCat("--logits-out ", logits_out, ": cannot write"));
  }
  const bool complete = report.run.requests_completed == report.run.requests;
  if (!complete) std::fprintf(stderr, "pagedkv-decode: not every request completed\n");
  const bool fault_shown = check_fault_coverage(report);
  if (report.verify.has_value() && !report.verify->passed()) {
    std::fprintf(stderr, "pagedkv-decode: verification FAILED\n");
    return 1;
  }
  return complete && fault_shown ? 0 : 1;
}

}  // namespace
}  // namespace decode_loop

int main(int argc, char** argv) { return decode_loop::run(argc, argv); }
