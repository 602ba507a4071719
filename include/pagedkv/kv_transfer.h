// File: pagedkv/kv_transfer.h
//
// Moving a request's KV blocks from one engine process to another (disaggregated prefill
// and decode): KvTransferSender on the side that computed them, KvTransferReceiver on the
// side that continues the request. Both sit on one KvTransport connection (kv_transport.h)
// and never touch the allocator: the engine maps each block to its KvStorage bytes, and
// tells KvCacheManager afterwards which blocks arrived (library pagedkv::transfer).
//
//   sender                                         receiver
//   send(id, blocks, timeout) --block frames---->  expect(id, destinations, timeout)
//                                                  (bytes land in the destinations, each
//                             --end of id------->   block verified by its checksum)
//   poll(): KvSendCompletion <--acknowledgement--  poll(): KvReceiveCompletion
//
// Each block travels as (transfer id, layer group, index in the request's table, chained
// hash, bytes) with an XXH3-64 checksum of its bytes, so the receiver learns per block
// whether it arrived intact (kVerified), damaged (kCorrupt), as another block than the one
// expected (kWrongBlock), or not at all (kMissing), and per transfer whether it completed,
// failed, was cancelled or timed out. KvReceiveCompletion::verified_prefix() is the longest
// run the manager can count as computed; the rest is recomputed. docs/transfer.md gives the
// wire format and the failure semantics.
//
// Threading and waiting: like a standard container, one thread owns a sender or a
// receiver; there are no internal threads or locks. send(), expect() and cancel() check
// their arguments and queue work; poll() moves bytes as far as the connection allows
// without waiting and returns finished transfers; wait() blocks until bytes can move, a
// deadline passes or `max_wait` ends. A scheduler calls poll() once per step; a thread of
// the engine's own may loop wait() + poll() for full speed. Every transfer has a deadline,
// checked by poll(), so none is ever left waiting for a peer that is gone.
//
// Every accepted transfer (send() or expect() returned OK) gets exactly one completion,
// also on failure; its memory (the sender's block bytes, the receiver's destinations) must
// stay valid until then and is never touched after. A refused call changes nothing.
//
// Example (receiver, in a function returning a Status; `dst` spans of its host blocks):
//   auto receiver = accept_kv_transfer(*listener, {.namespace_digest = digest,
//                                                  .block_bytes = {spec.bytes_per_block()}});
//   if (!receiver.ok()) return receiver.status();
//   PAGEDKV_RETURN_IF_ERROR((*receiver)->expect(
//       request, {{.group = 0, .index = 0, .hash = h0, .parts = {dst0}}}, absl::Seconds(1)));
//   std::vector<KvReceiveCompletion> done;
//   while (done.empty()) {
//     (*receiver)->wait(absl::Milliseconds(10));
//     (*receiver)->poll(&done);
//   }
//   int32_t computed_blocks = done[0].verified_prefix(0);  // recompute the rest
#ifndef PAGEDKV_KV_TRANSFER_H_
#define PAGEDKV_KV_TRANSFER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "pagedkv/kv_transport.h"
#include "pagedkv/types.h"

namespace pagedkv {

// Names one transfer on a connection; both ends use the same id (the engine's request id,
// say). Unique among the connection's transfers in flight.
using KvTransferId = uint64_t;

// One block the sender sends.
struct KvTransferBlock {
  int32_t group = 0;                   // layer group, in [0, KvTransferOptions::block_bytes.size())
  int32_t index = 0;                   // the block's position in the request's table of that group
  BlockHash hash{};                    // its chained hash (zero for a block that is not full)
  std::vector<ConstByteSpan> parts{};  // its bytes in order (e.g. each layer's K, then V)
};

// Where the receiver wants one block.
struct KvTransferDestination {
  int32_t group = 0;
  int32_t index = 0;
  BlockHash hash{};                      // what the sender must name for this block
  std::vector<MutableByteSpan> parts{};  // filled in order with the block's bytes
};

// What became of one block, as the receiver saw it.
enum class KvBlockState : uint8_t {
  kMissing,     // never arrived whole: dropped, the sender died or ended, deadline, cancel
  kVerified,    // arrived and its checksum matched: the destination holds the block
  kCorrupt,     // arrived, checksum mismatch: the destination holds damaged bytes
  kWrongBlock,  // an intact block under this (group, index) with another hash or size;
                // the destination was not written
};

enum class KvTransferOutcome : uint8_t {
  kComplete,   // every block verified
  kFailed,     // ended with blocks not verified (the sender's end came, the connection
               // broke, or the receiver did not expect the transfer)
  kCancelled,  // cancel() on either side
  kTimedOut,   // its deadline passed first
};

// "complete", "failed", "cancelled", "timed out".
std::string_view kv_transfer_outcome_name(KvTransferOutcome outcome);

struct KvBlockResult {
  int32_t group = 0;
  int32_t index = 0;
  KvBlockState state = KvBlockState::kMissing;
};

struct KvReceiveCompletion {
  KvTransferId id = 0;
  KvTransferOutcome outcome = KvTransferOutcome::kFailed;
  std::vector<KvBlockResult> blocks{};  // one per destination, in expect()'s order
  absl::Status detail{};                // why it did not complete, for logs; OK if complete

  // The number of leading blocks of `group`, in expect()'s order, that were verified: the
  // blocks the manager may count as computed.
  int32_t verified_prefix(int32_t group) const;
  // How many blocks ended in `state`.
  int32_t count(KvBlockState state) const;
};

struct KvSendCompletion {
  KvTransferId id = 0;
  // kComplete only when the receiver acknowledged every block verified. kTimedOut when no
  // acknowledgement came by the deadline (or the receiver's own deadline passed).
  KvTransferOutcome outcome = KvTransferOutcome::kFailed;
  bool acknowledged = false;    // the receiver answered (its outcome is `outcome`)
  int32_t blocks_verified = 0;  // as the receiver acknowledged; 0 without an answer
  int32_t blocks_sent = 0;      // block frames written whole to the connection
  absl::Status detail{};        // the receiver's reason, or this side's; OK if complete
};

struct KvTransferOptions {
  // Both ends must be equal: the handshake refuses a peer with another digest
  // (remote_namespace_digest() of the shard, remote_namespace.h, names model, dtype,
  // layout, block size, layers and TP rank), at most 256 bytes.
  std::string namespace_digest{};
  // Bytes of one block of each layer group (KvStorage::bytes_per_block()), in [1, 1 GiB];
  // both ends must be equal. Every block sent or expected has its group's size.
  std::vector<int64_t> block_bytes{};
  int32_t max_blocks_per_transfer = 1 << 16;
  int32_t max_transfers_in_flight = 4096;
  absl::Duration handshake_timeout = absl::Seconds(5);
};

class KvTransferSender {
 public:
  virtual ~KvTransferSender() = default;

  // KvTransferSender::send()
  //
  // Queues `blocks` of transfer `id`, followed by its end; the transfer completes when the
  // receiver acknowledges it, or `timeout` after this call. The block bytes must stay valid
  // and unchanged until its completion (the engine keeps the blocks pinned).
  // Errors (nothing queued): InvalidArgument for no blocks, more than
  // max_blocks_per_transfer, a group outside [0, groups), a negative index, a (group,
  // index) twice, a block whose parts do not add up to its group's block_bytes, a timeout
  // <= 0 (each message names the value and the limit); AlreadyExists when `id` is in
  // flight; ResourceExhausted at max_transfers_in_flight; Unavailable once the connection
  // is gone.
  [[nodiscard]] virtual absl::Status send(KvTransferId id, std::vector<KvTransferBlock> blocks,
                                          absl::Duration timeout) = 0;

  // KvTransferSender::cancel()
  //
  // Ends transfer `id` now: its completion (kCancelled) comes from the next poll(), its
  // block bytes are no longer read after this call, and the receiver is told.
  // Errors: NotFound when `id` is not in flight.
  [[nodiscard]] virtual absl::Status cancel(KvTransferId id) = 0;

  // Moves bytes without waiting, checks deadlines, and appends finished transfers to
  // `out`; returns how many it appended.
  virtual size_t poll(std::vector<KvSendCompletion>* out) = 0;

  // Waits until poll() has work: bytes can move, a deadline passes, or `max_wait` ends.
  virtual void wait(absl::Duration max_wait) = 0;

  virtual int32_t in_flight() const = 0;
  // The connection's error once it is gone (OK while it is up).
  virtual absl::Status connection_status() const = 0;
};

class KvTransferReceiver {
 public:
  virtual ~KvTransferReceiver() = default;

  // KvTransferReceiver::expect()
  //
  // Posts `destinations` for transfer `id`: each block the sender sends under (group,
  // index) lands in that destination. Call it before the sender starts (block frames of
  // a transfer not expected are read and dropped, and the sender's end is answered with
  // kFailed). Completes when every block is verified, when the sender's end comes with
  // blocks missing, when the connection breaks, or `timeout` after this call.
  // Errors (nothing posted): as for send(), with the destinations' sizes checked against
  // block_bytes.
  [[nodiscard]] virtual absl::Status expect(KvTransferId id,
                                            std::vector<KvTransferDestination> destinations,
                                            absl::Duration timeout) = 0;

  // KvTransferReceiver::cancel()
  //
  // Ends transfer `id` now (kCancelled at the next poll()); its destinations are not
  // written after this call, and the sender is told. Errors: NotFound.
  [[nodiscard]] virtual absl::Status cancel(KvTransferId id) = 0;

  virtual size_t poll(std::vector<KvReceiveCompletion>* out) = 0;
  virtual void wait(absl::Duration max_wait) = 0;
  virtual int32_t in_flight() const = 0;
  virtual absl::Status connection_status() const = 0;
};

// Connects to a receiver's listener at `endpoint` and runs the handshake, waiting at most
// options.handshake_timeout for both.
// Errors: those of connect_kv_transport(); InvalidArgument for invalid options (the value
// and the limit named); FailedPrecondition when the receiver refuses the handshake (another
// namespace digest or block sizes; both named); DeadlineExceeded.
[[nodiscard]] absl::StatusOr<std::unique_ptr<KvTransferSender>> connect_kv_transfer(
    std::string_view endpoint, KvTransferOptions options,
    const KvTransportOptions& transport_options = {});

// Accepts one sender at `listener` and runs the handshake, waiting at most
// options.handshake_timeout for both. Errors: as connect_kv_transfer().
[[nodiscard]] absl::StatusOr<std::unique_ptr<KvTransferReceiver>> accept_kv_transfer(
    KvTransportListener& listener, KvTransferOptions options);

// The same over a connected transport (another backend, or a wrapped one): the sender side
// sends the handshake, the receiver side answers it.
[[nodiscard]] absl::StatusOr<std::unique_ptr<KvTransferSender>> create_kv_transfer_sender(
    std::unique_ptr<KvTransport> transport, KvTransferOptions options);
[[nodiscard]] absl::StatusOr<std::unique_ptr<KvTransferReceiver>> create_kv_transfer_receiver(
    std::unique_ptr<KvTransport> transport, KvTransferOptions options);

}  // namespace pagedkv

#endif  // PAGEDKV_KV_TRANSFER_H_
