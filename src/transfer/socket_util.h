// File: src/transfer/socket_util.h
//
// Small POSIX helpers the transports share: deadlines as poll() timeouts, errno as a
// Status that names the endpoint, and non-blocking connect and accept with a deadline.
#ifndef PAGEDKV_TRANSFER_SOCKET_UTIL_H_
#define PAGEDKV_TRANSFER_SOCKET_UTIL_H_

#include <sys/socket.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pagedkv::internal {

// An owned file descriptor, closed on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset();

 private:
  int fd_ = -1;
};

// Unavailable: "<what> <endpoint>: <strerror(errno)>".
absl::Status errno_status(absl::string_view what, absl::string_view endpoint);

// poll() of one descriptor until `deadline`, EINTR retried. Returns the revents (0 at the
// deadline).
short poll_until(int fd, short events, absl::Time deadline);

// The poll() timeout in milliseconds that ends at `deadline` (rounded up, so a caller
// never wakes just before it), -1 for an infinite deadline.
int poll_timeout_ms(absl::Time deadline);

// Makes `fd` non-blocking and close-on-exec.
absl::Status make_nonblocking(int fd, absl::string_view endpoint);

// Connects a new non-blocking socket of `family` to `address`, waiting at most `timeout`.
absl::StatusOr<UniqueFd> connect_with_deadline(int family, const sockaddr* address,
                                               socklen_t address_bytes, absl::string_view endpoint,
                                               absl::Duration timeout);

// Accepts one connection on the non-blocking listening socket `fd`, waiting at most
// `timeout`; the result is non-blocking.
absl::StatusOr<UniqueFd> accept_with_deadline(int fd, absl::string_view endpoint,
                                              absl::Duration timeout);

}  // namespace pagedkv::internal

#endif  // PAGEDKV_TRANSFER_SOCKET_UTIL_H_
