// File: src/transfer/frame_connection.h
//
// FrameConnection: a transport with its frame writer and reader, and the error that ended
// it. The sender and the receiver each own one; the handshake runs on it first.
#ifndef PAGEDKV_TRANSFER_FRAME_CONNECTION_H_
#define PAGEDKV_TRANSFER_FRAME_CONNECTION_H_

#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "pagedkv/kv_transfer.h"
#include "pagedkv/kv_transport.h"
#include "transfer/frame_stream.h"

namespace pagedkv::internal {

class FrameConnection {
 public:
  explicit FrameConnection(std::unique_ptr<KvTransport> transport)
      : transport_(std::move(transport)) {}

  // Writes queued frames and reads arrived ones, without waiting. Returns the error that
  // ends the connection when it happens here (once); OK otherwise, also once it is down.
  [[nodiscard]] absl::Status exchange(
      FrameReader::Handler& handler,
      absl::FunctionRef<void(const FrameHeader&)> on_frame_written = [](const FrameHeader&) {});

  // Writes queued frames only; errors as exchange().
  [[nodiscard]] absl::Status flush();

  // Queues a frame; dropped when the connection is down.
  void send(OutgoingFrame frame);

  // Stops reading the caller's memory for `transfer` (queued frames) and writing it (the
  // block payload being read).
  void forget(KvTransferId transfer);

  // Waits until bytes can move, the next queued frame is due, or `deadline`.
  void wait(absl::Time deadline);

  bool up() const { return status_.ok(); }
  const absl::Status& status() const { return status_; }
  const std::string& peer() const { return transport_->peer(); }

 private:
  std::unique_ptr<KvTransport> transport_;
  FrameWriter writer_;
  FrameReader reader_;
  absl::Status status_;
};

// The handshake. The sender sends its namespace digest and block sizes and waits for the
// answer; the receiver compares them with its own and answers. Both wait at most
// options.handshake_timeout. Errors: FailedPrecondition naming both values when they
// differ; DeadlineExceeded; the connection's error.
absl::Status send_hello(FrameConnection& connection, const KvTransferOptions& options);
absl::Status answer_hello(FrameConnection& connection, const KvTransferOptions& options);

}  // namespace pagedkv::internal

#endif  // PAGEDKV_TRANSFER_FRAME_CONNECTION_H_
