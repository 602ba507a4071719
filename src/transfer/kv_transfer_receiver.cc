// KvTransferReceiver: block frames land in the destinations expect() posted; each
// transfer ends in one KvReceiveCompletion and one acknowledgement to the sender.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "pagedkv/kv_transfer.h"
#include "transfer/frame_connection.h"
#include "transfer/transfer_checks.h"
#include "transfer/transfer_table.h"

namespace pagedkv {
namespace internal {
namespace {

std::string hash_text(const BlockHash& hash) {
  return absl::StrFormat("%016x%016x", hash.hi, hash.lo);
}

class Receiver final : public KvTransferReceiver, private FrameReader::Handler {
 public:
  Receiver(std::unique_ptr<KvTransport> transport, KvTransferOptions options)
      : connection_(std::move(transport)), options_(std::move(options)) {}

  absl::Status handshake() { return answer_hello(connection_, options_); }

  absl::Status expect(KvTransferId id, std::vector<KvTransferDestination> destinations,
                      absl::Duration timeout) override {
    if (absl::Status ok = check_blocks("expect", id, destinations, timeout, options_); !ok.ok()) {
      return ok;
    }
    if (absl::Status ok = check_admission("expect", id, transfers_.contains(id), in_flight(),
                                          options_, connection_.status());
        !ok.ok()) {
      return ok;
    }
    Transfer& transfer = transfers_[id];
    transfer.timeout = timeout;
    transfer.deadline = absl::Now() + timeout;
    for (size_t i = 0; i < destinations.size(); ++i) {
      transfer.position[{destinations[i].group, destinations[i].index}] = static_cast<int32_t>(i);
      transfer.results.push_back({.group = destinations[i].group,
                                  .index = destinations[i].index,
                                  .state = KvBlockState::kMissing});
    }
    transfer.destinations = std::move(destinations);
    return absl::OkStatus();
  }

  absl::Status cancel(KvTransferId id) override {
    if (!transfers_.contains(id)) {
      return absl::NotFoundError(absl::StrCat("cancel(transfer ", id, "): not in flight (",
                                              transfers_.size(), " transfers are)"));
    }
    finish(id, KvTransferOutcome::kCancelled,
           absl::CancelledError(absl::StrCat("transfer ", id, " cancelled by the receiver")));
    return absl::OkStatus();
  }

  size_t poll(std::vector<KvReceiveCompletion>* out) override {
    if (absl::Status lost = connection_.exchange(*this); !lost.ok()) fail_all(lost);
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
    std::vector<KvTransferDestination> destinations;
    std::vector<KvBlockResult> results;                                  // in expect()'s order
    absl::flat_hash_map<std::pair<int32_t, int32_t>, int32_t> position;  // (group, index)
    absl::Duration timeout;
    absl::Time deadline;
    int32_t verified = 0;
    std::string first_problem;  // the first block that did not verify, for the detail
  };

  // Handler: where a block frame's payload goes.
  std::vector<MutableByteSpan> block_destination(const FrameHeader& header) override {
    auto found = transfers_.find(header.transfer);
    if (found == transfers_.end()) return {};  // not expected, or already finished
    Transfer& transfer = found->second;
    const auto at = transfer.position.find({header.group, header.index});
    const std::string block =
        absl::StrCat("block (group ", header.group, ", index ", header.index, ")");
    if (at == transfer.position.end()) {
      note_problem(transfer, absl::StrCat(block, " was sent but not expected"));
      return {};
    }
    KvBlockResult& result = transfer.results[at->second];
    const KvTransferDestination& destination = transfer.destinations[at->second];
    if (result.state == KvBlockState::kVerified) return {};  // a repeat: keep the first
    const int64_t bytes = options_.block_bytes[header.group];
    if (header.payload_bytes != static_cast<uint64_t>(bytes) || header.hash != destination.hash) {
      result.state = KvBlockState::kWrongBlock;
      note_problem(transfer, absl::StrCat(block, " arrived as ", header.payload_bytes,
                                          " bytes of hash ", hash_text(header.hash), "; expected ",
                                          bytes, " bytes of hash ", hash_text(destination.hash)));
      return {};
    }
    return destination.parts;
  }

  // Handler: a whole frame.
  absl::Status on_frame(const FrameHeader& header, std::span<const std::byte> payload,
                        bool intact) override {
    switch (header.kind) {
      case FrameKind::kBlock:
        on_block(header, intact);
        return absl::OkStatus();
      case FrameKind::kEnd:
        if (answered_.erase(header.transfer) == 0) on_end(header);
        return absl::OkStatus();
      case FrameKind::kCancel:
        if (answered_.erase(header.transfer) == 0 && transfers_.contains(header.transfer)) {
          finish(header.transfer, KvTransferOutcome::kCancelled,
                 absl::CancelledError(
                     absl::StrCat("transfer ", header.transfer, " cancelled by the sender")));
          answered_.erase(header.transfer);
        }
        return absl::OkStatus();
      default:
        return absl::DataLossError(absl::StrCat("from ", connection_.peer(), ": frame kind ",
                                                static_cast<int>(header.kind), " (", payload.size(),
                                                " payload bytes) is not one a receiver reads"));
    }
  }

  void on_block(const FrameHeader& header, bool intact) {
    Transfer& transfer = transfers_.at(header.transfer);
    KvBlockResult& result = transfer.results[transfer.position.at({header.group, header.index})];
    result.state = intact ? KvBlockState::kVerified : KvBlockState::kCorrupt;
    if (!intact) {
      note_problem(transfer, absl::StrCat("block (group ", header.group, ", index ", header.index,
                                          ") failed its payload checksum"));
      return;
    }
    if (++transfer.verified == std::ssize(transfer.results)) {
      finish(header.transfer, KvTransferOutcome::kComplete, absl::OkStatus());
    }
  }

  void on_end(const FrameHeader& header) {
    auto found = transfers_.find(header.transfer);
    if (found == transfers_.end()) {
      acknowledge(header.transfer, KvTransferOutcome::kFailed, 0,
                  absl::StrCat("the receiver does not expect transfer ", header.transfer));
      return;
    }
    Transfer& transfer = found->second;
    finish(header.transfer, KvTransferOutcome::kFailed,
           absl::DataLossError(absl::StrCat(
               "transfer ", header.transfer, " ended after ", header.blocks, " block frames with ",
               transfer.verified, " of ", transfer.results.size(), " blocks verified",
               transfer.first_problem.empty() ? "" : "; first: ", transfer.first_problem)));
    answered_.erase(header.transfer);  // this was the sender's last frame of it
  }

  void note_problem(Transfer& transfer, std::string problem) {
    if (transfer.first_problem.empty()) transfer.first_problem = std::move(problem);
  }

  void expire(absl::Time now) {
    for (const KvTransferId id : due_transfer_ids(transfers_, now)) {
      const Transfer& transfer = transfers_.at(id);
      finish(id, KvTransferOutcome::kTimedOut,
             absl::DeadlineExceededError(absl::StrCat(
                 "transfer ", id, ": ", transfer.verified, " of ", transfer.results.size(),
                 " blocks verified within its timeout ", absl::FormatDuration(transfer.timeout))));
    }
  }

  void fail_all(const absl::Status& lost) {
    for (const KvTransferId id : transfer_ids(transfers_)) {
      const Transfer& transfer = transfers_.at(id);
      finish(
          id, KvTransferOutcome::kFailed,
          absl::Status(lost.code(), absl::StrCat("transfer ", id, ": connection lost with ",
                                                 transfer.verified, " of ", transfer.results.size(),
                                                 " blocks verified: ", lost.message())));
    }
  }

  // Ends transfer `id`: its completion, its acknowledgement; its destinations released.
  void finish(KvTransferId id, KvTransferOutcome outcome, absl::Status detail) {
    connection_.forget(id);
    auto node = transfers_.extract(id);
    Transfer& transfer = node.mapped();
    acknowledge(id, outcome, transfer.verified, detail.message());
    answered_.insert(id);
    finished_.push_back({.id = id,
                         .outcome = outcome,
                         .blocks = std::move(transfer.results),
                         .detail = std::move(detail)});
  }

  void acknowledge(KvTransferId id, KvTransferOutcome outcome, int32_t verified,
                   absl::string_view reason) {
    connection_.send(control_frame(
        {.kind = FrameKind::kAck, .outcome = outcome, .transfer = id, .blocks = verified}, reason));
  }

  FrameConnection connection_;
  KvTransferOptions options_;
  absl::flat_hash_map<KvTransferId, Transfer> transfers_;
  // Transfers finished and acknowledged here whose last frame (the sender's end or cancel;
  // every transfer's frames end with one) has not come yet.
  absl::flat_hash_set<KvTransferId> answered_;
  std::vector<KvReceiveCompletion> finished_;
};

}  // namespace
}  // namespace internal

absl::StatusOr<std::unique_ptr<KvTransferReceiver>> create_kv_transfer_receiver(
    std::unique_ptr<KvTransport> transport, KvTransferOptions options) {
  if (absl::Status ok = internal::check_options(options); !ok.ok()) return ok;
  auto receiver = std::make_unique<internal::Receiver>(std::move(transport), std::move(options));
  if (absl::Status ok = receiver->handshake(); !ok.ok()) return ok;
  return receiver;
}

absl::StatusOr<std::unique_ptr<KvTransferReceiver>> accept_kv_transfer(
    KvTransportListener& listener, KvTransferOptions options) {
  if (absl::Status ok = internal::check_options(options); !ok.ok()) return ok;
  absl::StatusOr<std::unique_ptr<KvTransport>> transport =
      listener.accept(options.handshake_timeout);
  if (!transport.ok()) return transport.status();
  return create_kv_transfer_receiver(*std::move(transport), std::move(options));
}

}  // namespace pagedkv
