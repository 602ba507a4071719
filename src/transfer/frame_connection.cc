#include "transfer/frame_connection.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pagedkv::internal {
namespace {

// Bytes read per exchange() at most, so that a fast peer cannot hold the caller.
constexpr int64_t kMaxReadPerExchange = 64 << 20;

}  // namespace

absl::Status FrameConnection::exchange(
    FrameReader::Handler& handler, absl::FunctionRef<void(const FrameHeader&)> on_frame_written) {
  if (!up()) return absl::OkStatus();
  absl::Status status = writer_.flush(*transport_, on_frame_written);
  if (status.ok()) status = reader_.read(*transport_, handler, kMaxReadPerExchange);
  // What the handler queued (acknowledgements) leaves now rather than at the next call.
  if (status.ok()) status = writer_.flush(*transport_, on_frame_written);
  if (!status.ok()) {
    status_ = status;
    transport_->close();
  }
  return status;
}

absl::Status FrameConnection::flush() {
  if (!up()) return absl::OkStatus();
  absl::Status status = writer_.flush(*transport_, [](const FrameHeader&) {});
  if (!status.ok()) {
    status_ = status;
    transport_->close();
  }
  return status;
}

void FrameConnection::send(OutgoingFrame frame) {
  if (up()) writer_.push(std::move(frame));
}

void FrameConnection::forget(KvTransferId transfer) {
  writer_.forget(transfer);
  reader_.drop_payload_of(transfer);
}

void FrameConnection::wait(absl::Time deadline) {
  if (!up()) return;
  const absl::Time due = writer_.front_due();
  const bool due_now = due <= absl::Now();
  transport_->wait(/*for_write=*/due_now, due_now ? deadline : std::min(deadline, due));
}

namespace {

// Takes the first control frame of the handshake.
class HelloHandler final : public FrameReader::Handler {
 public:
  std::vector<MutableByteSpan> block_destination(const FrameHeader&) override { return {}; }
  absl::Status on_frame(const FrameHeader& header, std::span<const std::byte> payload,
                        bool intact) override {
    if (!intact) {
      return absl::DataLossError(absl::StrCat("handshake frame with a bad payload checksum"));
    }
    if (!frame.has_value()) {
      frame = header;
      text.assign(reinterpret_cast<const char*>(payload.data()), payload.size());
    }
    return absl::OkStatus();
  }

  std::optional<FrameHeader> frame;
  std::string text;
};

absl::Status await_frame(FrameConnection& connection, HelloHandler& handler, FrameKind kind,
                         const KvTransferOptions& options) {
  const absl::Time deadline = absl::Now() + options.handshake_timeout;
  while (!handler.frame.has_value()) {
    // A peer that refuses answers and closes: its answer counts, not the close.
    const absl::Status status = connection.exchange(handler);
    if (handler.frame.has_value()) break;
    if (!status.ok()) return status;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "handshake with ", connection.peer(), ": no answer within handshake_timeout ",
          absl::FormatDuration(options.handshake_timeout)));
    }
    connection.wait(deadline);
  }
  if (handler.frame->kind != kind) {
    return absl::DataLossError(absl::StrCat(
        "handshake with ", connection.peer(), ": a frame of kind ",
        static_cast<int>(handler.frame->kind), " came first, not ", static_cast<int>(kind)));
  }
  return absl::OkStatus();
}

std::string describe(const HelloPayload& hello) {
  return absl::StrCat("namespace '", hello.namespace_digest, "', block bytes [",
                      absl::StrJoin(hello.block_bytes, ", "), "]");
}

}  // namespace

absl::Status send_hello(FrameConnection& connection, const KvTransferOptions& options) {
  const HelloPayload hello{options.namespace_digest, options.block_bytes};
  connection.send(control_frame({.kind = FrameKind::kHello}, encode_hello(hello)));
  HelloHandler handler;
  if (absl::Status status = await_frame(connection, handler, FrameKind::kHelloReply, options);
      !status.ok()) {
    return status;
  }
  if (handler.frame->outcome != KvTransferOutcome::kComplete) {
    return absl::FailedPreconditionError(
        absl::StrCat("receiver ", connection.peer(), " refused the handshake: ", handler.text));
  }
  return absl::OkStatus();
}

absl::Status answer_hello(FrameConnection& connection, const KvTransferOptions& options) {
  HelloHandler handler;
  if (absl::Status status = await_frame(connection, handler, FrameKind::kHello, options);
      !status.ok()) {
    return status;
  }
  absl::StatusOr<HelloPayload> theirs = decode_hello(
      std::span(reinterpret_cast<const std::byte*>(handler.text.data()), handler.text.size()));
  if (!theirs.ok()) return theirs.status();
  const HelloPayload ours{options.namespace_digest, options.block_bytes};
  std::string refusal;
  if (theirs->namespace_digest != ours.namespace_digest ||
      theirs->block_bytes != ours.block_bytes) {
    refusal =
        absl::StrCat("the sender has ", describe(*theirs), "; the receiver has ", describe(ours));
  }
  const auto outcome = refusal.empty() ? KvTransferOutcome::kComplete : KvTransferOutcome::kFailed;
  connection.send(control_frame({.kind = FrameKind::kHelloReply, .outcome = outcome}, refusal));
  // Only written: block frames may follow the answer at once, for the receiver's handler.
  if (absl::Status status = connection.flush(); !status.ok()) return status;
  if (!refusal.empty()) return absl::FailedPreconditionError(refusal);
  return absl::OkStatus();
}

}  // namespace pagedkv::internal
