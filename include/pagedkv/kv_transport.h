// File: pagedkv/kv_transport.h
//
// KvTransport: one connection between two processes that moves bytes both ways without
// waiting, the seam under KvTransferSender and KvTransferReceiver (kv_transfer.h). The
// transfer protocol (frames, checksums, deadlines, acknowledgements) lives above it, so a
// backend only moves bytes in order and says when the peer is gone. docs/transfer.md
// covers the protocol and the backends.
//
// Backends, chosen by the endpoint's scheme:
//   tcp://HOST:PORT  a TCP connection (TCP_NODELAY); a listener's PORT 0 takes a free port.
//   shm://NAME       two byte rings in a memfd the connecting side creates (one per
//                    direction: the bytes are copied into the ring and out of it, no
//                    syscall per byte), with a UNIX socket in Linux's abstract namespace
//                    (name "pagedkv-transfer/NAME") that carries the memfd, wakes the peer
//                    and tells it when this side is gone. Both processes on one machine.
// Another backend (UCX, libfabric; see docs/transfer.md, "RDMA") implements KvTransport
// and is handed to create_kv_transfer_sender() / create_kv_transfer_receiver().
//
// Threading: one thread uses a transport at a time (the sender's or receiver's owner).
// Nothing here throws; errors are Status values that name the endpoint.
//
// Example (in a function returning a Status):
//   auto listener = listen_kv_transport("tcp://127.0.0.1:0");
//   if (!listener.ok()) return listener.status();
//   std::string endpoint = (*listener)->endpoint();   // "tcp://127.0.0.1:40123"
//   // ... the peer calls connect_kv_transport(endpoint, absl::Seconds(1)); then here:
//   auto transport = (*listener)->accept(absl::Seconds(1));
#ifndef PAGEDKV_KV_TRANSPORT_H_
#define PAGEDKV_KV_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pagedkv {

using ConstByteSpan = std::span<const std::byte>;
using MutableByteSpan = std::span<std::byte>;

class KvTransport {
 public:
  virtual ~KvTransport() = default;

  // KvTransport::write_some()
  //
  // Sends the bytes of `segments`, in order, as far as the connection takes them without
  // waiting; returns how many (0: it would wait). Errors: Unavailable when the connection
  // is closed or broken (the peer closed it, died, or close() was called here).
  [[nodiscard]] virtual absl::StatusOr<size_t> write_some(
      std::span<const ConstByteSpan> segments) = 0;

  // KvTransport::read_some()
  //
  // Receives into `segments`, in order, the bytes that have arrived, without waiting;
  // returns how many (0: none yet). Errors: Unavailable once the peer is gone and every
  // byte it sent has been read, or when the connection broke.
  [[nodiscard]] virtual absl::StatusOr<size_t> read_some(
      std::span<const MutableByteSpan> segments) = 0;

  // KvTransport::wait()
  //
  // Returns when read_some() may move bytes or fail, when write_some() may (only if
  // `for_write`), or at `deadline`, whichever is first. It may return early; callers
  // loop. Never waits past `deadline`.
  virtual void wait(bool for_write, absl::Time deadline) = 0;

  // KvTransport::close()
  //
  // Ends the connection now: later calls here fail with Unavailable; the peer reads what
  // was sent before, then Unavailable.
  virtual void close() = 0;

  // The peer, for messages: "tcp://127.0.0.1:40123", "shm://decode-0".
  virtual const std::string& peer() const = 0;
};

class KvTransportListener {
 public:
  virtual ~KvTransportListener() = default;

  // KvTransportListener::accept()
  //
  // Waits at most `timeout` for one peer to connect and returns the connection.
  // Errors: DeadlineExceeded naming the endpoint and the timeout; Unavailable on a socket
  // error; DataLoss when a shm peer hands over a ring that does not check out.
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<KvTransport>> accept(
      absl::Duration timeout) = 0;

  // The endpoint peers connect to, with the port the system chose for a port 0.
  virtual const std::string& endpoint() const = 0;
};

struct KvTransportOptions {
  // shm: bytes of each direction's ring, a power of two in [64 KiB, 1 GiB]; the connecting
  // side chooses it.
  int64_t shm_ring_bytes = 16 << 20;
};

// Listens at `endpoint` (see the schemes above).
// Errors: InvalidArgument for a malformed endpoint, naming it and the accepted forms;
// Unavailable when the address cannot be bound (in use, say), with the system's reason.
[[nodiscard]] absl::StatusOr<std::unique_ptr<KvTransportListener>> listen_kv_transport(
    std::string_view endpoint);

// Connects to a listener at `endpoint`, waiting at most `timeout`.
// Errors: InvalidArgument for a malformed endpoint, a timeout <= 0 or a ring size outside
// its range (the value and the limit named); DeadlineExceeded; Unavailable when refused.
[[nodiscard]] absl::StatusOr<std::unique_ptr<KvTransport>> connect_kv_transport(
    std::string_view endpoint, absl::Duration timeout, const KvTransportOptions& options = {});

}  // namespace pagedkv

#endif  // PAGEDKV_KV_TRANSPORT_H_
