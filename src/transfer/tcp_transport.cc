// TcpTransport: KvTransport over one non-blocking TCP socket. Bytes go straight between
// the caller's segments and the kernel (sendmsg / recvmsg with an iovec per segment).
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "transfer/socket_util.h"
#include "transfer/transports.h"

namespace pagedkv::internal {
namespace {

template <typename Span>
std::vector<iovec> to_iovecs(std::span<const Span> segments) {
  std::vector<iovec> iov;
  iov.reserve(std::min<size_t>(segments.size(), IOV_MAX));
  for (const Span& segment : segments) {
    if (iov.size() == IOV_MAX) break;
    if (segment.empty()) continue;
    iov.push_back({const_cast<std::byte*>(segment.data()), segment.size()});
  }
  return iov;
}

std::string endpoint_text(const sockaddr_storage& address) {
  char host[NI_MAXHOST];
  char port[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&address), sizeof(address), host,
                    sizeof(host), port, sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "tcp://?";
  }
  const bool ipv6 = address.ss_family == AF_INET6;
  return absl::StrCat("tcp://", ipv6 ? "[" : "", host, ipv6 ? "]" : "", ":", port);
}

class TcpTransport final : public KvTransport {
 public:
  TcpTransport(UniqueFd fd, std::string peer) : fd_(std::move(fd)), peer_(std::move(peer)) {
    const int one = 1;
    ::setsockopt(fd_.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }

  absl::StatusOr<size_t> write_some(std::span<const ConstByteSpan> segments) override {
    std::vector<iovec> iov = to_iovecs(segments);
    if (iov.empty()) return 0;
    if (!fd_.valid()) return closed();
    msghdr message{};
    message.msg_iov = iov.data();
    message.msg_iovlen = iov.size();
    while (true) {
      const ssize_t sent = ::sendmsg(fd_.get(), &message, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (sent >= 0) return static_cast<size_t>(sent);
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      return errno_status("send to", peer_);
    }
  }

  absl::StatusOr<size_t> read_some(std::span<const MutableByteSpan> segments) override {
    std::vector<iovec> iov = to_iovecs(segments);
    if (iov.empty()) return 0;
    if (!fd_.valid()) return closed();
    msghdr message{};
    message.msg_iov = iov.data();
    message.msg_iovlen = iov.size();
    while (true) {
      const ssize_t received = ::recvmsg(fd_.get(), &message, MSG_DONTWAIT);
      if (received > 0) return static_cast<size_t>(received);
      if (received == 0) {
        return absl::UnavailableError(absl::StrCat("peer ", peer_, " closed the connection"));
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      return errno_status("receive from", peer_);
    }
  }

  void wait(bool for_write, absl::Time deadline) override {
    if (!fd_.valid()) return;
    poll_until(fd_.get(), static_cast<short>(POLLIN | (for_write ? POLLOUT : 0)), deadline);
  }

  void close() override { fd_.reset(); }

  const std::string& peer() const override { return peer_; }

 private:
  absl::Status closed() const {
    return absl::UnavailableError(absl::StrCat("connection to ", peer_, " is closed"));
  }

  UniqueFd fd_;
  std::string peer_;
};

class TcpListener final : public KvTransportListener {
 public:
  TcpListener(UniqueFd fd, std::string endpoint)
      : fd_(std::move(fd)), endpoint_(std::move(endpoint)) {}

  absl::StatusOr<std::unique_ptr<KvTransport>> accept(absl::Duration timeout) override {
    absl::StatusOr<UniqueFd> peer = accept_with_deadline(fd_.get(), endpoint_, timeout);
    if (!peer.ok()) return peer.status();
    sockaddr_storage address{};
    socklen_t address_bytes = sizeof(address);
    ::getpeername(peer->get(), reinterpret_cast<sockaddr*>(&address), &address_bytes);
    return std::make_unique<TcpTransport>(*std::move(peer), endpoint_text(address));
  }

  const std::string& endpoint() const override { return endpoint_; }

 private:
  UniqueFd fd_;
  std::string endpoint_;
};

struct AddrInfoDeleter {
  void operator()(addrinfo* info) const { ::freeaddrinfo(info); }
};
using AddrInfo = std::unique_ptr<addrinfo, AddrInfoDeleter>;

absl::StatusOr<AddrInfo> resolve(absl::string_view host, absl::string_view port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* result = nullptr;
  const std::string host_text(host);
  const std::string port_text(port);
  if (const int error = ::getaddrinfo(host_text.c_str(), port_text.c_str(), &hints, &result);
      error != 0) {
    return absl::UnavailableError(
        absl::StrCat("resolve tcp://", host, ":", port, ": ", ::gai_strerror(error)));
  }
  return AddrInfo(result);
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvTransportListener>> listen_tcp(absl::string_view host,
                                                                absl::string_view port) {
  const std::string asked = absl::StrCat("tcp://", host, ":", port);
  absl::StatusOr<AddrInfo> info = resolve(host, port, /*passive=*/true);
  if (!info.ok()) return info.status();
  const addrinfo* address = info->get();
  UniqueFd fd(::socket(address->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno_status("socket for", asked);
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), address->ai_addr, address->ai_addrlen) < 0) {
    return errno_status("bind", asked);
  }
  if (::listen(fd.get(), SOMAXCONN) < 0) return errno_status("listen at", asked);
  sockaddr_storage bound{};
  socklen_t bound_bytes = sizeof(bound);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &bound_bytes);
  return std::make_unique<TcpListener>(std::move(fd), endpoint_text(bound));
}

absl::StatusOr<std::unique_ptr<KvTransport>> connect_tcp(absl::string_view host,
                                                         absl::string_view port,
                                                         absl::Duration timeout) {
  const std::string endpoint = absl::StrCat("tcp://", host, ":", port);
  absl::StatusOr<AddrInfo> info = resolve(host, port, /*passive=*/false);
  if (!info.ok()) return info.status();
  const addrinfo* address = info->get();
  absl::StatusOr<UniqueFd> fd = connect_with_deadline(address->ai_family, address->ai_addr,
                                                      address->ai_addrlen, endpoint, timeout);
  if (!fd.ok()) return fd.status();
  return std::make_unique<TcpTransport>(*std::move(fd), endpoint);
}

}  // namespace pagedkv::internal
