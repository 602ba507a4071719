// File: pagedkv/kv_event_publisher.h
//
// KvEventPublisher: a KvEventSink that puts the manager's KV events on the wire in vLLM's
// format, so a KV-aware router written for vLLM (llm-d, Dynamo, SGLang's router) can follow
// a pagedkv engine. docs/events.md gives the format field by field.
//   - PUB socket: one message per engine step, (topic, 8-byte big-endian sequence number,
//     msgpack KVEventBatch [timestamp, events, data_parallel_rank]).
//   - ROUTER socket (optional): a subscriber that saw a gap in the sequence numbers asks for
//     a replay from a sequence number (vLLM's protocol), or for a snapshot of every cached
//     block (pagedkv's addition) when the gap is older than the replay buffer.
//   - Optional ZeroMQ CURVE on both sockets (Options::curve_*): encrypted, and only the
//     clients whose public keys are listed can connect.
//
// Threading: the scheduler thread calls on_event() (through the manager) and end_step()
// once per engine step; both only copy into a reused staging buffer and, at end_step(),
// hand it to the publisher's own thread under a short lock. No I/O, no allocation once the
// buffers have grown, never a wait for the network. Encoding, sending, the replay buffer
// and the snapshot state live on the publisher thread. stats() may be read from any thread.
//
// Memory is bounded: at most max_queued_events events wait for the publisher thread (a
// step beyond that is dropped and counted, and its sequence number is skipped so that
// subscribers see the gap), at most replay_buffer_steps batches are kept for replay, a
// subscriber that does not keep up loses messages at the PUB socket's high-water mark
// (counted, see Options::count_hwm_drops), and replies queue at most reply_hwm messages
// per peer. Replay and snapshot requests never hold back live batches: their replies go
// out in bounded turns between them (docs/events.md gives the bounds).
//
// Example (in a function returning a Status, with the manager's `options` to fill):
//   auto publisher = KvEventPublisher::create({.endpoint = "tcp://127.0.0.1:5557",
//                                              .replay_endpoint = "tcp://127.0.0.1:5558"});
//   if (!publisher.ok()) return publisher.status();
//   options.event_sink = publisher->get();  // KvCacheManager::Options
//   // create the manager with `options`; then after every engine step:
//   (*publisher)->end_step();
#ifndef PAGEDKV_KV_EVENT_PUBLISHER_H_
#define PAGEDKV_KV_EVENT_PUBLISHER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "pagedkv/kv_events.h"

namespace pagedkv {
namespace internal {
class PublisherCore;
}  // namespace internal

class KvEventPublisher : public KvEventSink {
 public:
  struct Options {
    // PUB endpoint, bound: "tcp://127.0.0.1:5557", "tcp://127.0.0.1:*" (a free port, see
    // endpoint()), "ipc:///run/engine0-kv-events".
    std::string endpoint = "";
    // ROUTER endpoint for replay and snapshot requests; empty: none (and no replay buffer
    // or snapshot state is kept).
    std::string replay_endpoint = "";
    std::string topic = "";          // first frame of every message (vLLM: "")
    int32_t data_parallel_rank = 0;  // third field of every batch
    std::string medium = "GPU";      // "medium" of device blocks' events (host-tier ones: "CPU")
    int32_t replay_buffer_steps = 10000;      // batches kept for replay (vLLM's buffer_steps)
    int64_t replay_buffer_bytes = 256 << 20;  // and at most this many payload bytes
    int32_t hwm = 100000;                     // PUB send high-water mark, in messages
    // true: a message that some subscriber's queue cannot take is dropped for all and
    // counted (ZMQ_XPUB_NODROP); false: each slow subscriber silently loses its own
    // messages, as in vLLM. Either way subscribers see the gap and can replay.
    bool count_hwm_drops = true;
    int64_t max_queued_events = 1 << 20;       // events waiting for the publisher thread
    int32_t snapshot_blocks_per_batch = 1024;  // BlockStored events per snapshot message
    // Replies to replay and snapshot requests go out between live batches, in turns of at
    // most reply_messages_per_turn messages, one per pending reply in turn. A peer has at
    // most one request pending (a second is refused), and at most max_pending_requests
    // are; a refused request is answered "busy" (kBusyMarker) when the peer's queue has
    // room, and the client asks again later. A peer whose
    // queue stays full (reply_hwm messages) for stalled_peer_timeout_ms loses its reply.
    // Memory: docs/events.md, "Bounds under load".
    int32_t max_pending_requests = 1024;
    int32_t reply_messages_per_turn = 32;
    int32_t reply_hwm = 64;                  // ROUTER send high-water mark per peer, messages
    int32_t reply_sndbuf_bytes = 256 << 10;  // kernel send buffer per peer (SO_SNDBUF)
    int32_t stalled_peer_timeout_ms = 1000;
    // Authenticated, encrypted events (ZeroMQ CURVE) on both sockets; off when both are
    // empty, else give both. The publisher's secret certificate (the NAME.key_secret that
    // zmq.auth.create_certificates() or pagedkv-curve-keygen writes), and a directory of
    // the public certificates (*.key) of the clients allowed to connect: a client needs its
    // own key pair and the publisher's public key. docs/events.md, "Authenticated events".
    std::string curve_secret_key_file = "";
    std::string curve_allowed_clients_dir = "";
  };

  struct Stats {
    int64_t next_seq = 0;           // the sequence number the next step's batch gets
    int64_t steps_published = 0;    // batches sent on the PUB socket
    int64_t events_published = 0;   // events in those batches
    int64_t steps_dropped_hwm = 0;  // batches the PUB socket refused (slow subscriber)
    int64_t events_dropped_hwm = 0;
    int64_t steps_dropped_queue = 0;  // batches dropped before the publisher thread
    int64_t events_dropped_queue = 0;
    int64_t replay_requests = 0;
    int64_t snapshot_requests = 0;
    int64_t requests_refused = 0;       // a reply already pending for the peer, or too many
    int64_t stalled_peers_dropped = 0;  // replies given up: the peer did not read
    int64_t handshakes_refused = 0;     // CURVE clients whose public key is not allowed
    int64_t cached_blocks = 0;  // blocks in the snapshot state (kept with a replay endpoint)
  };

  // The request payload that asks the ROUTER socket for a snapshot instead of a replay:
  // -2 as an 8-byte big-endian signed integer (vLLM's publisher answers it with END only).
  static constexpr int64_t kSnapshotRequest = -2;
  // The sequence number of the END marker that closes a replay or snapshot reply (vLLM's).
  static constexpr int64_t kEndOfReply = -1;
  // A refused replay or snapshot request is answered by END with this marker in the frame
  // before the seq, where END has an empty one: [ "", "busy", -1, "" ]. The reply has the
  // END seq and an empty payload, so a client that knows only END sees an empty reply;
  // one that knows the marker asks again later.
  static constexpr char kBusyMarker[] = "busy";

  // Binds the sockets and starts the publisher thread. Errors: InvalidArgument for an
  // empty endpoint, a non-positive buffer or queue size, only one of the CURVE options, or
  // a key file or directory that cannot be read or holds no valid key (the message names
  // the file and what is wrong); FailedPrecondition for CURVE options when libzmq was
  // built without CURVE; Unavailable when a socket cannot bind (the message names the
  // endpoint and ZeroMQ's reason).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<KvEventPublisher>> create(Options options);

  // Hands the pending step to the publisher thread, then stops it after it has sent every
  // step handed to it, and closes the sockets (waiting up to 1 s for queued messages).
  ~KvEventPublisher() override;
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // KvEventPublisher::on_event()
  //
  // Adds an event to the current step's batch (scheduler thread; a copy into reused
  // buffers).
  void on_event(const KvEvent& event) override;

  // KvEventPublisher::end_step()
  //
  // Closes the current step: a non-empty batch gets the next sequence number and a
  // timestamp and goes to the publisher thread. Call once per engine step, after the
  // manager calls of the step (scheduler thread). A step without events sends nothing.
  void end_step();

  // The bound endpoints (with the port chosen for "tcp://host:*").
  const std::string& endpoint() const;
  const std::string& replay_endpoint() const;

  // Counters so far; any thread.
  Stats stats() const;

 private:
  explicit KvEventPublisher(std::unique_ptr<internal::PublisherCore> core);
  std::unique_ptr<internal::PublisherCore> core_;
};

}  // namespace pagedkv

#endif  // PAGEDKV_KV_EVENT_PUBLISHER_H_
