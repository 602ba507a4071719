// KvTransferSender: a transfer's blocks go out as block frames followed by its end; it
// completes with the receiver's acknowledgement, or at its deadline.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "pagedkv/kv_transfer.h"
#include "pagedkv/kv_transfer_faults.h"
#include "transfer/fault_injector.h"
#include "transfer/frame_connection.h"
#include "transfer/transfer_checks.h"
#include "transfer/transfer_table.h"

namespace pagedkv {
namespace internal {
namespace {

// The code of a receiver's answer that was not kComplete.
absl::StatusCode answer_code(KvTransferOutcome outcome) {
  switch (outcome) {
    case KvTransferOutcome::kCancelled:
      return absl::StatusCode::kCancelled;
    case KvTransferOutcome::kTimedOut:
      return absl::StatusCode::kDeadlineExceeded;
    default:
      return absl::StatusCode::kDataLoss;
  }
}

OutgoingFrame block_frame(KvTransferId id, const KvTransferBlock& block, int64_t bytes) {
  OutgoingFrame frame;
  frame.fields = {.kind = FrameKind::kBlock,
                  .transfer = id,
                  .group = block.group,
                  .index = block.index,
                  .hash = block.hash,
                  .payload_bytes = static_cast<uint64_t>(bytes)};
  frame.payload.assign(block.parts.begin(), block.parts.end());
  return frame;
}

class Sender final : public KvTransferSender, private FrameReader::Handler {
 public:
  Sender(std::unique_ptr<KvTransport> transport, KvTransferOptions options, FaultInjector faults)
      : connection_(std::move(transport)),
        options_(std::move(options)),
        faults_(std::move(faults)) {}

  absl::Status handshake() { return send_hello(connection_, options_); }

  absl::Status send(KvTransferId id, std::vector<KvTransferBlock> blocks,
                    absl::Duration timeout) override {
    if (absl::Status ok = check_blocks("send", id, blocks, timeout, options_); !ok.ok()) {
      return ok;
    }
    if (absl::Status ok = check_admission("send", id, transfers_.contains(id), in_flight(),
                                          options_, connection_.status());
        !ok.ok()) {
      return ok;
    }
    Transfer& transfer = transfers_[id];
    transfer.timeout = timeout;
    transfer.deadline = absl::Now() + timeout;
    int32_t queued = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
      OutgoingFrame frame = block_frame(id, blocks[i], options_.block_bytes[blocks[i].group]);
      if (!faults_.apply(id, static_cast<int32_t>(i), frame)) continue;
      connection_.send(std::move(frame));
      ++queued;
    }
    connection_.send(
        control_frame({.kind = FrameKind::kEnd, .transfer = id, .blocks = queued}, ""));
    transfer.blocks = std::move(blocks);
    return absl::OkStatus();
  }

  absl::Status cancel(KvTransferId id) override {
    if (!transfers_.contains(id)) {
      return absl::NotFoundError(absl::StrCat("cancel(transfer ", id, "): not in flight (",
                                              transfers_.size(), " transfers are)"));
    }
    finish(id, KvTransferOutcome::kCancelled,
           absl::CancelledError(absl::StrCat("transfer ", id, " cancelled by the sender")));
    return absl::OkStatus();
  }

  size_t poll(std::vector<KvSendCompletion>* out) override {
    absl::Status lost = connection_.exchange(
        *this, [this](const FrameHeader& header) { on_frame_written(header); });
    if (!lost.ok()) fail_all(lost);
    expire(absl::Now());
    return hand_over(finished_, out);
  }

  void wait(absl::Duration max_wait) override {
    connection_.wait(earliest_deadline(transfers_, absl::Now() + max_wait));
  }

  int32_t in_flight() const override { return static_cast<int32_t>(transfers_.size()); }
  absl::Status connection_status() const override { return connection_.status(); }

 private:
  struct Transfer {
    std::vector<KvTransferBlock> blocks;  // the caller's views, read until the end
    absl::Duration timeout;
    absl::Time deadline;
    int32_t blocks_sent = 0;
    bool end_written = false;  // its end frame left: the receiver will answer it
  };

  void on_frame_written(const FrameHeader& header) {
    auto found = transfers_.find(header.transfer);
    if (found == transfers_.end()) return;
    if (header.kind == FrameKind::kBlock) ++found->second.blocks_sent;
    if (header.kind == FrameKind::kEnd) found->second.end_written = true;
  }

  // Handler: a sender is sent no blocks.
  std::vector<MutableByteSpan> block_destination(const FrameHeader&) override { return {}; }

  // Handler: the receiver's answers.
  absl::Status on_frame(const FrameHeader& header, std::span<const std::byte> payload,
                        bool intact) override {
    if (header.kind != FrameKind::kAck || !intact) {
      return absl::DataLossError(
          absl::StrCat("from ", connection_.peer(), ": frame kind ", static_cast<int>(header.kind),
                       intact ? "" : " with a bad checksum", " is not an answer a sender reads"));
    }
    if (!transfers_.contains(header.transfer)) return absl::OkStatus();  // finished here
    const absl::string_view reason(reinterpret_cast<const char*>(payload.data()), payload.size());
    const absl::Status detail =
        header.outcome == KvTransferOutcome::kComplete
            ? absl::OkStatus()
            : absl::Status(answer_code(header.outcome), absl::StrCat("receiver: ", reason));
    finish(header.transfer, header.outcome, detail, /*verified=*/header.blocks);
    return absl::OkStatus();
  }

  void expire(absl::Time now) {
    for (const KvTransferId id : due_transfer_ids(transfers_, now)) {
      finish(id, KvTransferOutcome::kTimedOut,
             absl::DeadlineExceededError(absl::StrCat(
                 "transfer ", id, ": no answer from ", connection_.peer(), " within its timeout ",
                 absl::FormatDuration(transfers_.at(id).timeout))));
    }
  }

  void fail_all(const absl::Status& lost) {
    for (const KvTransferId id : transfer_ids(transfers_)) {
      finish(id, KvTransferOutcome::kFailed,
             absl::Status(lost.code(),
                          absl::StrCat("transfer ", id, ": connection lost: ", lost.message())));
    }
  }

  // Ends transfer `id`: its block bytes are not read after this. `verified` >= 0 is the
  // receiver's answer.
  void finish(KvTransferId id, KvTransferOutcome outcome, absl::Status detail,
              int32_t verified = -1) {
    connection_.forget(id);
    auto node = transfers_.extract(id);
    const Transfer& transfer = node.mapped();
    // Every transfer's frames end with an end or a cancel, so the receiver can tell.
    if (!transfer.end_written) {
      connection_.send(control_frame({.kind = FrameKind::kCancel, .transfer = id}, ""));
    }
    finished_.push_back({.id = id,
                         .outcome = outcome,
                         .acknowledged = verified >= 0,
                         .blocks_verified = std::max(verified, 0),
                         .blocks_sent = transfer.blocks_sent,
                         .detail = std::move(detail)});
  }

  FrameConnection connection_;
  KvTransferOptions options_;
  FaultInjector faults_;
  absl::flat_hash_map<KvTransferId, Transfer> transfers_;
  std::vector<KvSendCompletion> finished_;
};

absl::StatusOr<std::unique_ptr<KvTransferSender>> create_sender(
    std::unique_ptr<KvTransport> transport, KvTransferOptions options, FaultInjector faults) {
  if (absl::Status ok = check_options(options); !ok.ok()) return ok;
  auto sender =
      std::make_unique<Sender>(std::move(transport), std::move(options), std::move(faults));
  if (absl::Status ok = sender->handshake(); !ok.ok()) return ok;
  return sender;
}

}  // namespace
}  // namespace internal

absl::StatusOr<std::unique_ptr<KvTransferSender>> create_kv_transfer_sender(
    std::unique_ptr<KvTransport> transport, KvTransferOptions options) {
  return internal::create_sender(std::move(transport), std::move(options), {});
}

absl::StatusOr<std::unique_ptr<KvTransferSender>> create_fault_injecting_kv_transfer_sender(
    std::unique_ptr<KvTransport> transport, KvTransferOptions options,
    std::vector<KvTransferFault> faults) {
  if (absl::Status ok = internal::FaultInjector::check(faults); !ok.ok()) return ok;
  return internal::create_sender(std::move(transport), std::move(options),
                                 internal::FaultInjector(std::move(faults)));
}

absl::StatusOr<std::unique_ptr<KvTransferSender>> connect_kv_transfer(
    std::string_view endpoint, KvTransferOptions options,
    const KvTransportOptions& transport_options) {
  if (absl::Status ok = internal::check_options(options); !ok.ok()) return ok;
  absl::StatusOr<std::unique_ptr<KvTransport>> transport =
      connect_kv_transport(endpoint, options.handshake_timeout, transport_options);
  if (!transport.ok()) return transport.status();
  return create_kv_transfer_sender(*std::move(transport), std::move(options));
}

}  // namespace pagedkv
