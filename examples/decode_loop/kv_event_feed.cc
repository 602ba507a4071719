#include "kv_event_feed.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

#ifdef PAGEDKV_HAVE_EVENTS
#include "pagedkv/kv_event_publisher.h"
#endif

namespace decode_loop {

#ifdef PAGEDKV_HAVE_EVENTS
namespace {

class PublisherFeed : public KvEventFeed {
 public:
  explicit PublisherFeed(std::unique_ptr<pagedkv::KvEventPublisher> publisher)
      : publisher_(std::move(publisher)) {}
  pagedkv::KvEventSink* sink() override { return publisher_.get(); }
  void end_step() override { publisher_->end_step(); }
  int64_t next_seq() const override { return publisher_->stats().next_seq; }
  pagedkv::KvEventPublisher::Stats stats() const override { return publisher_->stats(); }
  bool wait_until_sent(double timeout_s) override {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
      const pagedkv::KvEventPublisher::Stats s = publisher_->stats();
      if (s.steps_published + s.steps_dropped_hwm + s.steps_dropped_queue == s.next_seq) {
        return true;
      }
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

 private:
  std::unique_ptr<pagedkv::KvEventPublisher> publisher_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvEventFeed>> KvEventFeed::start(const KvEventFeedOptions& options) {
  auto publisher = pagedkv::KvEventPublisher::create(
      {.endpoint = options.endpoint,
       .replay_endpoint = options.replay_endpoint,
       .curve_secret_key_file = options.curve_secret_key_file,
       .curve_allowed_clients_dir = options.curve_allowed_clients_dir});
  if (!publisher.ok()) return publisher.status();
  const bool curve = !options.curve_secret_key_file.empty();
  std::fprintf(stderr, "pagedkv-decode: kv events on %s replay %s%s\n",
               (*publisher)->endpoint().c_str(),
               options.replay_endpoint.empty() ? "-" : (*publisher)->replay_endpoint().c_str(),
               curve ? " (CURVE)" : "");
  warn_if_exposed("pagedkv-decode", (*publisher)->endpoint(), curve);
  if (!options.replay_endpoint.empty()) {
    warn_if_exposed("pagedkv-decode", (*publisher)->replay_endpoint(), curve);
  }
  std::fflush(stderr);
  return std::unique_ptr<KvEventFeed>(new PublisherFeed(*std::move(publisher)));
}
#else
absl::StatusOr<std::unique_ptr<KvEventFeed>> KvEventFeed::start(const KvEventFeedOptions& options) {
  return absl::UnimplementedError(absl::StrCat(
      "--kv-events ", options.endpoint,
      ": pagedkv was built without pagedkv::events; install "
      "libzmq3-dev cppzmq-dev libmsgpack-cxx-dev (scripts/install-deps.sh) and reconfigure"));
}
#endif

bool reachable_from_network(const std::string& endpoint) {
  absl::string_view rest = endpoint;
  if (!absl::ConsumePrefix(&rest, "tcp://")) return false;  // ipc://, inproc://: local
  // HOST:PORT, [IPV6]:PORT, or INTERFACE:PORT; a "source;" part names the local side.
  if (const size_t semicolon = rest.find(';'); semicolon != absl::string_view::npos) {
    rest.remove_prefix(semicolon + 1);
  }
  const size_t colon = rest.rfind(':');
  absl::string_view host = colon == absl::string_view::npos ? rest : rest.substr(0, colon);
  if (absl::ConsumePrefix(&host, "[")) absl::ConsumeSuffix(&host, "]");
  return !(absl::StartsWith(host, "127.") || host == "::1" || host == "localhost" || host == "lo");
}

void warn_if_exposed(const char* program, const std::string& endpoint, bool curve) {
  if (curve || !reachable_from_network(endpoint)) return;
  std::fprintf(stderr,
               "%s: warning: %s is reachable from the network without CURVE: anyone who "
               "reaches it reads the KV events (docs/events.md, \"Authenticated events\")\n",
               program, endpoint.c_str());
}

namespace {

// The cached hashes of `pool`, each once: a standby block holds the same hash as the
// indexed one.
void add_cached_hashes(const pagedkv::BlockPool& pool, const char* medium,
                       std::set<std::string>* lines) {
  for (pagedkv::BlockId b = 0; b < pool.num_blocks(); ++b) {
    const absl::StatusOr<pagedkv::BlockHash> h = pool.cached_hash(b);
    if (!h.ok()) continue;  // NotFound: the block holds no hash
    char line[48];
    std::snprintf(line, sizeof line, "%016llx%016llx %s", static_cast<unsigned long long>(h->hi),
                  static_cast<unsigned long long>(h->lo), medium);
    lines->insert(line);
  }
}

}  // namespace

bool write_prefix_index(const pagedkv::KvCacheManager& manager, const std::string& path) {
  std::set<std::string> lines;
  add_cached_hashes(**manager.device_pool(), "GPU", &lines);
  // The host pool's cached blocks are the host tier (swapped sequences' blocks hold no hash).
  add_cached_hashes(**manager.host_pool(), "CPU", &lines);
  std::ofstream out(path);
  for (const std::string& line : lines) out << line << "\n";
  return static_cast<bool>(out);
}

}  // namespace decode_loop
