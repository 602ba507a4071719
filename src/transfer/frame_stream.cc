#include "transfer/frame_stream.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace pagedkv::internal {
namespace {

// The bytes of `parts` from `offset` on, at most `limit` of them, as spans.
template <typename Span>
std::vector<Span> spans_from(std::span<const Span> parts, uint64_t offset, uint64_t limit) {
  std::vector<Span> out;
  for (const Span part : parts) {
    if (limit == 0) break;
    if (offset >= part.size()) {
      offset -= part.size();
      continue;
    }
    const uint64_t n = std::min<uint64_t>(part.size() - offset, limit);
    out.push_back(part.subspan(offset, n));
    limit -= n;
    offset = 0;
  }
  return out;
}

uint64_t total_bytes(std::span<const ConstByteSpan> parts) {
  uint64_t bytes = 0;
  for (const ConstByteSpan part : parts) bytes += part.size();
  return bytes;
}

void begin_frame(OutgoingFrame& frame) {
  if (!frame.checksum_known) frame.fields.payload_checksum = payload_checksum(frame.payload);
  frame.header = encode_frame_header(frame.fields);
}

}  // namespace

OutgoingFrame control_frame(FrameHeader header, absl::string_view text) {
  OutgoingFrame frame;
  const auto* bytes = reinterpret_cast<const std::byte*>(text.data());
  frame.owned.assign(bytes, bytes + text.size());
  frame.payload = {ConstByteSpan(frame.owned)};
  header.payload_bytes = text.size();
  frame.fields = header;
  return frame;
}

absl::Status FrameWriter::flush(KvTransport& transport,
                                absl::FunctionRef<void(const FrameHeader&)> on_frame_written) {
  while (!frames_.empty()) {
    OutgoingFrame& frame = frames_.front();
    if (frame.written == 0) {
      if (absl::Now() < frame.not_before) return absl::OkStatus();
      begin_frame(frame);
    }
    const uint64_t total = kFrameHeaderBytes + frame.fields.payload_bytes;
    const uint64_t limit =
        frame.close_after_payload_bytes < 0
            ? total
            : std::min<uint64_t>(total, kFrameHeaderBytes + frame.close_after_payload_bytes);
    if (frame.written < limit) {
      std::vector<ConstByteSpan> all = {ConstByteSpan(frame.header)};
      all.insert(all.end(), frame.payload.begin(), frame.payload.end());
      const std::vector<ConstByteSpan> rest =
          spans_from<ConstByteSpan>(all, frame.written, limit - frame.written);
      absl::StatusOr<size_t> written = transport.write_some(rest);
      if (!written.ok()) return written.status();
      if (*written == 0) return absl::OkStatus();
      frame.written += *written;
      if (frame.written < limit) continue;
    }
    if (frame.close_after_payload_bytes >= 0) {
      transport.close();
      return absl::UnavailableError(
          absl::StrCat("connection to ", transport.peer(), " closed by an injected fault after ",
                       frame.close_after_payload_bytes, " payload bytes of a frame of transfer ",
                       frame.fields.transfer));
    }
    on_frame_written(frame.fields);
    frames_.pop_front();
  }
  return absl::OkStatus();
}

void FrameWriter::forget(KvTransferId transfer) {
  std::erase_if(frames_, [&](const OutgoingFrame& frame) {
    return frame.fields.transfer == transfer && frame.written == 0;
  });
  if (frames_.empty() || frames_.front().fields.transfer != transfer) return;
  // Begun: the stream needs its remaining bytes, the caller's memory may go away.
  OutgoingFrame& begun = frames_.front();
  std::vector<std::byte> copy(total_bytes(begun.payload));
  size_t at = 0;
  for (const ConstByteSpan part : begun.payload) {
    std::memcpy(copy.data() + at, part.data(), part.size());
    at += part.size();
  }
  begun.owned = std::move(copy);
  begun.payload = {ConstByteSpan(begun.owned)};
}

absl::Time FrameWriter::front_due() const {
  if (frames_.empty()) return absl::InfiniteFuture();
  return frames_.front().written > 0 ? absl::InfinitePast() : frames_.front().not_before;
}

void FrameReader::ChecksumDeleter::operator()(XXH3_state_s* state) const { XXH3_freeState(state); }

FrameReader::FrameReader() : scratch_(64 << 10), checksum_(XXH3_createState()) {}
FrameReader::~FrameReader() = default;

absl::Status FrameReader::read(KvTransport& transport, Handler& handler, int64_t max_bytes) {
  int64_t total = 0;
  while (total < max_bytes) {
    absl::StatusOr<size_t> n =
        in_payload_ ? read_payload(transport) : read_header(transport, handler);
    if (!n.ok()) return n.status();
    total += static_cast<int64_t>(*n);
    if (in_payload_ && payload_read_ == header_.payload_bytes) {
      if (absl::Status done = finish_frame(handler); !done.ok()) return done;
    } else if (*n == 0) {
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> FrameReader::read_header(KvTransport& transport, Handler& handler) {
  const MutableByteSpan rest = MutableByteSpan(header_bytes_).subspan(header_read_);
  absl::StatusOr<size_t> n = transport.read_some({&rest, 1});
  if (!n.ok()) return n.status();
  header_read_ += *n;
  if (header_read_ < kFrameHeaderBytes) return n;
  absl::StatusOr<FrameHeader> header = decode_frame_header(header_bytes_);
  if (!header.ok()) {
    return absl::Status(header.status().code(),
                        absl::StrCat("from ", transport.peer(), ": ", header.status().message()));
  }
  header_ = *header;
  start_payload(handler);
  return n;
}

void FrameReader::start_payload(Handler& handler) {
  if (header_.kind == FrameKind::kBlock) {
    destination_ = handler.block_destination(header_);
  } else {
    control_.assign(header_.payload_bytes, std::byte{0});
    destination_ = {MutableByteSpan(control_)};
  }
  dropping_ = destination_.empty();
  payload_read_ = 0;
  in_payload_ = true;
  XXH3_64bits_reset(checksum_.get());
}

absl::StatusOr<size_t> FrameReader::read_payload(KvTransport& transport) {
  const uint64_t remaining = header_.payload_bytes - payload_read_;
  if (dropping_) {
    const MutableByteSpan into =
        MutableByteSpan(scratch_).first(std::min<uint64_t>(remaining, scratch_.size()));
    absl::StatusOr<size_t> n = transport.read_some({&into, 1});
    if (n.ok()) payload_read_ += *n;
    return n;
  }
  const std::vector<MutableByteSpan> into =
      spans_from<MutableByteSpan>(destination_, payload_read_, remaining);
  absl::StatusOr<size_t> n = transport.read_some(into);
  if (!n.ok()) return n.status();
  checksum_arrived(payload_read_, *n);
  payload_read_ += *n;
  return n;
}

// Hashes bytes as they land, while they are still in cache.
void FrameReader::checksum_arrived(size_t offset, size_t bytes) {
  for (const MutableByteSpan part : spans_from<MutableByteSpan>(destination_, offset, bytes)) {
    XXH3_64bits_update(checksum_.get(), part.data(), part.size());
  }
}

absl::Status FrameReader::finish_frame(Handler& handler) {
  in_payload_ = false;
  header_read_ = 0;
  if (dropping_) return absl::OkStatus();
  const bool intact = XXH3_64bits_digest(checksum_.get()) == header_.payload_checksum;
  const std::span<const std::byte> payload =
      header_.kind == FrameKind::kBlock ? std::span<const std::byte>() : control_;
  return handler.on_frame(header_, payload, intact);
}

void FrameReader::drop_payload_of(KvTransferId transfer) {
  if (in_payload_ && header_.kind == FrameKind::kBlock && header_.transfer == transfer) {
    dropping_ = true;
  }
}

}  // namespace pagedkv::internal
