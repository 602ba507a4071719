// File: src/transfer/frame_stream.h
//
// Frames over a KvTransport, without waiting: FrameWriter queues outgoing frames and
// writes them as far as the transport takes them; FrameReader reads arriving frames,
// a block's payload straight into the destination its handler names, verifying the
// payload checksum as the bytes land. Both the sender and the receiver use both (the
// receiver writes acknowledgements, the sender reads them).
#ifndef PAGEDKV_TRANSFER_FRAME_STREAM_H_
#define PAGEDKV_TRANSFER_FRAME_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "pagedkv/kv_transport.h"
#include "transfer/wire_format.h"

struct XXH3_state_s;

namespace pagedkv::internal {

struct OutgoingFrame {
  FrameHeader fields{};
  bool checksum_known = false;           // else computed over `payload` when the frame starts
  EncodedHeader header{};                // encoded from `fields` when the frame starts
  std::vector<ConstByteSpan> payload{};  // views: a block's parts, or `owned`
  std::vector<std::byte> owned{};        // bytes the frame owns (text, a copy); a vector, so
                                         // that moving the frame keeps the views valid
  absl::Time not_before = absl::InfinitePast();  // not started before (an injected delay)
  int64_t close_after_payload_bytes = -1;        // >= 0: close the connection there (a fault)
  size_t written = 0;                            // header and payload bytes written so far
};

// A frame whose payload is `text`, owned by the frame.
OutgoingFrame control_frame(FrameHeader header, absl::string_view text);

class FrameWriter {
 public:
  void push(OutgoingFrame frame) { frames_.push_back(std::move(frame)); }

  // Writes queued frames until the transport would wait or the front frame is not due;
  // calls `on_frame_written` with each frame written whole.
  // Errors: the transport's; Unavailable after an injected close.
  absl::Status flush(KvTransport& transport,
                     absl::FunctionRef<void(const FrameHeader&)> on_frame_written);

  // Drops the frames of `transfer` not begun and makes a begun one own its unwritten bytes,
  // so that the caller's memory is never read after this call.
  void forget(KvTransferId transfer);

  bool has_frames() const { return !frames_.empty(); }
  // When the front frame may start (InfinitePast when it may now; InfiniteFuture if none).
  absl::Time front_due() const;

 private:
  std::deque<OutgoingFrame> frames_;
};

class FrameReader {
 public:
  class Handler {
   public:
    virtual ~Handler() = default;
    // Where the payload of the block frame `header` goes: spans adding up to its
    // payload_bytes, or none to drop it.
    virtual std::vector<MutableByteSpan> block_destination(const FrameHeader& header) = 0;
    // A whole frame arrived: a block given a destination (`payload` empty), or a control
    // frame with its payload. `intact`: the payload checksum matched. An error ends the
    // connection.
    virtual absl::Status on_frame(const FrameHeader& header, std::span<const std::byte> payload,
                                  bool intact) = 0;
  };

  FrameReader();
  ~FrameReader();

  // Reads frames until nothing more has arrived or `max_bytes` were read.
  // Errors: the transport's; DataLoss or FailedPrecondition for a header that does not
  // decode (the stream is out of step); the handler's.
  absl::Status read(KvTransport& transport, Handler& handler, int64_t max_bytes);

  // The rest of the current block payload, if it is `transfer`'s, is read and dropped: its
  // destination is released.
  void drop_payload_of(KvTransferId transfer);

 private:
  absl::StatusOr<size_t> read_header(KvTransport& transport, Handler& handler);
  void start_payload(Handler& handler);
  absl::StatusOr<size_t> read_payload(KvTransport& transport);
  absl::Status finish_frame(Handler& handler);
  void checksum_arrived(size_t offset, size_t bytes);

  EncodedHeader header_bytes_{};
  size_t header_read_ = 0;
  bool in_payload_ = false;
  FrameHeader header_{};
  std::vector<MutableByteSpan> destination_;  // a block's, or control_
  bool dropping_ = false;
  uint64_t payload_read_ = 0;
  std::vector<std::byte> control_;
  std::vector<std::byte> scratch_;  // where dropped payloads go
  struct ChecksumDeleter {
    void operator()(XXH3_state_s* state) const;
  };
  std::unique_ptr<XXH3_state_s, ChecksumDeleter> checksum_;
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_TRANSFER_FRAME_STREAM_H_
