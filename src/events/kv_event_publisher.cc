// KvEventPublisher: the scheduler-thread hand-off, then the publisher thread's loop
// (publish, replay, snapshot).
#include "pagedkv/kv_event_publisher.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "events/cache_mirror.h"
#include "events/curve_keys.h"
#include "events/staged_batch.h"
#include "events/wire_format.h"
#include "events/zap_handler.h"

namespace pagedkv {
namespace internal {
namespace {

// How long the publisher thread sleeps when it has nothing to do. The scheduler never
// wakes it (that would cost a system call per step), so this bounds the added latency.
constexpr auto kIdlePoll = std::chrono::milliseconds(1);
constexpr auto kCloseLinger = std::chrono::milliseconds(1000);
// Recycled batches kept for the scheduler thread; beyond this they are freed.
constexpr size_t kMaxSpareBatches = 64;
// Requests read from the ROUTER socket per loop turn, so that a flood of them cannot hold
// back the next live batch.
constexpr int kMaxRequestsPerTurn = 256;

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
  if (o.max_pending_requests <= 0) {
    return invalid("max_pending_requests ", o.max_pending_requests, " must be > 0");
  }
  if (o.reply_messages_per_turn <= 0) {
    return invalid("reply_messages_per_turn ", o.reply_messages_per_turn, " must be > 0");
  }
  if (o.reply_hwm <= 0) return invalid("reply_hwm ", o.reply_hwm, " must be > 0");
  if (o.reply_sndbuf_bytes <= 0) {
    return invalid("reply_sndbuf_bytes ", o.reply_sndbuf_bytes, " must be > 0");
  }
  if (o.stalled_peer_timeout_ms <= 0) {
    return invalid("stalled_peer_timeout_ms ", o.stalled_peer_timeout_ms, " must be > 0");
  }
  if (o.curve_secret_key_file.empty() != o.curve_allowed_clients_dir.empty()) {
    return o.curve_secret_key_file.empty()
               ? invalid("curve_allowed_clients_dir \"", o.curve_allowed_clients_dir,
                         "\" is set but curve_secret_key_file is empty: CURVE needs both")
               : invalid("curve_secret_key_file \"", o.curve_secret_key_file,
                         "\" is set but curve_allowed_clients_dir is empty: CURVE needs both");
  }
  return absl::OkStatus();
}

// The publisher's CURVE keys: its own secret key and the clients it admits.
struct CurveSetup {
  CurveKeyPair server;
  std::vector<std::string> allowed_client_keys;  // raw 32-byte public keys
};

// Reads the CURVE key files of the options; nullopt when CURVE is off.
absl::StatusOr<std::optional<CurveSetup>> read_curve_setup(const KvEventPublisher::Options& o) {
  if (o.curve_secret_key_file.empty()) return std::nullopt;
  auto prefixed = [](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("KvEventPublisher: ", s.message()));
  };
  if (!curve_available()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KvEventPublisher: curve_secret_key_file \"", o.curve_secret_key_file,
        "\" asks for CURVE, but this libzmq has none (zmq_has(\"curve\") is false: it was built "
        "without libsodium)"));
  }
  absl::StatusOr<CurveKeyPair> server = read_secret_certificate(o.curve_secret_key_file);
  if (!server.ok()) return prefixed(server.status());
  absl::StatusOr<std::vector<std::string>> clients =
      read_allowed_client_keys(o.curve_allowed_clients_dir);
  if (!clients.ok()) return prefixed(clients.status());
  return CurveSetup{.server = *std::move(server), .allowed_client_keys = *std::move(clients)};
}

// ZMQ_ZAP_ENFORCE_DOMAIN (a draft option in libzmq 4.3, so cppzmq does not name it): a
// CURVE handshake fails, instead of being admitted, when no ZAP handler answers.
constexpr int kZapEnforceDomain = 93;

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int64_t read_big_endian(const unsigned char* bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < 8; ++i) value = (value << 8) | bytes[i];
  return static_cast<int64_t>(value);
}

int64_t read_big_endian(const zmq::message_t& frame) {
  return read_big_endian(static_cast<const unsigned char*>(frame.data()));
}

// A replay request's start seq as vLLM reads it (int.from_bytes(frame, "big")): unsigned,
// of any length, so an empty frame is 0. A value above every seq (the bytes of -1, say)
// saturates at INT64_MAX, which replays nothing: END only, as in vLLM.
int64_t read_replay_start(const zmq::message_t& frame) {
  constexpr uint64_t kMaxStart = std::numeric_limits<int64_t>::max();
  uint64_t value = 0;
  for (const unsigned char byte :
       std::span(static_cast<const unsigned char*>(frame.data()), frame.size())) {
    if (value > (kMaxStart >> 8)) return static_cast<int64_t>(kMaxStart);
    value = (value << 8) | byte;
  }
  return static_cast<int64_t>(std::min(value, kMaxStart));
}

int64_t read_big_endian_array(const std::array<char, 8>& bytes) {
  return read_big_endian(reinterpret_cast<const unsigned char*>(bytes.data()));
}

// A snapshot encoded once and sent to every peer that asks while it is current.
struct EncodedSnapshot {
  int64_t seq = 0;  // the first live batch after it
  std::vector<std::string> payloads;
};

// A replay or snapshot reply being sent, one message per turn.
struct PendingReply {
  std::string client;  // the ROUTER identity
  bool is_snapshot = false;
  int64_t next_seq = 0;  // replay: the next batch to send is the first kept at or after it
  // replay: the first seq not published when the request was read. The reply ends there,
  // as vLLM's (sent at once) does: a replay that chased the live stream would never end
  // while its turns come less often than steps do; the client has the rest live.
  int64_t end_seq = 0;
  std::shared_ptr<const EncodedSnapshot> snapshot;  // snapshot: taken when first served
  size_t next_batch = 0;                            // snapshot: index into its payloads
  std::optional<std::chrono::steady_clock::time_point> stalled_since;  // queue full since
};

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
  absl::Status start(std::optional<CurveSetup> curve) {
    if (curve) {
      absl::StatusOr<std::unique_ptr<ZapHandler>> zap =
          ZapHandler::start(context_, std::move(curve->allowed_client_keys));
      if (!zap.ok()) return zap.status();
      zap_ = *std::move(zap);
    }
    try {
      pub_ = zmq::socket_t(context_, zmq::socket_type::pub);
      if (curve) secure(pub_, curve->server);
      pub_.set(zmq::sockopt::sndhwm, options_.hwm);
      // Closing waits up to this long for queued messages to leave.
      pub_.set(zmq::sockopt::linger, static_cast<int>(kCloseLinger.count()));
      if (options_.count_hwm_drops) pub_.set(zmq::sockopt::xpub_nodrop, 1);
      endpoint_ = bind(pub_, options_.endpoint);
      if (!options_.replay_endpoint.empty()) {
        router_ = zmq::socket_t(context_, zmq::socket_type::router);
        if (curve) secure(router_, curve->server);
        // Replies go out in slices between live batches: a peer's queue holds at most
        // reply_hwm messages (and the kernel's reply_sndbuf_bytes); when it is full, a send
        // fails with EAGAIN (ROUTER_MANDATORY) instead of being dropped, and the reply
        // resumes on a later turn, or is given up when the peer does not read.
        router_.set(zmq::sockopt::sndhwm, options_.reply_hwm);
        router_.set(zmq::sockopt::sndbuf, options_.reply_sndbuf_bytes);
        router_.set(zmq::sockopt::router_mandatory, 1);
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
    s.requests_refused = requests_refused_.load(std::memory_order_relaxed);
    s.stalled_peers_dropped = stalled_peers_dropped_.load(std::memory_order_relaxed);
    s.handshakes_refused = zap_ ? zap_->refused() : 0;
    s.cached_blocks = cached_blocks_.load(std::memory_order_relaxed);
    return s;
  }

  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }

 private:
  // A CURVE server socket: encrypted, and a client is admitted only when the ZAP handler
  // knows its public key (with no handler answering, never).
  static void secure(zmq::socket_t& socket, const CurveKeyPair& server) {
    socket.set(zmq::sockopt::curve_server, 1);
    socket.set(zmq::sockopt::curve_secretkey, server.secret_key);
    socket.set(zmq::sockopt::zap_domain, "pagedkv");
    const int enforce = 1;
    // Best effort: a libzmq without the option still has the handler bound first.
    (void)zmq_setsockopt(socket.handle(), kZapEnforceDomain, &enforce, sizeof enforce);
  }

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
      // Live batches first; then one bounded slice of the replies.
      const bool replied = send_replies();
      read_requests(/*wait=*/taken.empty() && !replied);
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
    if (send_message(pub_, /*client=*/"", seq, payload) == Sent::kQueued) {
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

  enum class Sent { kQueued, kFull, kPeerGone };

  // Sends (topic, seq, payload) on the PUB socket (client empty) or to one ROUTER client;
  // `topic` nullopt is Options::topic. Never blocks. On the ROUTER socket
  // (ROUTER_MANDATORY) a peer's full queue refuses the identity frame, so a message is
  // queued whole or not at all, and a peer that left is told apart (EHOSTUNREACH).
  Sent send_message(zmq::socket_t& socket, std::string_view client, const std::array<char, 8>& seq,
                    std::string_view payload,
                    std::optional<std::string_view> topic = std::nullopt) {
    constexpr auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
    try {
      if (!client.empty()) {
        if (!socket.send(zmq::buffer(client), more)) return Sent::kFull;
        if (!socket.send(zmq::const_buffer(nullptr, 0), more)) return Sent::kFull;
      }
      if (!socket.send(zmq::buffer(topic.value_or(options_.topic)), more)) return Sent::kFull;
      if (!socket.send(zmq::buffer(seq), more)) return Sent::kFull;
      return socket.send(zmq::buffer(payload), zmq::send_flags::dontwait) ? Sent::kQueued
                                                                          : Sent::kFull;
    } catch (const zmq::error_t&) {
      return Sent::kPeerGone;
    }
  }

  // Reads the replay and snapshot requests waiting on the ROUTER socket, at most
  // kMaxRequestsPerTurn; with `wait`, first sleeps until one arrives or kIdlePoll passes.
  void read_requests(bool wait) {
    const auto timeout = wait ? kIdlePoll : std::chrono::milliseconds(0);
    if (!router_) {
      if (wait) std::this_thread::sleep_for(timeout);
      return;
    }
    try {
      zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, timeout) == 0) return;
      std::vector<zmq::message_t> frames;
      for (int i = 0; i < kMaxRequestsPerTurn; ++i) {
        if (!zmq::recv_multipart(router_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
          break;
        }
        accept_request(frames);
        frames.clear();
      }
    } catch (const zmq::error_t&) {
      // A malformed exchange must not stop publishing; the client times out and retries.
    }
  }

  // A request is (client id, "", big-endian start seq or 8-byte kSnapshotRequest). It
  // becomes a pending reply, or is refused when its peer already has one pending or
  // max_pending_requests are: then the peer gets the busy END, if its queue has room.
  void accept_request(const std::vector<zmq::message_t>& frames) {
    if (frames.size() != 3) return;  // not ours: ignore, like vLLM
    std::string client = frames[0].to_string();
    if (std::ssize(replies_) >= options_.max_pending_requests ||
        !peers_with_reply_.insert(client).second) {
      requests_refused_.fetch_add(1, std::memory_order_relaxed);
      // One small message that never waits: a full queue (a peer flooding requests and
      // not reading) drops it, and the client's timeout asks again.
      (void)send_message(router_, client, seq_bytes(KvEventPublisher::kEndOfReply),
                         /*payload=*/"", KvEventPublisher::kBusyMarker);
      return;
    }
    PendingReply reply;
    reply.client = std::move(client);
    if (frames[2].size() == 8 && read_big_endian(frames[2]) == KvEventPublisher::kSnapshotRequest) {
      snapshot_requests_.fetch_add(1, std::memory_order_relaxed);
      reply.is_snapshot = true;
    } else {
      replay_requests_.fetch_add(1, std::memory_order_relaxed);
      reply.next_seq = read_replay_start(frames[2]);
      reply.end_seq = next_unpublished_seq_;
    }
    replies_.push_back(std::move(reply));
  }

  // Sends at most reply_messages_per_turn reply messages, one per pending reply in turn.
  // Returns whether anything was sent.
  bool send_replies() {
    int sent = 0;
    const auto now = std::chrono::steady_clock::now();
    for (size_t tried = 0; tried < replies_.size() && sent < options_.reply_messages_per_turn;) {
      PendingReply& reply = replies_.front();
      switch (send_next(reply)) {
        case SendResult::kSent:
          ++sent;
          reply.stalled_since.reset();
          replies_.push_back(std::move(reply));
          tried = 0;
          break;
        case SendResult::kDone:
          ++sent;
          peers_with_reply_.erase(reply.client);
          tried = 0;
          break;
        case SendResult::kBlocked:
          if (!reply.stalled_since) reply.stalled_since = now;
          if (now - *reply.stalled_since >
              std::chrono::milliseconds(options_.stalled_peer_timeout_ms)) {
            // The peer does not read: free its reply. What ZeroMQ already queued for it
            // (at most reply_hwm messages) stays until it reads or disconnects.
            stalled_peers_dropped_.fetch_add(1, std::memory_order_relaxed);
            peers_with_reply_.erase(reply.client);
          } else {
            replies_.push_back(std::move(reply));
            ++tried;
          }
          break;
        case SendResult::kWaiting:
          replies_.push_back(std::move(reply));
          ++tried;
          break;
      }
      replies_.pop_front();
    }
    return sent > 0;
  }

  enum class SendResult { kSent, kDone, kBlocked, kWaiting };

  // Sends the reply's next message: a replayed batch, a snapshot batch, or the END marker.
  SendResult send_next(PendingReply& reply) {
    if (reply.is_snapshot && !reply.snapshot) {
      reply.snapshot = current_snapshot();
      if (!reply.snapshot) return SendResult::kWaiting;
    }
    std::string_view payload;
    std::array<char, 8> seq = seq_bytes(KvEventPublisher::kEndOfReply);
    if (reply.snapshot) {
      if (reply.next_batch < reply.snapshot->payloads.size()) {
        seq = seq_bytes(reply.snapshot->seq);
        payload = reply.snapshot->payloads[reply.next_batch];
      }
    } else {
      // The replay buffer may have moved on since the last message: resume at the first
      // batch kept at or after next_seq.
      auto it = std::lower_bound(replay_.begin(), replay_.end(), reply.next_seq,
                                 [](const auto& batch, int64_t s) { return batch.first < s; });
      if (it != replay_.end() && it->first < reply.end_seq) {
        seq = seq_bytes(it->first);
        payload = it->second;
      }
    }
    const bool is_end = payload.empty();
    // END has an empty frame where a batch has the topic.
    const std::optional<std::string_view> topic =
        is_end ? std::optional<std::string_view>("") : std::nullopt;
    switch (send_message(router_, reply.client, seq, payload, topic)) {
      case Sent::kFull:
        return SendResult::kBlocked;
      case Sent::kPeerGone:
        return SendResult::kDone;  // nobody to send the rest to
      case Sent::kQueued:
        break;
    }
    if (is_end) return SendResult::kDone;
    if (reply.snapshot) {
      ++reply.next_batch;
    } else {
      reply.next_seq = read_big_endian_array(seq) + 1;
    }
    return SendResult::kSent;
  }

  // The encoded snapshot that a snapshot reply starting now sends: the one being sent to
  // other peers if no live batch went out since it was taken, else a new one. At most one
  // is kept, so a reply that would need a second waits (nullptr) for the first to finish.
  std::shared_ptr<const EncodedSnapshot> current_snapshot() {
    if (auto shared = snapshot_.lock()) {
      return shared->seq == next_unpublished_seq_ ? shared : nullptr;
    }
    auto snapshot = std::make_shared<EncodedSnapshot>();
    // Consistent with every batch before next_unpublished_seq_: apply it, then the live
    // batches from that seq on.
    snapshot->seq = next_unpublished_seq_;
    for (StagedBatch& batch : mirror_.snapshot(options_.snapshot_blocks_per_batch)) {
      batch.timestamp = unix_seconds();
      encode_batch(batch, wire_, &snapshot->payloads.emplace_back());
    }
    snapshot_ = snapshot;
    return snapshot;
  }

  const KvEventPublisher::Options options_;
  const WireOptions wire_;
  zmq::context_t context_{1};
  // Destroyed after the sockets (declared before them): while a socket with CURVE is
  // open, its handshakes have a handler to ask.
  std::unique_ptr<ZapHandler> zap_;
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
  std::deque<PendingReply> replies_;                   // served in turn, front first
  absl::flat_hash_set<std::string> peers_with_reply_;  // client ids in replies_
  std::weak_ptr<const EncodedSnapshot> snapshot_;      // held by the replies sending it

  std::atomic<int64_t> steps_published_{0}, events_published_{0};
  std::atomic<int64_t> steps_dropped_hwm_{0}, events_dropped_hwm_{0};
  std::atomic<int64_t> steps_dropped_queue_{0}, events_dropped_queue_{0};
  std::atomic<int64_t> replay_requests_{0}, snapshot_requests_{0};
  std::atomic<int64_t> requests_refused_{0}, stalled_peers_dropped_{0};
  std::atomic<int64_t> cached_blocks_{0};
};

}  // namespace internal

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::create(Options options) {
  if (absl::Status s = internal::check_options(options); !s.ok()) return s;
  absl::StatusOr<std::optional<internal::CurveSetup>> curve = internal::read_curve_setup(options);
  if (!curve.ok()) return curve.status();
  auto core = std::make_unique<internal::PublisherCore>(std::move(options));
  if (absl::Status s = core->start(*std::move(curve)); !s.ok()) return s;
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
