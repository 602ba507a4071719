// RedisServer: a real redis-server on a free loopback port for one test, started with no
// persistence and killed (SIGKILL, then reaped) when the object goes, also when the test
// fails; if the test process itself dies, PR_SET_PDEATHSIG kills the server too. Also the
// Redis cases' skip checks (skip_without_redis, skip_without_redis_cli) and their store
// (make_store).
#ifndef PAGEDKV_TESTS_REMOTE_REDIS_SERVER_H_
#define PAGEDKV_TESTS_REMOTE_REDIS_SERVER_H_

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "pagedkv/redis_kv_store.h"
#include "pagedkv/remote_kv_store.h"
#include "support/skip.h"

namespace pagedkv::testing {

// The path of the program `name` on PATH, or "" when it is not installed.
inline std::string binary_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/usr/local/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = dir + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

inline std::string redis_server_binary() { return binary_on_path("redis-server"); }

// True, with the test case reported skipped, when one of `programs` is not on PATH.
inline bool skip_without(const std::vector<std::string>& programs) {
  std::string names;
  bool missing = false;
  for (const std::string& program : programs) {
    names += (names.empty() ? "" : " or ") + program;
    missing = missing || binary_on_path(program).empty();
  }
  if (!missing) return false;
  report_skip(names + " is not installed (bash scripts/install-deps.sh)");
  return true;
}

// The skip checks of the Redis cases: a server; the cluster cases also run redis-cli
// (--cluster create, reshard).
inline bool skip_without_redis() { return skip_without({"redis-server"}); }
inline bool skip_without_redis_cli() { return skip_without({"redis-server", "redis-cli"}); }

// A RedisKvStore with `options`; the test fails when it cannot be created.
inline std::unique_ptr<RemoteKvStore> make_store(RedisKvStoreOptions options) {
  absl::StatusOr<std::unique_ptr<RemoteKvStore>> store = create_redis_kv_store(options);
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  return *std::move(store);
}

// Runs `args` (args[0] a path) as a child process with stdout and stderr appended to
// `log`; the child dies with the test process (PR_SET_PDEATHSIG). Returns its pid. The
// child only makes system calls: other threads (a store's) may hold malloc's lock.
inline pid_t spawn_process(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(out, STDOUT_FILENO);
    dup2(out, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// A loopback port nobody listens on now: bind port 0, read the port, close.
inline int free_loopback_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  socklen_t length = sizeof(address);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  close(fd);
  return ntohs(address.sin_port);
}

class RedisServer {
 public:
  // Starts redis-server on `port` with `extra_args` (e.g. {"--requirepass", "pw"}) and
  // waits until it answers PING.
  RedisServer(int port, std::vector<std::string> extra_args)
      : port_(port), extra_args_(std::move(extra_args)) {
    start();
  }
  ~RedisServer() { kill9(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

  void start() {
    REQUIRE(pid_ < 0);
    std::vector<std::string> args = {redis_server_binary(),
                                     "--port",
                                     std::to_string(port_),
                                     "--bind",
                                     "127.0.0.1",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--daemonize",
                                     "no",
                                     "--enable-debug-command",
                                     "yes"};
    args.insert(args.end(), extra_args_.begin(), extra_args_.end());
    pid_ = spawn_process(args, "/dev/null");
    REQUIRE(wait_for_ping());
  }

  // SIGKILL, as a crash would; returns once the process is reaped.
  void kill9() {
    if (pid_ < 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // Returns once the server stops answering (a DEBUG SLEEP sent from another thread has
  // begun): a PING on a fresh connection gets no reply within 50 ms.
  void wait_until_asleep() const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (;;) {
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      redisContext* context = redisConnectWithTimeout("127.0.0.1", port_, {1, 0});
      REQUIRE((context != nullptr && context->err == 0));
      redisSetTimeout(context, {0, 50000});
      void* reply = redisCommand(context, "PING");
      redisFree(context);
      if (reply == nullptr) return;
      freeReplyObject(reply);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  // Runs one command on a connection of its own (blocking, 10 s timeout): DEBUG SLEEP,
  // DBSIZE. Returns the reply as text (a string, status or error, an integer in decimal;
  // "" for anything else or no reply).
  std::string command(const std::vector<std::string>& words,
                      const std::string& password = "") const {
    redisContext* context = redisConnectWithTimeout("127.0.0.1", port_, {10, 0});
    REQUIRE((context != nullptr && context->err == 0));
    redisSetTimeout(context, {10, 0});
    if (!password.empty()) freeReplyObject(redisCommand(context, "AUTH %s", password.c_str()));
    std::vector<const char*> argv;
    std::vector<size_t> lengths;
    for (const std::string& word : words) {
      argv.push_back(word.c_str());
      lengths.push_back(word.size());
    }
    auto* reply = static_cast<redisReply*>(
        redisCommandArgv(context, static_cast<int>(argv.size()), argv.data(), lengths.data()));
    std::string text;
    if (reply != nullptr && reply->type == REDIS_REPLY_INTEGER) {
      text = std::to_string(reply->integer);
    } else if (reply != nullptr && reply->str != nullptr) {
      text.assign(reply->str, reply->len);
    }
    if (reply != nullptr) freeReplyObject(reply);
    redisFree(context);
    return text;
  }

 private:
  // Any reply to PING counts (with --requirepass it is a NOAUTH error).
  bool wait_for_ping() const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      redisContext* context = redisConnectWithTimeout("127.0.0.1", port_, {0, 200000});
      if (context != nullptr && context->err == 0) {
        void* reply = redisCommand(context, "PING");
        redisFree(context);
        if (reply != nullptr) {
          freeReplyObject(reply);
          return true;
        }
      } else if (context != nullptr) {
        redisFree(context);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  int port_;
  std::vector<std::string> extra_args_;
  pid_t pid_ = -1;
};

}  // namespace pagedkv::testing

#endif  // PAGEDKV_TESTS_REMOTE_REDIS_SERVER_H_
