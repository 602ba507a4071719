// ShmTransport: KvTransport over shared memory between two processes of one machine.
//
// The connecting side creates a memfd holding two single-producer single-consumer byte
// rings, one per direction, and hands it over a UNIX socket (SCM_RIGHTS) in Linux's
// abstract namespace. The socket then only carries doorbells: after moving bytes into or
// out of a ring a side sends one byte, so that a peer blocked in wait() wakes up; and its
// end-of-file says the peer is gone (closed, exited or killed), also mid-transfer.
//
//   memfd: [SharedHeader 64 B][control of ring 0][control of ring 1][ring 0][ring 1]
//   ring 0: connector -> acceptor        ring 1: acceptor -> connector
//
// NOTE: wait() drains the doorbells before it checks the rings, and a side rings only
// after it moved the ring's index, so a change after the check always comes with a
// doorbell after it: no wakeup is lost.
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "transfer/socket_util.h"
#include "transfer/transports.h"

namespace pagedkv::internal {
namespace {

constexpr char kSharedMagic[8] = {'P', 'K', 'V', 'S', 'H', 'M', '0', '1'};
constexpr int64_t kMinRingBytes = 64 << 10;
constexpr int64_t kMaxRingBytes = int64_t{1} << 30;

struct SharedHeader {
  char magic[8];
  uint64_t ring_bytes;
  char padding[48];
};

// Indices only grow: bytes [read, written) of the ring hold data, modulo its size. The
// producer alone stores `written`, the consumer alone `read`, each on its own cache line.
struct RingControl {
  alignas(64) std::atomic<uint64_t> written;
  alignas(64) std::atomic<uint64_t> read;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the rings need lock-free atomics");
static_assert(sizeof(SharedHeader) == 64 && sizeof(RingControl) == 128);

constexpr size_t kRingsAt = sizeof(SharedHeader) + 2 * sizeof(RingControl);

size_t mapped_bytes(uint64_t ring_bytes) { return kRingsAt + 2 * ring_bytes; }

// One direction's ring, seen from one side.
class ByteRing {
 public:
  ByteRing(RingControl* control, std::byte* data, uint64_t capacity)
      : control_(control), data_(data), capacity_(capacity) {}

  // Producer: copies what fits of `segments`; returns how many bytes.
  size_t write(std::span<const ConstByteSpan> segments) {
    const uint64_t written = control_->written.load(std::memory_order_relaxed);
    const uint64_t free = capacity_ - (written - control_->read.load(std::memory_order_acquire));
    uint64_t moved = 0;
    for (const ConstByteSpan segment : segments) {
      const uint64_t n = std::min<uint64_t>(segment.size(), free - moved);
      if (n == 0) continue;  // an empty segment may have no address
      copy_in(written + moved, segment.first(n));
      moved += n;
      if (moved == free) break;
    }
    control_->written.store(written + moved, std::memory_order_release);
    return moved;
  }

  // Consumer: copies what has arrived into `segments`; returns how many bytes.
  absl::StatusOr<size_t> read(std::span<const MutableByteSpan> segments) {
    const uint64_t read = control_->read.load(std::memory_order_relaxed);
    const uint64_t available = control_->written.load(std::memory_order_acquire) - read;
    if (available > capacity_) {
      return absl::DataLossError(
          absl::StrCat("shared ring claims ", available, " bytes; it holds ", capacity_));
    }
    uint64_t moved = 0;
    for (const MutableByteSpan segment : segments) {
      const uint64_t n = std::min<uint64_t>(segment.size(), available - moved);
      if (n == 0) continue;
      copy_out(read + moved, segment.first(n));
      moved += n;
      if (moved == available) break;
    }
    control_->read.store(read + moved, std::memory_order_release);
    return moved;
  }

  bool readable() const {
    return control_->written.load(std::memory_order_acquire) !=
           control_->read.load(std::memory_order_relaxed);
  }
  bool writable() const {
    return control_->written.load(std::memory_order_relaxed) -
               control_->read.load(std::memory_order_acquire) <
           capacity_;
  }

 private:
  // The ring's bytes at `position` onwards, as at most two pieces (it may wrap).
  void copy_in(uint64_t position, ConstByteSpan bytes) {
    const uint64_t at = position & (capacity_ - 1);
    const uint64_t first = std::min<uint64_t>(bytes.size(), capacity_ - at);
    std::memcpy(data_ + at, bytes.data(), first);
    std::memcpy(data_, bytes.data() + first, bytes.size() - first);
  }
  void copy_out(uint64_t position, MutableByteSpan bytes) {
    const uint64_t at = position & (capacity_ - 1);
    const uint64_t first = std::min<uint64_t>(bytes.size(), capacity_ - at);
    std::memcpy(bytes.data(), data_ + at, first);
    std::memcpy(bytes.data() + first, data_, bytes.size() - first);
  }

  RingControl* control_;
  std::byte* data_;
  uint64_t capacity_;
};

// The mapped memfd, unmapped on destruction.
class SharedRegion {
 public:
  SharedRegion(void* base, size_t bytes) : base_(static_cast<std::byte*>(base)), bytes_(bytes) {}
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  ~SharedRegion() { ::munmap(base_, bytes_); }

  SharedHeader& header() { return *reinterpret_cast<SharedHeader*>(base_); }
  uint64_t ring_bytes() { return header().ring_bytes; }
  ByteRing ring(int which) {
    auto* control = reinterpret_cast<RingControl*>(base_ + sizeof(SharedHeader)) + which;
    return ByteRing(control, base_ + kRingsAt + which * ring_bytes(), ring_bytes());
  }

 private:
  std::byte* base_;
  size_t bytes_;
};

class ShmTransport final : public KvTransport {
 public:
  // `outgoing` is the ring this side writes: 0 for the connecting side, 1 for the other.
  ShmTransport(UniqueFd socket, std::unique_ptr<SharedRegion> region, int outgoing,
               std::string peer)
      : socket_(std::move(socket)),
        region_(std::move(region)),
        tx_(region_->ring(outgoing)),
        rx_(region_->ring(1 - outgoing)),
        peer_(std::move(peer)) {}

  absl::StatusOr<size_t> write_some(std::span<const ConstByteSpan> segments) override {
    if (!socket_.valid()) return closed();
    drain_doorbells();
    if (peer_gone_) return gone();
    const size_t moved = tx_.write(segments);
    if (moved > 0) ring_doorbell();
    return moved;
  }

  absl::StatusOr<size_t> read_some(std::span<const MutableByteSpan> segments) override {
    if (!socket_.valid()) return closed();
    drain_doorbells();
    absl::StatusOr<size_t> moved = rx_.read(segments);
    if (!moved.ok()) return moved.status();
    if (*moved > 0) {
      ring_doorbell();
      return moved;
    }
    if (peer_gone_) return gone();
    return 0;
  }

  void wait(bool for_write, absl::Time deadline) override {
    if (!socket_.valid()) return;
    drain_doorbells();
    if (peer_gone_ || rx_.readable() || (for_write && tx_.writable())) return;
    poll_until(socket_.get(), POLLIN, deadline);
  }

  void close() override { socket_.reset(); }

  const std::string& peer() const override { return peer_; }

 private:
  void ring_doorbell() {
    const char bell = 1;
    if (::send(socket_.get(), &bell, 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno != EAGAIN &&
        errno != EWOULDBLOCK && errno != EINTR) {
      peer_gone_ = true;  // EAGAIN: the peer has unread doorbells, so it wakes anyway
    }
  }

  void drain_doorbells() {
    char bells[256];
    while (!peer_gone_) {
      const ssize_t n = ::recv(socket_.get(), bells, sizeof(bells), MSG_DONTWAIT);
      if (n > 0) continue;
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) peer_gone_ = true;
      return;
    }
  }

  absl::Status closed() const {
    return absl::UnavailableError(absl::StrCat("connection to ", peer_, " is closed"));
  }
  absl::Status gone() const {
    return absl::UnavailableError(absl::StrCat("peer ", peer_, " closed the connection"));
  }

  UniqueFd socket_;
  std::unique_ptr<SharedRegion> region_;
  ByteRing tx_;
  ByteRing rx_;
  std::string peer_;
  bool peer_gone_ = false;
};

// The socket address of NAME in Linux's abstract namespace.
absl::StatusOr<std::pair<sockaddr_un, socklen_t>> abstract_address(absl::string_view name) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string path = absl::StrCat("pagedkv-transfer/", name);
  if (name.empty() || path.size() + 1 > sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("shm endpoint name '", name, "' has ",
                                                   name.size(), " bytes; it needs 1 to ",
                                                   sizeof(address.sun_path) - 18));
  }
  std::memcpy(address.sun_path + 1, path.data(), path.size());
  return std::make_pair(address,
                        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + path.size()));
}

absl::StatusOr<std::unique_ptr<SharedRegion>> map_region(int fd, size_t bytes,
                                                         absl::string_view endpoint) {
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return errno_status("mmap the rings of", endpoint);
  return std::make_unique<SharedRegion>(base, bytes);
}

// Receives the memfd the connecting side sends, waiting until `deadline`.
absl::StatusOr<UniqueFd> receive_memfd(int socket, absl::string_view endpoint,
                                       absl::Time deadline) {
  if ((poll_until(socket, POLLIN, deadline) & (POLLIN | POLLHUP)) == 0) {
    return absl::DeadlineExceededError(
        absl::StrCat("accept at ", endpoint, ": the peer sent no rings by the deadline"));
  }
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  if (::recvmsg(socket, &message, MSG_CMSG_CLOEXEC) <= 0) {
    return errno_status("receive the rings at", endpoint);
  }
  const cmsghdr* header = CMSG_FIRSTHDR(&message);
  if (header == nullptr || header->cmsg_type != SCM_RIGHTS) {
    return absl::DataLossError(absl::StrCat("accept at ", endpoint, ": the peer sent no memfd"));
  }
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(header), sizeof(fd));
  return UniqueFd(fd);
}

// Maps the memfd a peer sent and checks its header against its size.
absl::StatusOr<std::unique_ptr<SharedRegion>> map_peer_region(int memfd,
                                                              absl::string_view endpoint) {
  struct stat info {};
  if (::fstat(memfd, &info) < 0) return errno_status("fstat the rings of", endpoint);
  if (static_cast<size_t>(info.st_size) < sizeof(SharedHeader)) {
    return absl::DataLossError(absl::StrCat("rings of ", endpoint, ": ", info.st_size,
                                            " bytes, shorter than their header"));
  }
  absl::StatusOr<std::unique_ptr<SharedRegion>> region =
      map_region(memfd, static_cast<size_t>(info.st_size), endpoint);
  if (!region.ok()) return region.status();
  const uint64_t ring_bytes = (*region)->ring_bytes();
  const bool sane =
      std::memcmp((*region)->header().magic, kSharedMagic, sizeof(kSharedMagic)) == 0 &&
      ring_bytes >= kMinRingBytes && ring_bytes <= kMaxRingBytes &&
      (ring_bytes & (ring_bytes - 1)) == 0 &&
      mapped_bytes(ring_bytes) == static_cast<size_t>(info.st_size);
  if (!sane) {
    return absl::DataLossError(absl::StrCat("rings of ", endpoint, ": no ring header, or rings of ",
                                            ring_bytes, " bytes that do not fill a memfd of ",
                                            info.st_size));
  }
  return region;
}

class ShmListener final : public KvTransportListener {
 public:
  ShmListener(UniqueFd fd, std::string endpoint)
      : fd_(std::move(fd)), endpoint_(std::move(endpoint)) {}

  absl::StatusOr<std::unique_ptr<KvTransport>> accept(absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    absl::StatusOr<UniqueFd> socket = accept_with_deadline(fd_.get(), endpoint_, timeout);
    if (!socket.ok()) return socket.status();
    absl::StatusOr<UniqueFd> memfd = receive_memfd(socket->get(), endpoint_, deadline);
    if (!memfd.ok()) return memfd.status();
    absl::StatusOr<std::unique_ptr<SharedRegion>> region = map_peer_region(memfd->get(), endpoint_);
    if (!region.ok()) return region.status();
    return std::make_unique<ShmTransport>(*std::move(socket), *std::move(region), /*outgoing=*/1,
                                          absl::StrCat(endpoint_, " (connecting side)"));
  }

  const std::string& endpoint() const override { return endpoint_; }

 private:
  UniqueFd fd_;
  std::string endpoint_;
};

// Creates the memfd of two rings of `ring_bytes` each, with their header written.
absl::StatusOr<std::pair<UniqueFd, std::unique_ptr<SharedRegion>>> create_rings(
    int64_t ring_bytes, absl::string_view endpoint) {
  UniqueFd memfd(::memfd_create("pagedkv-transfer", MFD_CLOEXEC));
  if (!memfd.valid()) return errno_status("memfd_create for", endpoint);
  const size_t bytes = mapped_bytes(static_cast<uint64_t>(ring_bytes));
  if (::ftruncate(memfd.get(), static_cast<off_t>(bytes)) < 0) {
    return errno_status("size the rings of", endpoint);
  }
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = map_region(memfd.get(), bytes, endpoint);
  if (!region.ok()) return region.status();
  // A fresh memfd reads as zeros: both rings start empty.
  SharedHeader& header = (*region)->header();
  std::memcpy(header.magic, kSharedMagic, sizeof(kSharedMagic));
  header.ring_bytes = static_cast<uint64_t>(ring_bytes);
  return std::make_pair(std::move(memfd), *std::move(region));
}

absl::Status send_memfd(int socket, int memfd, absl::string_view endpoint) {
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(header), &memfd, sizeof(memfd));
  if (::sendmsg(socket, &message, MSG_NOSIGNAL) < 0) {
    return errno_status("send the rings to", endpoint);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvTransportListener>> listen_shm(absl::string_view name) {
  const std::string endpoint = absl::StrCat("shm://", name);
  absl::StatusOr<std::pair<sockaddr_un, socklen_t>> address = abstract_address(name);
  if (!address.ok()) return address.status();
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno_status("socket for", endpoint);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address->first), address->second) < 0) {
    return errno_status("bind", endpoint);
  }
  if (::listen(fd.get(), SOMAXCONN) < 0) return errno_status("listen at", endpoint);
  return std::make_unique<ShmListener>(std::move(fd), endpoint);
}

absl::StatusOr<std::unique_ptr<KvTransport>> connect_shm(absl::string_view name,
                                                         absl::Duration timeout,
                                                         int64_t ring_bytes) {
  const std::string endpoint = absl::StrCat("shm://", name);
  if (ring_bytes < kMinRingBytes || ring_bytes > kMaxRingBytes ||
      (ring_bytes & (ring_bytes - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("shm_ring_bytes ", ring_bytes,
                                                   " is not a power of two in [", kMinRingBytes,
                                                   ", ", kMaxRingBytes, "]"));
  }
  absl::StatusOr<std::pair<sockaddr_un, socklen_t>> address = abstract_address(name);
  if (!address.ok()) return address.status();
  absl::StatusOr<UniqueFd> socket =
      connect_with_deadline(AF_UNIX, reinterpret_cast<const sockaddr*>(&address->first),
                            address->second, endpoint, timeout);
  if (!socket.ok()) return socket.status();
  auto rings = create_rings(ring_bytes, endpoint);
  if (!rings.ok()) return rings.status();
  if (absl::Status sent = send_memfd(socket->get(), rings->first.get(), endpoint); !sent.ok()) {
    return sent;
  }
  return std::make_unique<ShmTransport>(*std::move(socket), std::move(rings->second),
                                        /*outgoing=*/0, endpoint);
}

}  // namespace pagedkv::internal
