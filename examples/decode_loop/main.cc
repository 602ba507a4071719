// pagedkv-decode: end-to-end generation on the pagedkv library.
//
// A small Llama-layout model with seeded weights serves a workload through a scheduler on
// KvCacheManager (prefix caching, copy-on-write forks, preemption by recompute and swap),
// with the KV cache in paged storage read by the library's attention kernels. --verify N
// checks N sequences against a dense no-cache reference fed the engine's tokens (teacher
// forcing): logits within the cache dtype's bound, tokens equal or near-ties.
// See docs/decode-loop.md.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "dense_reference.h"
#include "fmt/format.h"
#include "kv_event_feed.h"
#include "kv_format.h"
#include "metrics_server.h"
#include "model.h"
#include "pagedkv/block_pool.h"
#include "pagedkv/device.h"
#include "pagedkv/kv_cache_spec.h"
#include "scheduler.h"
#include "summary.h"
#include "verify.h"
#include "workload.h"

namespace decode_loop {
namespace {

constexpr std::string_view kUsage = R"(usage: pagedkv-decode [options]

Generates text for a workload with a small seeded transformer whose KV cache is managed by
pagedkv, then prints a summary. Defaults: 32 requests sharing a 192-token system prompt,
some with 2..4 forked samples, a KV budget small enough to force preemption, and
verification of 4 sequences against a dense no-cache reference (teacher-forced: logits
within the KV dtype's bound at every generated position, tokens equal or near-ties).

  --device auto|cpu|cuda      where the KV cache and kernels run (auto: CUDA if usable)
  --kv-budget-mb MB           device KV cache budget (default 2)
  --swap-space-mb MB          host pool for swapped blocks (default: the KV budget)
  --host-cache-mb MB          host memory for the prefix cache's host tier, added to the
                              host pool (default 0: no host tier): evicted cached blocks
                              are demoted there and promoted back on a prefix hit
  --block-size N              tokens per block (default 16)
  --kv-dtype fp32|bf16|fp16|fp8   KV cache element type (default fp32; fp8: e4m3 with
                              per-layer K and V scales calibrated on the first prompt,
                              attention in bf16)
  --requests N                requests to serve (default 32)
  --max-new-tokens N          tokens generated per sample, at most (default 24)
  --samples N                 most samples per multi-sample request, 1 disables forks (default 4)
  --system-prompt-len N       shared prompt tokens of the synthetic workload (default 192)
  --system-prompts N          distinct system prompts, request i uses prompt i mod N
                              (default 1)
  --preemption mixed|recompute|swap   victim mode (default mixed: alternate)
  --max-running N             sequences decoding at once (default 256)
  --max-prefill-tokens N      prompt tokens per step (default 2048)
  --layers N                  transformer layers (default 2)
  --d-model N                 model width (default 256)
  --ffn-dim N                 SwiGLU hidden width (default 768)
  --seed N                    weights, prompts and sampling (default 1)
  --trace PATH                replay a trace (Mooncake .jsonl or Azure .csv)
  --trace-scale F             multiply trace lengths by F (default 0.015625 = 1/64)
  --verify N                  check N sequences against the dense reference (default 4; 0: off)
  --json                      print the summary as JSON on stdout
  --fault skip-copies|skip-swap-in|corrupt-swap-in|skip-promote   break the KV on purpose,
                              to show that --verify catches it: drop copy-on-write, swap-in
                              or host-tier promotion copies, or flip an exponent bit in each
                              swapped-in sequence's KV
  --metrics-port N            serve Prometheus metrics on http://127.0.0.1:N/metrics (0: a free port)
  --kv-events ENDPOINT        publish KV events for routers (vLLM format), e.g. tcp://127.0.0.1:5557
  --kv-events-replay ENDPOINT replay/snapshot socket for those events, e.g. tcp://127.0.0.1:5558
  --kv-index-out PATH         write the final prefix index there (one hex block hash per line)
  --hold-s S                  keep serving metrics and replay S seconds after the summary (default 0)
  --help
)";

struct Flags {
  std::string device = "auto";
  double kv_budget_mb = 2.0;
  double swap_space_mb = -1.0;
  double host_cache_mb = 0.0;
  int32_t block_size = 16;
  std::string kv_dtype = "fp32";
  std::string preemption = "mixed";
  int32_t layers = 2;
  int32_t d_model = ModelConfig{}.d_model;
  int32_t ffn_dim = ModelConfig{}.ffn_dim;
  int32_t verify = 4;
  bool json = false;
  int32_t max_running = 256;
  int32_t max_prefill_tokens = 2048;
  std::string fault = "none";
  int32_t metrics_port = -1;  // -1: no metrics server
  std::string kv_events;      // empty: no KV event publisher
  std::string kv_events_replay;
  std::string kv_index_out;
  double hold_s = 0.0;
  WorkloadOptions workload;
};

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "pagedkv-decode: %s\n", message.c_str());
  std::exit(2);
}

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage.data(), stdout);
      std::exit(0);
    }
    if (arg == "--json") {
      f.json = true;
      continue;
    }
    static constexpr const char* kValueFlags[] = {"--device",         "--kv-budget-mb",
                                                  "--swap-space-mb",  "--host-cache-mb",
                                                  "--block-size",     "--kv-dtype",
                                                  "--requests",       "--max-new-tokens",
                                                  "--samples",        "--system-prompt-len",
                                                  "--system-prompts", "--preemption",
                                                  "--max-running",    "--max-prefill-tokens",
                                                  "--layers",         "--d-model",
                                                  "--ffn-dim",        "--seed",
                                                  "--trace",          "--trace-scale",
                                                  "--verify",         "--fault",
                                                  "--metrics-port",   "--kv-events",
                                                  "--kv-index-out",   "--kv-events-replay",
                                                  "--hold-s"};
    if (std::find(std::begin(kValueFlags), std::end(kValueFlags), arg) == std::end(kValueFlags)) {
      fail(absl::StrCat("unknown option ", arg, " (see --help)"));
    }
    if (i + 1 >= argc) fail(absl::StrCat(arg, " needs a value (see --help)"));
    const std::string value = argv[++i];
    auto as_int = [&](int32_t* out) {
      if (!absl::SimpleAtoi(value, out)) fail(absl::StrCat(arg, ": not an integer: ", value));
    };
    auto as_double = [&](double* out) {
      if (!absl::SimpleAtod(value, out)) fail(absl::StrCat(arg, ": not a number: ", value));
    };
    if (arg == "--device") {
      f.device = value;
    } else if (arg == "--kv-budget-mb") {
      as_double(&f.kv_budget_mb);
    } else if (arg == "--swap-space-mb") {
      as_double(&f.swap_space_mb);
    } else if (arg == "--host-cache-mb") {
      as_double(&f.host_cache_mb);
    } else if (arg == "--block-size") {
      as_int(&f.block_size);
    } else if (arg == "--kv-dtype") {
      f.kv_dtype = value;
    } else if (arg == "--requests") {
      as_int(&f.workload.num_requests);
    } else if (arg == "--max-new-tokens") {
      as_int(&f.workload.max_new_tokens);
    } else if (arg == "--samples") {
      as_int(&f.workload.max_samples);
    } else if (arg == "--system-prompt-len") {
      as_int(&f.workload.system_prompt_len);
    } else if (arg == "--system-prompts") {
      as_int(&f.workload.num_system_prompts);
    } else if (arg == "--preemption") {
      f.preemption = value;
    } else if (arg == "--max-running") {
      as_int(&f.max_running);
    } else if (arg == "--max-prefill-tokens") {
      as_int(&f.max_prefill_tokens);
    } else if (arg == "--layers") {
      as_int(&f.layers);
    } else if (arg == "--d-model") {
      as_int(&f.d_model);
    } else if (arg == "--ffn-dim") {
      as_int(&f.ffn_dim);
    } else if (arg == "--seed") {
      int64_t seed = 0;
      if (!absl::SimpleAtoi(value, &seed)) fail(absl::StrCat(arg, ": not an integer: ", value));
      f.workload.seed = static_cast<uint64_t>(seed);
    } else if (arg == "--trace") {
      f.workload.trace_path = value;
    } else if (arg == "--trace-scale") {
      as_double(&f.workload.trace_scale);
    } else if (arg == "--fault") {
      f.fault = value;
    } else if (arg == "--verify") {
      as_int(&f.verify);
    } else if (arg == "--metrics-port") {
      as_int(&f.metrics_port);
    } else if (arg == "--kv-events") {
      f.kv_events = value;
    } else if (arg == "--kv-events-replay") {
      f.kv_events_replay = value;
    } else if (arg == "--kv-index-out") {
      f.kv_index_out = value;
    } else if (arg == "--hold-s") {
      as_double(&f.hold_s);
    } else {
      fail(absl::StrCat("unknown option ", arg, " (see --help)"));
    }
  }
  return f;
}

int run(int argc, char** argv) {
  Flags flags = parse(argc, argv);

  // Device: auto picks CUDA when the library was built with it and a GPU is usable.
  pagedkv::Device device = pagedkv::Device::kCpu;
  if (flags.device == "auto") {
    device = pagedkv::default_device();
  } else if (flags.device == "cuda") {
    if (!pagedkv::cuda_device_available()) {
      fail(absl::StrCat("--device cuda: ", pagedkv::cuda_unavailable_reason()));
    }
    device = pagedkv::Device::kCuda;
  } else if (flags.device != "cpu") {
    fail(absl::StrCat("--device ", flags.device, ": expected auto, cpu or cuda"));
  }

  pagedkv::DType kv_dtype = pagedkv::DType::kFloat32;
  if (flags.kv_dtype == "bf16") {
    kv_dtype = pagedkv::DType::kBFloat16;
  } else if (flags.kv_dtype == "fp16") {
    kv_dtype = pagedkv::DType::kFloat16;
  } else if (flags.kv_dtype == "fp8") {
    kv_dtype = pagedkv::DType::kFloat8E4M3;
  } else if (flags.kv_dtype != "fp32") {
    fail(absl::StrCat("--kv-dtype ", flags.kv_dtype, ": expected fp32, bf16, fp16 or fp8"));
  }

  EngineOptions engine;
  engine.device = device;
  engine.block_size = flags.block_size;
  engine.seed = flags.workload.seed;
  engine.max_running = flags.max_running;
  engine.max_prefill_tokens = flags.max_prefill_tokens;
  engine.progress = isatty(STDERR_FILENO) != 0;
  if (flags.preemption == "recompute") {
    engine.preemption = PreemptionPolicy::kRecompute;
  } else if (flags.preemption == "swap") {
    engine.preemption = PreemptionPolicy::kSwap;
  } else if (flags.preemption != "mixed") {
    fail(absl::StrCat("--preemption ", flags.preemption, ": expected mixed, recompute or swap"));
  }

  if (flags.fault == "skip-copies") {
    engine.fault = Fault::kSkipCopies;
  } else if (flags.fault == "skip-swap-in") {
    engine.fault = Fault::kSkipSwapIn;
  } else if (flags.fault == "corrupt-swap-in") {
    engine.fault = Fault::kCorruptSwapIn;
  } else if (flags.fault == "skip-promote") {
    engine.fault = Fault::kSkipPromote;
  } else if (flags.fault != "none") {
    fail(absl::StrCat("--fault ", flags.fault,
                      ": expected skip-copies, skip-swap-in, corrupt-swap-in or skip-promote"));
  }
  if (flags.verify < 0) fail(absl::StrCat("--verify ", flags.verify, ": must be >= 0"));

  ModelConfig config;
  config.num_layers = flags.layers;
  config.d_model = flags.d_model;
  config.ffn_dim = flags.ffn_dim;
  config.seed = flags.workload.seed;
  if (absl::Status s = validate(config); !s.ok()) fail(std::string(s.message()));
  flags.workload.vocab_size = config.vocab_size;

  // Size the pools from the budget.
  const pagedkv::KvCacheSpec spec{.num_layers = config.num_layers,
                                  .num_kv_heads = config.num_kv_heads,
                                  .head_dim = config.head_dim,
                                  .dtype = kv_dtype,
                                  .block_size = flags.block_size};
  const auto budget = static_cast<int64_t>(flags.kv_budget_mb * (1 << 20));
  absl::StatusOr<int32_t> num_blocks = spec.num_blocks_for_budget(budget);
  if (!num_blocks.ok()) fail(absl::StrCat("KV cache: ", num_blocks.status().message()));
  engine.num_blocks = *num_blocks;
  // One host pool for swapped sequences and the host tier (kv_storage.h: swap first, the
  // tier caches in the rest): the swap space's blocks plus the host cache's.
  const double swap_mb = flags.swap_space_mb < 0 ? flags.kv_budget_mb : flags.swap_space_mb;
  if (swap_mb < 0 || flags.host_cache_mb < 0) {
    fail(absl::StrCat("--swap-space-mb ", swap_mb, " and --host-cache-mb ", flags.host_cache_mb,
                      " must be >= 0"));
  }
  auto host_blocks = [&](double mb) {
    return static_cast<int64_t>(mb * (1 << 20)) / spec.bytes_per_block();
  };
  const int64_t cache_blocks = host_blocks(flags.host_cache_mb);
  if (flags.host_cache_mb > 0 && cache_blocks == 0) {
    fail(absl::StrCat("--host-cache-mb ", flags.host_cache_mb, ": less than one block of ",
                      spec.bytes_per_block(), " bytes"));
  }
  const int64_t num_host_blocks = host_blocks(swap_mb) + cache_blocks;
  if (num_host_blocks > pagedkv::BlockPool::kMaxBlocks) {
    fail(absl::StrCat("--swap-space-mb ", swap_mb, " + --host-cache-mb ", flags.host_cache_mb, ": ",
                      num_host_blocks, " host blocks, more than the limit ",
                      pagedkv::BlockPool::kMaxBlocks));
  }
  engine.num_host_blocks = static_cast<int32_t>(num_host_blocks);
  engine.host_cache_blocks = static_cast<int32_t>(cache_blocks);
  engine.enable_host_cache = engine.host_cache_blocks > 0;
  engine.watermark_blocks = std::max(1, engine.num_blocks / 100);

  // Every sequence must fit the pool alone, or it could never run.
  flags.workload.max_total_len = (engine.num_blocks - engine.watermark_blocks) * flags.block_size;
  absl::StatusOr<Workload> workload = make_workload(flags.workload);
  if (!workload.ok()) fail(std::string(workload.status().message()));

  std::unique_ptr<MetricsServer> metrics;
  if (flags.metrics_port >= 0) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> started =
        MetricsServer::start(flags.metrics_port);
    if (!started.ok()) fail(std::string(started.status().message()));
    metrics = *std::move(started);
  }
  std::unique_ptr<KvEventFeed> events;
  if (!flags.kv_events.empty()) {
    absl::StatusOr<std::unique_ptr<KvEventFeed>> started =
        KvEventFeed::start(flags.kv_events, flags.kv_events_replay);
    if (!started.ok()) fail(std::string(started.status().message()));
    events = *std::move(started);
    engine.event_sink = events->sink();
  }
  if (metrics != nullptr || events != nullptr) {
    engine.on_step = [&](const pagedkv::KvCacheManager::Stats& s) {
      if (events != nullptr) events->end_step();  // one batch of KV events per step
      if (metrics != nullptr) metrics->update(s);
    };
  }

  const Model model(config);
  engine.kv_format.cache_dtype = kv_dtype;
  if (kv_dtype == pagedkv::DType::kFloat8E4M3 && !workload->requests.empty()) {
    absl::StatusOr<KvFormat> fp8 = calibrate_fp8(model, workload->requests.front().prompt);
    if (!fp8.ok()) fail(std::string(fp8.status().message()));
    engine.kv_format = *std::move(fp8);
  }
  // Verification: the engine keeps the logits of running sequences, and of finished ones
  // only when the selection picks them.
  int64_t num_sequences = 0;
  for (const Request& r : workload->requests) num_sequences += r.num_samples;
  VerifySelection selection(flags.verify, num_sequences);
  if (flags.verify > 0) {
    engine.record_logits = true;
    engine.on_finish = [&selection](SequenceRecord& rec) { selection.offer(rec); };
  }
  absl::StatusOr<std::unique_ptr<Engine>> created = Engine::create(model, engine);
  if (!created.ok()) fail(std::string(created.status().message()));
  Engine& eng = **created;
  if (absl::Status s = eng.run(workload->requests); !s.ok()) {
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
  report.preemption_policy = flags.preemption;
  report.model = config;
  report.engine = eng.options();
  report.kv_budget_bytes = budget;
  report.bytes_per_block = spec.bytes_per_block();
  report.run = eng.stats();
  // The same workload under contiguous max-length reservation: every sequence reserves the
  // longest prompt + output of the workload, up front.
  int64_t real_tokens = 0;
  int64_t num_seqs = 0;
  for (const Request& r : workload->requests) {
    const auto len = static_cast<int32_t>(r.prompt.size()) + r.max_new_tokens;
    report.contiguous_max_len = std::max(report.contiguous_max_len, len);
    real_tokens += int64_t{len} * r.num_samples;
    num_seqs += r.num_samples;
  }
  const int64_t slots = int64_t{engine.num_blocks} * engine.block_size;
  // Capacity-bound, and never more than the workload's sequences.
  report.contiguous_peak_concurrency =
      static_cast<int32_t>(std::min(slots / report.contiguous_max_len, num_seqs));
  report.contiguous_utilization =
      static_cast<double>(real_tokens) / static_cast<double>(num_seqs * report.contiguous_max_len);

  if (flags.verify > 0) {
    if (engine.progress) {
      std::fprintf(stderr, "verifying %d sequences against the dense no-cache reference...",
                   flags.verify);
      std::fflush(stderr);
    }
    absl::StatusOr<VerifyResult> result =
        verify(model, selection.take_picks(), flags.verify, engine.kv_format);
    if (engine.progress) std::fprintf(stderr, "\r\033[K");
    if (!result.ok()) fail(absl::StrCat("verify failed: ", result.status().ToString()));
    report.verify = *std::move(result);
  }
  const std::string text = flags.json ? format_json(report) : format_text(report);
  if (!flags.kv_index_out.empty() && !write_prefix_index(eng.manager(), flags.kv_index_out)) {
    fail(absl::StrCat("--kv-index-out ", flags.kv_index_out, ": cannot write"));
  }
  if (events != nullptr) {
    // Announce the final seq only once every batch is sent, so that a router that replays
    // up to it finds them all in the replay buffer.
    if (!events->wait_until_sent(/*timeout_s=*/10)) {
      std::fprintf(stderr, "pagedkv-decode: kv events: the publisher did not send every batch\n");
    }
    std::fprintf(stderr, "pagedkv-decode: kv events: next seq %lld\n",
                 static_cast<long long>(events->next_seq()));
  }
  std::fputs(text.c_str(), stdout);
  if (flags.hold_s > 0) {  // let scrapers and routers read the final state
    std::fflush(stdout);
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::duration<double>(flags.hold_s));
  }
  const bool complete = report.run.requests_completed == report.run.requests;
  if (!complete) std::fprintf(stderr, "pagedkv-decode: not every request completed\n");
  if (report.verify.has_value() && !report.verify->passed()) {
    std::fprintf(stderr, "pagedkv-decode: verification FAILED\n");
    return 1;
  }
  return complete ? 0 : 1;
}

}  // namespace
}  // namespace decode_loop

int main(int argc, char** argv) { return decode_loop::run(argc, argv); }
