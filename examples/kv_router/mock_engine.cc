// pagedkv-mock-engine: a scheduler loop on KvCacheManager (no model) that publishes its KV
// events with KvEventPublisher, for the reference router (kv_router.py) and its tests.
//
// Each step decodes one token for every running sequence (preempting by recompute when
// blocks run out), frees finished sequences, admits waiting ones with a prefix match, ends
// the step (take_step_ops()) and hands the step's events to the publisher. Prompts share a
// few "system prompts", half of them under a tenant salt (extra keys), so the prefix cache
// hits, evicts and splits by salt. With --host-blocks, evicted blocks are demoted to the
// host tier and promoted back on a hit, so the events carry both media. With
// --sliding-window W and/or --chunked-local C the manager is a hybrid model's: a
// full-attention group beside a sliding-window group of W tokens and/or a chunked-local
// group of C tokens, each with --num-blocks device (and --host-blocks host) blocks, and
// every event names its group (docs/events.md, "Layer groups").
//
// With --curve-secret-key and --curve-clients both sockets use ZeroMQ CURVE: only routers
// whose public certificate is in the directory can connect (docs/events.md).
//
// Protocol on stdin/stdout, so that a test can drive it:
//   prints "endpoints <pub> <router>" once the sockets are bound, then waits for a line
//   "go" on stdin; runs the steps; writes the manager's prefix index (one "hash medium"
//   line per cached block and medium, "hash medium group" with layer groups, see
//   write_index()) to --index-out; prints "done <next seq>"; then keeps serving replay and
//   snapshot requests until stdin closes or says "quit" (at most --linger-s seconds).
//   Meanwhile each line "probe KEY T1 T2 ..." (KEY: the extra key, or -1 for none) looks
//   the tokens up as a new request would (match_prefix, then free: no block is allocated,
//   so no event is sent) and prints "hit N", the tokens found: what a router's prefix
//   match must predict.
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iostream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "command_line.h"
#include "kv_event_feed.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/kv_event_publisher.h"

ABSL_FLAG(std::string, endpoint, "tcp://127.0.0.1:*",
          "PUB endpoint; the default picks a free port");
ABSL_FLAG(std::string, replay_endpoint, "tcp://127.0.0.1:*", "ROUTER endpoint");
ABSL_FLAG(int, steps, 300, "engine steps");
ABSL_FLAG(int, step_us, 2000,
          "pause after each step, microseconds, so a test can kill and restart a router");
ABSL_FLAG(int, replay_steps, 10000, "replay buffer, in steps");
ABSL_FLAG(int, num_blocks, 96, "device blocks");
ABSL_FLAG(int, host_blocks, 0, "host blocks for the prefix cache's host tier; 0: none");
ABSL_FLAG(int, block_size, 4, "tokens per block");
ABSL_FLAG(int, sliding_window, 0,
          "a layer group of sliding-window attention of N tokens beside the full one; 0: none");
ABSL_FLAG(int, chunked_local, 0,
          "a layer group of chunked local attention, chunks of N tokens; 0: none");
ABSL_FLAG(int, reset_at_step, -1, "reset the prefix cache at step N; -1: never");
ABSL_FLAG(int, linger_s, 60, "serve replay/snapshot requests after the run, at most N s");
ABSL_FLAG(uint64_t, seed, 1, "workload seed");
ABSL_FLAG(std::string, index_out, "",
          "write the final prefix index there, one \"hex-hash medium\" per line");
ABSL_FLAG(std::string, curve_secret_key, "",
          "publish with ZeroMQ CURVE: this engine's secret certificate (NAME.key_secret); "
          "needs --curve-clients");
ABSL_FLAG(std::string, curve_clients, "",
          "with CURVE: a directory of the public certificates (*.key) of the allowed routers");

namespace {

struct Flags {  // the values of the flags above
  std::string endpoint;
  std::string replay_endpoint;
  int steps;
  int step_us;
  int replay_steps;
  int num_blocks;
  int host_blocks;  // > 0: a host tier of the prefix cache
  int block_size;
  int sliding_window;  // > 0: a sliding-window group
  int chunked_local;   // > 0: a chunked-local group
  int reset_at_step;   // -1: never
  int linger_s;
  uint64_t seed;
  std::string index_out;
  std::string curve_secret_key;  // both empty: no CURVE
  std::string curve_clients;
};

Flags read_flags() {
  using absl::GetFlag;
  return {.endpoint = GetFlag(FLAGS_endpoint),
          .replay_endpoint = GetFlag(FLAGS_replay_endpoint),
          .steps = GetFlag(FLAGS_steps),
          .step_us = GetFlag(FLAGS_step_us),
          .replay_steps = GetFlag(FLAGS_replay_steps),
          .num_blocks = GetFlag(FLAGS_num_blocks),
          .host_blocks = GetFlag(FLAGS_host_blocks),
          .block_size = GetFlag(FLAGS_block_size),
          .sliding_window = GetFlag(FLAGS_sliding_window),
          .chunked_local = GetFlag(FLAGS_chunked_local),
          .reset_at_step = GetFlag(FLAGS_reset_at_step),
          .linger_s = GetFlag(FLAGS_linger_s),
          .seed = GetFlag(FLAGS_seed),
          .index_out = GetFlag(FLAGS_index_out),
          .curve_secret_key = GetFlag(FLAGS_curve_secret_key),
          .curve_clients = GetFlag(FLAGS_curve_clients)};
}

constexpr const char* kUsage = R"(usage: pagedkv-mock-engine [options]
Prints "endpoints <pub> <router>", then waits for a line "go" on stdin before it runs.)";

// Waits for a line on stdin for at most `timeout_s` seconds; false on EOF or timeout.
bool read_line(std::string* line, int timeout_s) {
  pollfd fd{STDIN_FILENO, POLLIN, 0};
  if (poll(&fd, 1, timeout_s * 1000) <= 0) return false;
  return static_cast<bool>(std::getline(std::cin, *line));
}

struct Request {
  pagedkv::SeqId id = 0;
  std::vector<pagedkv::TokenId> prompt;
  std::vector<uint64_t> extra_keys;
  int32_t max_tokens = 0;  // prompt + generated
};

class Engine {
 public:
  Engine(const Flags& flags, pagedkv::KvCacheManager manager)
      : flags_(flags), manager_(std::move(manager)), rng_(flags.seed) {
    std::uniform_int_distribution<int> len(8, 40);
    for (auto& prompt : system_prompts_) {
      prompt.resize(len(rng_));
      for (auto& t : prompt) t = token();
    }
  }

  // One engine step; returns false on an unexpected library error.
  bool step(int step_index) {
    while (std::ssize(waiting_) + std::ssize(running_) < 10) waiting_.push_back(new_request());
    if (step_index == flags_.reset_at_step) manager_.reset_prefix_cache();
    if (!decode()) return false;
    admit();
    (void)manager_.take_step_ops();
    return manager_.check_invariants().ok();
  }

  const pagedkv::KvCacheManager& manager() const { return manager_; }

  // The tokens a new request with `prompt` finds cached (match_prefix), leaving the index
  // as it was: the probe's claim is freed at once, and nothing is allocated. -1 on error.
  int32_t probe(const std::vector<pagedkv::TokenId>& prompt, std::vector<uint64_t> extra_keys) {
    const pagedkv::SeqId id = next_id_++;
    if (!manager_.add_sequence(id, prompt, {.extra_keys = std::move(extra_keys)}).ok()) return -1;
    const absl::StatusOr<int32_t> hit = manager_.match_prefix(id);
    if (!manager_.free(id).ok() || !hit.ok()) return -1;
    (void)manager_.take_step_ops();
    return *hit;
  }

 private:
  pagedkv::TokenId token() { return std::uniform_int_distribution<int>(1, 50)(rng_); }

  Request new_request() {
    Request r;
    r.id = next_id_++;
    const auto& system = system_prompts_[rng_() % std::size(system_prompts_)];
    r.prompt = system;
    const int suffix = std::uniform_int_distribution<int>(1, 12)(rng_);
    for (int i = 0; i < suffix; ++i) r.prompt.push_back(token());
    if (rng_() % 2 == 0) r.extra_keys = {1000 + rng_() % 3};  // a tenant's cache salt
    r.max_tokens =
        static_cast<int32_t>(r.prompt.size()) + std::uniform_int_distribution<int>(1, 16)(rng_);
    return r;
  }

  // One token for every running sequence; a sequence that cannot get a slot even after
  // preempting others is preempted itself.
  bool decode() {
    std::deque<Request> still_running;
    for (Request& r : running_) {
      auto view = manager_.sequence(r.id);
      if (!view.ok()) return false;
      if (view->state != pagedkv::SequenceState::kRunning) {
        waiting_.push_back(std::move(r));  // preempted as a victim earlier in this step
        continue;
      }
      if (std::ssize(view->tokens) >= r.max_tokens) {
        if (!manager_.free(r.id).ok()) return false;
        continue;
      }
      const pagedkv::TokenId next[] = {token()};
      if (!manager_.append_tokens(r.id, next).ok()) return false;
      if (!manager_.allocate_slots_or_preempt(r.id, 1).ok()) {
        if (!manager_.preempt(r.id, pagedkv::PreemptionMode::kRecompute).ok()) return false;
        waiting_.push_back(std::move(r));
        continue;
      }
      still_running.push_back(std::move(r));
    }
    // Victims preempted after their own turn in this step are waiting now.
    running_.clear();
    for (Request& r : still_running) {
      auto view = manager_.sequence(r.id);
      if (!view.ok()) return false;
      (view->state == pagedkv::SequenceState::kRunning ? running_ : waiting_)
          .push_back(std::move(r));
    }
    return true;
  }

  // Admits waiting requests in order while blocks last (a preempted one resumes with all
  // its tokens).
  void admit() {
    while (!waiting_.empty()) {
      Request& r = waiting_.front();
      if (!manager_.contains(r.id) &&
          !manager_.add_sequence(r.id, r.prompt, {.extra_keys = r.extra_keys}).ok()) {
        waiting_.pop_front();
        continue;
      }
      // A request whose admission failed last step keeps its prefix hit: match once.
      if (manager_.sequence(r.id)->block_table.empty() && !manager_.match_prefix(r.id).ok()) {
        return;
      }
      const auto view = manager_.sequence(r.id);
      const auto todo = static_cast<int32_t>(view->tokens.size()) - view->num_computed_tokens;
      if (!manager_.allocate_slots(r.id, todo).ok()) return;  // retried next step
      running_.push_back(std::move(r));
      waiting_.pop_front();
    }
  }

  const Flags& flags_;
  pagedkv::KvCacheManager manager_;
  std::mt19937_64 rng_;
  std::vector<pagedkv::TokenId> system_prompts_[4];
  std::deque<Request> waiting_;
  std::deque<Request> running_;
  pagedkv::SeqId next_id_ = 0;
};

// The manager's prefix index, one line per cached block and medium: the 32-digit hex hash
// as on the wire, a space, GPU or CPU; with layer groups a space and the group. A standby
// block holds the same hash as the indexed one: each line is written once.
bool write_index(const pagedkv::KvCacheManager& manager, const std::string& path) {
  std::set<std::string> lines;
  const bool grouped = manager.num_groups() > 1;
  for (int32_t g = 0; g < manager.num_groups(); ++g) {
    for (const bool host : {false, true}) {
      // The host pool's cached blocks are the host tier (swapped blocks hold no hash).
      const pagedkv::BlockPool& pool = host ? **manager.host_pool(g) : **manager.device_pool(g);
      for (pagedkv::BlockId b = 0; b < pool.num_blocks(); ++b) {
        const absl::StatusOr<pagedkv::BlockHash> h = pool.cached_hash(b);
        if (!h.ok()) continue;  // NotFound: the block holds no hash
        char line[64];
        std::snprintf(line, sizeof line, "%016llx%016llx %s",
                      static_cast<unsigned long long>(h->hi),
                      static_cast<unsigned long long>(h->lo), host ? "CPU" : "GPU");
        lines.insert(grouped ? std::string(line) + " " + std::to_string(g) : std::string(line));
      }
    }
  }
  std::ofstream out(path);
  for (const std::string& line : lines) out << line << "\n";
  return static_cast<bool>(out);
}

// The layer groups of --sliding-window and --chunked-local, none without them.
std::vector<pagedkv::LayerGroup> layer_groups(const Flags& flags) {
  if (flags.sliding_window <= 0 && flags.chunked_local <= 0) return {};
  std::vector<pagedkv::LayerGroup> groups = {{.kind = pagedkv::AttentionKind::kFull,
                                              .num_blocks = flags.num_blocks,
                                              .num_host_blocks = flags.host_blocks}};
  if (flags.sliding_window > 0) {
    groups.push_back({.kind = pagedkv::AttentionKind::kSlidingWindow,
                      .window = flags.sliding_window,
                      .num_blocks = flags.num_blocks,
                      .num_host_blocks = flags.host_blocks});
  }
  if (flags.chunked_local > 0) {
    groups.push_back({.kind = pagedkv::AttentionKind::kChunkedLocal,
                      .window = flags.chunked_local,
                      .num_blocks = flags.num_blocks,
                      .num_host_blocks = flags.host_blocks});
  }
  return groups;
}

// "probe KEY T1 T2 ...": the hit of those tokens (KEY -1: no extra key), or -1.
int32_t probe(Engine& engine, const std::string& line) {
  std::istringstream in(line.substr(std::string("probe").size()));
  int64_t key = -1;
  in >> key;
  std::vector<pagedkv::TokenId> tokens;
  for (pagedkv::TokenId t = 0; in >> t;) tokens.push_back(t);
  return engine.probe(tokens, key < 0 ? std::vector<uint64_t>{}
                                      : std::vector<uint64_t>{static_cast<uint64_t>(key)});
}

int run(const Flags& flags) {
  auto publisher =
      pagedkv::KvEventPublisher::create({.endpoint = flags.endpoint,
                                         .replay_endpoint = flags.replay_endpoint,
                                         .replay_buffer_steps = flags.replay_steps,
                                         .curve_secret_key_file = flags.curve_secret_key,
                                         .curve_allowed_clients_dir = flags.curve_clients});
  if (!publisher.ok()) {
    std::cerr << publisher.status() << "\n";
    return 2;
  }
  const bool curve = !flags.curve_secret_key.empty();
  decode_loop::warn_if_exposed("pagedkv-mock-engine", (*publisher)->endpoint(), curve);
  decode_loop::warn_if_exposed("pagedkv-mock-engine", (*publisher)->replay_endpoint(), curve);
  std::vector<pagedkv::LayerGroup> groups = layer_groups(flags);
  if (groups.empty()) groups = pagedkv::full_attention(flags.num_blocks, flags.host_blocks);
  auto manager = pagedkv::KvCacheManager::create({.block_size = flags.block_size,
                                                  .enable_host_cache = flags.host_blocks > 0,
                                                  .event_sink = publisher->get(),
                                                  .layer_groups = std::move(groups)});
  if (!manager.ok()) {
    std::cerr << manager.status() << "\n";
    return 2;
  }
  std::cout << "endpoints " << (*publisher)->endpoint() << " " << (*publisher)->replay_endpoint()
            << std::endl;
  std::string line;
  if (!read_line(&line, flags.linger_s) || line != "go") return 3;

  Engine engine(flags, *std::move(manager));
  for (int i = 0; i < flags.steps; ++i) {
    if (!engine.step(i)) {
      std::cerr << "step " << i << ": unexpected library error\n";
      return 1;
    }
    (*publisher)->end_step();
    std::this_thread::sleep_for(std::chrono::microseconds(flags.step_us));
  }
  if (!flags.index_out.empty() && !write_index(engine.manager(), flags.index_out)) {
    std::cerr << "cannot write " << flags.index_out << "\n";
    return 2;
  }
  // Wait (a few poll intervals) until the publisher thread has sent every handed-off step.
  auto all_sent = [&] {
    const pagedkv::KvEventPublisher::Stats s = (*publisher)->stats();
    return s.steps_published + s.steps_dropped_hwm + s.steps_dropped_queue == s.next_seq;
  };
  for (int i = 0; i < 10000 && !all_sent(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::cout << "done " << (*publisher)->stats().next_seq << std::endl;
  while (read_line(&line, flags.linger_s) && line != "quit") {
    if (line.rfind("probe", 0) == 0) std::cout << "hit " << probe(engine, line) << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> positional =
      pagedkv::examples::parse_command_line(argc, argv, kUsage, __FILE__, {});
  if (!positional.empty()) {
    std::cerr << "pagedkv-mock-engine: unexpected argument '" << positional[0] << "'; see --help\n";
    return 2;
  }
  return run(read_flags());
}
