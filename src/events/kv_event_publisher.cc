// KvEventPublisher: the scheduler-thread hand-off, then the publisher thread's loop
// (publish, replay, snapshot).
#include "pagedkv/kv_event_publisher.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "events/cache_mirror.h"
#include "events/staged_batch.h"
#include "events/wire_format.h"

namespace pagedkv {
namespace internal {
namespace {

// How long the publisher thread sleeps when it has nothing to do. The scheduler never
// wakes it (that would cost a system call per step), so this bounds the added latency.
constexpr auto kIdlePoll = std::chrono::milliseconds(1);
constexpr auto kCloseLinger = std::chrono::milliseconds(1000);
// Recycled batches kept for the scheduler thread; beyond this they are freed.
constexpr size_t kMaxSpareBatches = 64;

absl::Status check_options(const KvEventPublisher::Options& o) {
  auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("KvEventPublisher: ", parts...));
  };
  if (o.endpoint.empty()) return invalid("endpoint is empty");
  if (o.replay_buffer_steps <= 0) {
    return invalid("replay_buffer_steps ", o.replay_buffer_steps, " must be > 0");
  }
  if (o.replay_buffer_bytes <= 0) {
    return invalid("replay_buffer_bytes ", o.replay_buffer_bytes, " must be > 0");
  }
  if (o.hwm <= 0) return invalid("hwm ", o.hwm, " must be > 0");
  if (o.max_queued_events <= 0) {
    return invalid("max_queued_events ", o.max_queued_events, " must be > 0");
  }
  if (o.snapshot_blocks_per_batch <= 0) {
    return invalid("snapshot_blocks_per_batch ", o.snapshot_blocks_per_batch, " must be > 0");
  }
  return absl::OkStatus();
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int64_t read_big_endian(const zmq::message_t& frame) {
  uint64_t value = 0;
  const auto* bytes = static_cast<const unsigned char*>(frame.data());
  for (size_t i = 0; i < 8; ++i) value = (value << 8) | bytes[i];
  return static_cast<int64_t>(value);
}

}  // namespace

class PublisherCore {
 public:
  explicit PublisherCore(KvEventPublisher::Options options)
      : options_(std::move(options)),
        wire_{options_.medium, options_.data_parallel_rank},
        current_(std::make_unique<StagedBatch>()) {}

  ~PublisherCore() {
    stop_.store(true, std::memory_order_release);
    if (thread_.joinable()) thread_.join();
  }

  // Binds the sockets and starts the thread; errors leave nothing running.
  absl::Status start() {
    try {
      pub_ = zmq::socket_t(context_, zmq::socket_type::pub);
      pub_.set(zmq::sockopt::sndhwm, options_.hwm);
      // Closing waits up to this long for queued messages to leave.
      pub_.set(zmq::sockopt::linger, static_cast<int>(kCloseLinger.count()));
      if (options_.count_hwm_drops) pub_.set(zmq::sockopt::xpub_nodrop, 1);
      endpoint_ = bind(pub_, options_.endpoint);
      if (!options_.replay_endpoint.empty()) {
        router_ = zmq::socket_t(context_, zmq::socket_type::router);
        // A full replay plus its END marker always fits (as in vLLM).
        router_.set(zmq::sockopt::sndhwm, 2 * (options_.replay_buffer_steps + 1));
        router_.set(zmq::sockopt::linger, 0);
        replay_endpoint_ = bind(router_, options_.replay_endpoint);
      }
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError(
          absl::StrCat("KvEventPublisher: cannot bind ", failed_endpoint_, ": ", e.what()));
    }
    thread_ = std::thread([this] { run(); });
    return absl::OkStatus();
  }

  // --- scheduler thread ------------------------------------------------------------------

  void add(const KvEvent& event) { current_->add(event); }

  void end_step() {
    if (current_->empty()) return;
    current_->seq = next_seq_.load(std::memory_order_relaxed);
    next_seq_.store(current_->seq + 1, std::memory_order_relaxed);
    current_->timestamp = unix_seconds();
    const auto events = static_cast<int64_t>(current_->events.size());
    std::lock_guard lock(mutex_);
    if (queued_events_ + events > options_.max_queued_events) {
      // The publisher thread is far behind: drop the step; its seq is skipped on purpose.
      steps_dropped_queue_.fetch_add(1, std::memory_order_relaxed);
      events_dropped_queue_.fetch_add(events, std::memory_order_relaxed);
      current_->clear();
      return;
    }
    queued_events_ += events;
    ready_.push_back(std::move(current_));
    if (spare_.empty()) {  // the publisher thread lags kMaxSpareBatches steps behind
      current_ = std::make_unique<StagedBatch>();
      current_->reserve_like(*ready_.back());
    } else {
      current_ = std::move(spare_.back());
      spare_.pop_back();
    }
  }

  // --- any thread ------------------------------------------------------------------------

  KvEventPublisher::Stats stats() const {
    KvEventPublisher::Stats s;
    s.next_seq = next_seq_.load(std::memory_order_relaxed);
    s.steps_published = steps_published_.load(std::memory_order_relaxed);
    s.events_published = events_published_.load(std::memory_order_relaxed);
    s.steps_dropped_hwm = steps_dropped_hwm_.load(std::memory_order_relaxed);
    s.events_dropped_hwm = events_dropped_hwm_.load(std::memory_order_relaxed);
    s.steps_dropped_queue = steps_dropped_queue_.load(std::memory_order_relaxed);
    s.events_dropped_queue = events_dropped_queue_.load(std::memory_order_relaxed);
    s.replay_requests = replay_requests_.load(std::memory_order_relaxed);
    s.snapshot_requests = snapshot_requests_.load(std::memory_order_relaxed);
    s.cached_blocks = cached_blocks_.load(std::memory_order_relaxed);
    return s;
  }

  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }

 private:
  std::string bind(zmq::socket_t& socket, const std::string& endpoint) {
    failed_endpoint_ = endpoint;
    socket.bind(endpoint);
    return socket.get(zmq::sockopt::last_endpoint);
  }

  // --- publisher thread ------------------------------------------------------------------

  void run() {
    std::deque<std::unique_ptr<StagedBatch>> taken;
    while (true) {
      // Read the flag first: every step handed off before it was set is then in ready_.
      const bool stopping = stop_.load(std::memory_order_acquire);
      {
        std::lock_guard lock(mutex_);
        taken.swap(ready_);
      }
      for (auto& batch : taken) publish(*batch);
      recycle(taken);
      if (stopping) break;
      serve_requests(/*wait=*/taken.empty());
      taken.clear();
    }
  }

  void publish(StagedBatch& batch) {
    const bool serves_requests = static_cast<bool>(router_);
    if (serves_requests) {  // the snapshot state; only a ROUTER socket can ask for it
      mirror_.apply(batch);
      cached_blocks_.store(mirror_.size(), std::memory_order_relaxed);
    }
    std::string payload;
    encode_batch(batch, wire_, &payload);
    const auto seq = seq_bytes(batch.seq);
    const auto events = static_cast<int64_t>(batch.events.size());
    if (send_message(pub_, nullptr, seq, payload)) {
      steps_published_.fetch_add(1, std::memory_order_relaxed);
      events_published_.fetch_add(events, std::memory_order_relaxed);
    } else {
      steps_dropped_hwm_.fetch_add(1, std::memory_order_relaxed);
      events_dropped_hwm_.fetch_add(events, std::memory_order_relaxed);
    }
    next_unpublished_seq_ = batch.seq + 1;
    if (serves_requests) remember(batch.seq, std::move(payload));
  }

  // Keeps the batch for replay, within the buffer's step and byte limits.
  void remember(int64_t seq, std::string payload) {
    replay_bytes_ += static_cast<int64_t>(payload.size());
    replay_.emplace_back(seq, std::move(payload));
    while (std::ssize(replay_) > options_.replay_buffer_steps ||
           (replay_bytes_ > options_.replay_buffer_bytes && replay_.size() > 1)) {
      replay_bytes_ -= static_cast<int64_t>(replay_.front().second.size());
      replay_.pop_front();
    }
  }

  void recycle(std::deque<std::unique_ptr<StagedBatch>>& batches) {
    int64_t events = 0;
    for (const auto& b : batches) events += static_cast<int64_t>(b->events.size());
    std::lock_guard lock(mutex_);
    queued_events_ -= events;
    for (auto& b : batches) {
      if (spare_.size() >= kMaxSpareBatches) break;
      b->clear();
      spare_.push_back(std::move(b));
    }
  }

  // Sends (topic, seq, payload) on the PUB socket (client == nullptr) or to one ROUTER
  // client. Never blocks; returns false when the message was not queued.
  bool send_message(zmq::socket_t& socket, const zmq::message_t* client,
                    const std::array<char, 8>& seq, const std::string& payload,
                    bool with_topic = true) {
    constexpr auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
    try {
      if (client != nullptr) {
        if (!socket.send(zmq::buffer(client->data(), client->size()), more)) return false;
        if (!socket.send(zmq::const_buffer(nullptr, 0), more)) return false;
      }
      const std::string_view topic = with_topic ? std::string_view(options_.topic) : "";
      if (!socket.send(zmq::buffer(topic.data(), topic.size()), more)) return false;
      if (!socket.send(zmq::buffer(seq), more)) return false;
      return socket.send(zmq::buffer(payload), zmq::send_flags::dontwait).has_value();
    } catch (const zmq::error_t&) {
      return false;  // e.g. a ROUTER client that left (EHOSTUNREACH)
    }
  }

  // Answers the replay and snapshot requests waiting on the ROUTER socket; with `wait`,
  // first sleeps until one arrives or kIdlePoll passes.
  void serve_requests(bool wait) {
    const auto timeout = wait ? kIdlePoll : std::chrono::milliseconds(0);
    if (!router_) {
      if (wait) std::this_thread::sleep_for(timeout);
      return;
    }
    try {
      zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, timeout) == 0) return;
      std::vector<zmq::message_t> frames;
      while (zmq::recv_multipart(router_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
        serve_request(frames);
        frames.clear();
      }
    } catch (const zmq::error_t&) {
      // A malformed exchange must not stop publishing; the client times out and retries.
    }
  }

  // A request is (client id, "", 8-byte big-endian start seq or kSnapshotRequest).
  void serve_request(const std::vector<zmq::message_t>& frames) {
    if (frames.size() != 3 || frames[2].size() != 8) return;  // not ours: ignore, like vLLM
    const zmq::message_t& client = frames[0];
    const int64_t start = read_big_endian(frames[2]);
    if (start == KvEventPublisher::kSnapshotRequest) {
      snapshot_requests_.fetch_add(1, std::memory_order_relaxed);
      // Consistent with every batch before next_unpublished_seq_: apply it, then the live
      // batches from that seq on.
      const auto seq = seq_bytes(next_unpublished_seq_);
      std::string payload;
      for (StagedBatch& batch : mirror_.snapshot(options_.snapshot_blocks_per_batch)) {
        batch.timestamp = unix_seconds();
        encode_batch(batch, wire_, &payload);
        if (!send_message(router_, &client, seq, payload)) return;
      }
    } else {
      replay_requests_.fetch_add(1, std::memory_order_relaxed);
      for (const auto& [seq, payload] : replay_) {
        if (seq < start) continue;
        if (!send_message(router_, &client, seq_bytes(seq), payload)) return;
      }
    }
    send_message(router_, &client, seq_bytes(KvEventPublisher::kEndOfReply), "",
                 /*with_topic=*/false);
  }

  const KvEventPublisher::Options options_;
  const WireOptions wire_;
  zmq::context_t context_{1};
  zmq::socket_t pub_;
  zmq::socket_t router_;
  std::string endpoint_;
  std::string replay_endpoint_;
  std::string failed_endpoint_;
  std::thread thread_;
  std::atomic<bool> stop_{false};

  // Scheduler thread only.
  std::unique_ptr<StagedBatch> current_;
  std::atomic<int64_t> next_seq_{0};  // written by the scheduler thread only

  // Shared, under mutex_.
  std::mutex mutex_;
  std::deque<std::unique_ptr<StagedBatch>> ready_;
  std::vector<std::unique_ptr<StagedBatch>> spare_;
  int64_t queued_events_ = 0;

  // Publisher thread only.
  CacheMirror mirror_;
  std::deque<std::pair<int64_t, std::string>> replay_;
  int64_t replay_bytes_ = 0;
  int64_t next_unpublished_seq_ = 0;

  std::atomic<int64_t> steps_published_{0}, events_published_{0};
  std::atomic<int64_t> steps_dropped_hwm_{0}, events_dropped_hwm_{0};
  std::atomic<int64_t> steps_dropped_queue_{0}, events_dropped_queue_{0};
  std::atomic<int64_t> replay_requests_{0}, snapshot_requests_{0};
  std::atomic<int64_t> cached_blocks_{0};
};

}  // namespace internal

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::create(Options options) {
  if (absl::Status s = internal::check_options(options); !s.ok()) return s;
  auto core = std::make_unique<internal::PublisherCore>(std::move(options));
  if (absl::Status s = core->start(); !s.ok()) return s;
  return std::unique_ptr<KvEventPublisher>(new KvEventPublisher(std::move(core)));
}

KvEventPublisher::KvEventPublisher(std::unique_ptr<internal::PublisherCore> core)
    : core_(std::move(core)) {}

KvEventPublisher::~KvEventPublisher() {
  core_->end_step();
  core_.reset();
}

void KvEventPublisher::on_event(const KvEvent& event) { core_->add(event); }

void KvEventPublisher::end_step() { core_->end_step(); }

const std::string& KvEventPublisher::endpoint() const { return core_->endpoint(); }

const std::string& KvEventPublisher::replay_endpoint() const { return core_->replay_endpoint(); }

KvEventPublisher::Stats KvEventPublisher::stats() const { return core_->stats(); }

}  // namespace pagedkv
