// File: src/remote/redis_connection.h
//
// RedisConnection: one connection to one Redis server, owned by the I/O thread. hiredis
// opens it and runs the rare commands whose replies are structured (AUTH, SELECT, INFO,
// CLUSTER SLOTS); the data path speaks RESP on the socket itself so that a value is
// copied once each way: a put's value goes out with sendmsg straight from the request's
// string, and a GET's bulk reply is read straight into the completion's string. Through
// hiredis a value would be copied into its output buffer, and a reply through its read
// buffer and reply object, then into the completion (docs/remote.md, Throughput).
//
//   append(), append_with_value()  command headers and small values copied into out_,
//                                  large values referenced in segments_
//   flush()                        one sendmsg per up to IOV_MAX segments, blocking
//   read_reply()                   lines parsed from in_ (64 KiB reads); a bulk value's
//                                  bytes past what in_ holds are read into its string
//
// The socket stays blocking with SO_RCVTIMEO / SO_SNDTIMEO = command_timeout_ms (set by
// hiredis), which bounds every read and write. Any failure (write, read, timeout, a reply
// that is not RESP) closes the connection: replies still due would pair with the wrong
// commands. A connect that fails starts a backoff during which ensure_connected() fails
// at once.
#ifndef PAGEDKV_REMOTE_REDIS_CONNECTION_H_
#define PAGEDKV_REMOTE_REDIS_CONNECTION_H_

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "remote/redis_cluster.h"

struct redisContext;
struct redisReply;

namespace pagedkv::internal {

struct RedisReplyDeleter {
  void operator()(redisReply* reply) const;
};
using RedisReplyPtr = std::unique_ptr<redisReply, RedisReplyDeleter>;

// What every connection of a store shares; the password is never logged.
struct RedisConnectionSettings {
  int32_t connect_timeout_ms = 500;
  int32_t command_timeout_ms = 2000;
  int32_t reconnect_backoff_min_ms = 50;
  int32_t reconnect_backoff_max_ms = 5000;
  std::string username;
  std::string password;
  int db = 0;
};

// One reply of the data path. A bulk string goes to the caller's string, not here.
struct RespReply {
  enum class Type : uint8_t { kStatus, kError, kInteger, kBulk, kNil };
  Type type = Type::kNil;
  int64_t integer = 0;  // kInteger
  std::string text;     // kStatus, kError: the message without its '+' / '-'
};

class RedisConnection {
 public:
  RedisConnection(RedisNodeAddress address, const RedisConnectionSettings* settings);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  const RedisNodeAddress& address() const { return address_; }
  // "redis HOST:PORT", the prefix of every message about this server.
  const std::string& name() const { return name_; }

  // Connected (authenticated, database selected) or why not. Sets *reconnected when this
  // connect follows an earlier connection (not the first one). Honours the backoff.
  absl::Status ensure_connected(bool* reconnected);
  void close();

  // Runs one command through hiredis and returns its reply (an error reply included).
  // Only between batches: nothing appended or due. A transport failure closes.
  absl::StatusOr<RedisReplyPtr> command(std::initializer_list<absl::string_view> args);

  // Appends a command of small arguments (copied).
  void append(std::initializer_list<absl::string_view> args);
  // Appends a command whose last argument is `value`, which must outlive flush().
  void append_with_value(std::initializer_list<absl::string_view> args, const std::string& value);
  // Sends what was appended. On failure the connection is closed.
  absl::Status flush();

  // Reads the next reply. A bulk string is stored in *bulk (resized to its length) when
  // `bulk` is not null, else in the reply's text. On failure the connection is closed and
  // *bulk holds no value.
  absl::StatusOr<RespReply> read_reply(std::string* bulk);

 private:
  absl::Status connect_once();
  absl::Status setup_command(const std::vector<std::string>& args);
  // The status of a failed read or write (errno `error`, 0 for a closed peer), or of a
  // failed hiredis call; each closes the connection.
  absl::Status lost(absl::string_view doing, int error);
  absl::Status hiredis_lost(absl::string_view doing);
  absl::Status closed_because(absl::string_view doing, absl::string_view why);
  absl::Status protocol_error(absl::string_view what);
  // Reads more bytes into in_ (compacting it first); the connection is closed on failure.
  absl::Status fill();
  absl::StatusOr<absl::string_view> read_line();
  void append_header(size_t argc);
  void append_argument_header(size_t size);

  const RedisNodeAddress address_;
  const std::string name_;
  const RedisConnectionSettings* settings_;

  redisContext* context_ = nullptr;  // null: not connected
  bool ever_connected_ = false;
  std::chrono::milliseconds backoff_{0};
  std::chrono::steady_clock::time_point next_connect_{};

  // A part of the output: `size` bytes of out_ from `offset`, or of `external`.
  struct Segment {
    const char* external = nullptr;
    size_t offset = 0;
    size_t size = 0;
  };
  std::string out_;                // headers and small arguments, not yet sent
  std::vector<Segment> segments_;  // out_'s parts and large values, in order
  size_t out_segmented_ = 0;       // out_ bytes already covered by segments_

  std::string in_;  // read buffer: unread bytes are [in_begin_, in_end_)
  size_t in_begin_ = 0;
  size_t in_end_ = 0;
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_REMOTE_REDIS_CONNECTION_H_
