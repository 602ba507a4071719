#include "transfer/socket_util.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pagedkv::internal {

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() { reset(); }

int UniqueFd::release() { return std::exchange(fd_, -1); }

void UniqueFd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

absl::Status errno_status(absl::string_view what, absl::string_view endpoint) {
  return absl::UnavailableError(absl::StrCat(what, " ", endpoint, ": ", std::strerror(errno)));
}

int poll_timeout_ms(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))));
}

short poll_until(int fd, short events, absl::Time deadline) {
  pollfd entry{.fd = fd, .events = events, .revents = 0};
  while (true) {
    const int ready = ::poll(&entry, 1, poll_timeout_ms(deadline));
    if (ready > 0) return entry.revents;
    if (ready == 0 || errno != EINTR) return 0;
  }
}

absl::Status make_nonblocking(int fd, absl::string_view endpoint) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0 ||
      ::fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
    return errno_status("fcntl on a socket of", endpoint);
  }
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> connect_with_deadline(int family, const sockaddr* address,
                                               socklen_t address_bytes, absl::string_view endpoint,
                                               absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  UniqueFd fd(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno_status("socket for", endpoint);
  if (::connect(fd.get(), address, address_bytes) == 0) return fd;
  if (errno != EINPROGRESS && errno != EAGAIN) return errno_status("connect to", endpoint);
  if ((poll_until(fd.get(), POLLOUT, deadline) & (POLLOUT | POLLERR | POLLHUP)) == 0) {
    return absl::DeadlineExceededError(absl::StrCat("connect to ", endpoint, ": no answer within ",
                                                    absl::FormatDuration(timeout)));
  }
  int error = 0;
  socklen_t error_bytes = sizeof(error);
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &error_bytes) < 0) {
    return errno_status("getsockopt for", endpoint);
  }
  if (error != 0) {
    errno = error;
    return errno_status("connect to", endpoint);
  }
  return fd;
}

absl::StatusOr<UniqueFd> accept_with_deadline(int fd, absl::string_view endpoint,
                                              absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    UniqueFd peer(::accept4(fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (peer.valid()) return peer;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno_status("accept at", endpoint);
    if ((poll_until(fd, POLLIN, deadline) & POLLIN) == 0 && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "accept at ", endpoint, ": no peer connected within ", absl::FormatDuration(timeout)));
    }
  }
}

}  // namespace pagedkv::internal
