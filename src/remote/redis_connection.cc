#include "remote/redis_connection.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <limits.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pagedkv::internal {
namespace {

// Values at least this large are sent from the caller's string instead of being copied
// into out_; below it a copy costs less than another iovec.
constexpr size_t kReferencedValueBytes = 16 << 10;
// A larger output buffer is released after its flush.
constexpr size_t kRetainedOutBytes = 64 << 10;
// Bytes asked of each read into in_. A bulk value's bytes beyond it go straight to the
// value's string.
constexpr size_t kReadChunkBytes = 64 << 10;
// Redis' own limit on a bulk string (proto-max-bulk-len); a longer one is no reply of a
// sane server, and allocating it could exhaust memory.
constexpr int64_t kMaxBulkBytes = 512ll << 20;

timeval to_timeval(int32_t ms) {
  return timeval{.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
}

}  // namespace

void RedisReplyDeleter::operator()(redisReply* reply) const { freeReplyObject(reply); }

RedisConnection::RedisConnection(RedisNodeAddress address, const RedisConnectionSettings* settings)
    : address_(std::move(address)),
      name_(absl::StrCat("redis ", address_.host, ":", address_.port)),
      settings_(settings),
      in_(kReadChunkBytes, '\0') {}

RedisConnection::~RedisConnection() { close(); }

void RedisConnection::close() {
  if (context_ != nullptr) redisFree(context_);
  context_ = nullptr;
  out_.clear();
  segments_.clear();
  out_segmented_ = 0;
  in_begin_ = in_end_ = 0;
}

absl::Status RedisConnection::ensure_connected(bool* reconnected) {
  *reconnected = false;
  if (context_ != nullptr) return absl::OkStatus();
  const auto now = std::chrono::steady_clock::now();
  if (now < next_connect_) {
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_connect_ - now);
    return absl::UnavailableError(absl::StrCat(name_, ": not connected; next attempt in ",
                                               wait.count(), " ms (reconnect backoff)"));
  }
  if (absl::Status status = connect_once(); !status.ok()) {
    backoff_ =
        std::clamp(2 * backoff_, std::chrono::milliseconds(settings_->reconnect_backoff_min_ms),
                   std::chrono::milliseconds(settings_->reconnect_backoff_max_ms));
    next_connect_ = now + backoff_;
    return status;
  }
  *reconnected = ever_connected_;
  ever_connected_ = true;
  backoff_ = std::chrono::milliseconds(0);
  return absl::OkStatus();
}

absl::Status RedisConnection::connect_once() {
  context_ = redisConnectWithTimeout(address_.host.c_str(), address_.port,
                                     to_timeval(settings_->connect_timeout_ms));
  if (context_ == nullptr) return absl::ResourceExhaustedError("redis: cannot allocate a context");
  if (context_->err != 0) {
    absl::Status status = absl::UnavailableError(
        absl::StrCat(name_, ": connect: ", context_->errstr, " (connect_timeout_ms ",
                     settings_->connect_timeout_ms, ")"));
    close();
    return status;
  }
  redisSetTimeout(context_, to_timeval(settings_->command_timeout_ms));
  redisEnableKeepAlive(context_);
  // AUTH, then SELECT: each reply checked before the connection serves a batch.
  if (!settings_->password.empty()) {
    absl::Status status = settings_->username.empty()
                              ? setup_command({"AUTH", settings_->password})
                              : setup_command({"AUTH", settings_->username, settings_->password});
    if (!status.ok()) return status;
  }
  if (settings_->db != 0) return setup_command({"SELECT", std::to_string(settings_->db)});
  return absl::OkStatus();
}

absl::Status RedisConnection::setup_command(const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lengths;
  for (const std::string& arg : args) {
    argv.push_back(arg.data());
    lengths.push_back(arg.size());
  }
  RedisReplyPtr reply(static_cast<redisReply*>(
      redisCommandArgv(context_, static_cast<int>(argv.size()), argv.data(), lengths.data())));
  if (reply == nullptr) return hiredis_lost(args[0]);
  if (reply->type == REDIS_REPLY_ERROR) {
    // The server's message ("WRONGPASS ...", "ERR DB index is out of range") names no
    // password; the command's first word says which step failed.
    absl::Status status = absl::PermissionDeniedError(
        absl::StrCat(name_, ": ", args[0], ": ", absl::string_view(reply->str, reply->len)));
    close();
    return status;
  }
  return absl::OkStatus();
}

absl::StatusOr<RedisReplyPtr> RedisConnection::command(
    std::initializer_list<absl::string_view> args) {
  if (in_begin_ != in_end_) return protocol_error("bytes after the last reply");
  std::vector<const char*> argv;
  std::vector<size_t> lengths;
  for (absl::string_view arg : args) {
    argv.push_back(arg.data());
    lengths.push_back(arg.size());
  }
  RedisReplyPtr reply(static_cast<redisReply*>(
      redisCommandArgv(context_, static_cast<int>(argv.size()), argv.data(), lengths.data())));
  if (reply == nullptr) return hiredis_lost(*args.begin());
  return reply;
}

absl::Status RedisConnection::lost(absl::string_view doing, int error) {
  if (error == EAGAIN || error == EWOULDBLOCK) {
    return closed_because(
        doing, absl::StrCat(doing == "send" ? "not sent" : "no reply",
                            " within command_timeout_ms ", settings_->command_timeout_ms));
  }
  return closed_because(doing, error == 0 ? "connection closed by the server" : strerror(error));
}

absl::Status RedisConnection::hiredis_lost(absl::string_view doing) {
  const absl::string_view why = context_->errstr;
  const bool timed_out =
      context_->err == REDIS_ERR_IO &&
      (absl::StrContains(why, "temporarily unavailable") || absl::StrContains(why, "timed out"));
  return closed_because(doing, timed_out ? absl::StrCat("no reply within command_timeout_ms ",
                                                        settings_->command_timeout_ms)
                                         : std::string(why));
}

absl::Status RedisConnection::closed_because(absl::string_view doing, absl::string_view why) {
  absl::Status status = absl::UnavailableError(absl::StrCat(name_, ": ", doing, ": ", why));
  close();
  return status;
}

absl::Status RedisConnection::protocol_error(absl::string_view what) {
  absl::Status status = absl::InternalError(absl::StrCat(name_, ": not a RESP reply: ", what));
  close();
  return status;
}

void RedisConnection::append_header(size_t argc) { absl::StrAppend(&out_, "*", argc, "\r\n"); }

void RedisConnection::append_argument_header(size_t size) {
  absl::StrAppend(&out_, "$", size, "\r\n");
}

void RedisConnection::append(std::initializer_list<absl::string_view> args) {
  append_header(args.size());
  for (absl::string_view arg : args) {
    append_argument_header(arg.size());
    absl::StrAppend(&out_, arg, "\r\n");
  }
}

void RedisConnection::append_with_value(std::initializer_list<absl::string_view> args,
                                        const std::string& value) {
  append_header(args.size() + 1);
  for (absl::string_view arg : args) {
    append_argument_header(arg.size());
    absl::StrAppend(&out_, arg, "\r\n");
  }
  append_argument_header(value.size());
  if (value.size() < kReferencedValueBytes) {
    absl::StrAppend(&out_, value, "\r\n");
    return;
  }
  segments_.push_back({.offset = out_segmented_, .size = out_.size() - out_segmented_});
  segments_.push_back({.external = value.data(), .size = value.size()});
  out_ += "\r\n";
  out_segmented_ = out_.size() - 2;
}

absl::Status RedisConnection::flush() {
  segments_.push_back({.offset = out_segmented_, .size = out_.size() - out_segmented_});
  std::vector<iovec> iov;
  iov.reserve(segments_.size());
  for (const Segment& s : segments_) {
    if (s.size == 0) continue;
    const char* base = s.external != nullptr ? s.external : out_.data() + s.offset;
    iov.push_back({.iov_base = const_cast<char*>(base), .iov_len = s.size});
  }
  size_t next = 0;
  while (next < iov.size()) {
    msghdr message{};
    message.msg_iov = iov.data() + next;
    message.msg_iovlen = std::min<size_t>(iov.size() - next, IOV_MAX);
    // MSG_NOSIGNAL: a peer that closed gives EPIPE, whatever the thread's signal mask.
    ssize_t sent = sendmsg(context_->fd, &message, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0) return lost("send", errno);
    for (; sent > 0 && next < iov.size(); ++next) {
      if (static_cast<size_t>(sent) < iov[next].iov_len) {
        iov[next].iov_base = static_cast<char*>(iov[next].iov_base) + sent;
        iov[next].iov_len -= sent;
        break;
      }
      sent -= static_cast<ssize_t>(iov[next].iov_len);
    }
  }
  out_.clear();
  // A chunk of many small values can grow out_ to pipeline_bytes; an idle connection
  // should not keep that.
  if (out_.capacity() > kRetainedOutBytes) out_.shrink_to_fit();
  segments_.clear();
  out_segmented_ = 0;
  return absl::OkStatus();
}

absl::Status RedisConnection::fill() {
  if (in_begin_ > 0) {
    std::copy(in_.begin() + in_begin_, in_.begin() + in_end_, in_.begin());
    in_end_ -= in_begin_;
    in_begin_ = 0;
  }
  if (in_end_ == in_.size()) return protocol_error("a line longer than 64 KiB");
  for (;;) {
    const ssize_t got = recv(context_->fd, in_.data() + in_end_, in_.size() - in_end_, 0);
    if (got > 0) {
      in_end_ += got;
      return absl::OkStatus();
    }
    if (got < 0 && errno == EINTR) continue;
    return lost("read", got == 0 ? 0 : errno);
  }
}

absl::StatusOr<absl::string_view> RedisConnection::read_line() {
  size_t scanned = in_begin_;
  for (;;) {
    const absl::string_view unread(in_.data() + in_begin_, in_end_ - in_begin_);
    const size_t end = unread.find("\r\n", scanned - in_begin_);
    if (end != absl::string_view::npos) {
      in_begin_ += end + 2;
      return unread.substr(0, end);
    }
    // Rescan the last byte: it may be the '\r' of a "\r\n" split across reads.
    const size_t rescan = unread.empty() ? 0 : unread.size() - 1;
    if (absl::Status status = fill(); !status.ok()) return status;
    scanned = in_begin_ + rescan;
  }
}

absl::StatusOr<RespReply> RedisConnection::read_reply(std::string* bulk) {
  absl::StatusOr<absl::string_view> line = read_line();
  if (!line.ok()) return line.status();
  if (line->empty()) return protocol_error("an empty line");
  RespReply reply;
  const char type = (*line)[0];
  const absl::string_view rest = line->substr(1);
  switch (type) {
    case '+':
    case '-':
      reply.type = type == '+' ? RespReply::Type::kStatus : RespReply::Type::kError;
      reply.text = std::string(rest);
      return reply;
    case ':':
      reply.type = RespReply::Type::kInteger;
      if (!absl::SimpleAtoi(rest, &reply.integer)) return protocol_error("a malformed integer");
      return reply;
    case '$':
      break;
    default:
      return protocol_error(absl::StrCat("type byte ", static_cast<int>(type)));
  }
  int64_t size = 0;
  if (!absl::SimpleAtoi(rest, &size) || size < -1 || size > kMaxBulkBytes) {
    return protocol_error("a bulk length out of range");
  }
  if (size == -1) return reply;  // kNil
  reply.type = RespReply::Type::kBulk;
  std::string* value = bulk != nullptr ? bulk : &reply.text;
  value->resize(size);
  // What in_ already holds, then the rest straight into the value.
  size_t have = std::min<size_t>(size, in_end_ - in_begin_);
  std::copy_n(in_.data() + in_begin_, have, value->data());
  in_begin_ += have;
  while (have < static_cast<size_t>(size)) {
    const ssize_t got = recv(context_->fd, value->data() + have, size - have, 0);
    if (got > 0) {
      have += got;
    } else if (got < 0 && errno == EINTR) {
      continue;
    } else {
      value->clear();
      return lost("read", got == 0 ? 0 : errno);
    }
  }
  while (in_end_ - in_begin_ < 2) {
    if (absl::Status status = fill(); !status.ok()) {
      value->clear();
      return status;
    }
  }
  if (in_[in_begin_] != '\r' || in_[in_begin_ + 1] != '\n') {
    value->clear();
    return protocol_error("a bulk string without its CRLF");
  }
  in_begin_ += 2;
  return reply;
}

}  // namespace pagedkv::internal
