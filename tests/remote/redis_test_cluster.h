// RedisCluster: a three-master Redis Cluster for one test: three redis-servers
// (tests/remote/redis_server.h) with --cluster-enabled on free loopback ports, each with
// a free cluster bus port and its nodes file in a temporary directory, joined by
// `redis-cli --cluster create ... --cluster-replicas 0`; ready when every node reports
// cluster_state:ok. Killed and removed when the object goes.
#ifndef PAGEDKV_TESTS_REMOTE_REDIS_TEST_CLUSTER_H_
#define PAGEDKV_TESTS_REMOTE_REDIS_TEST_CLUSTER_H_

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "remote/redis_server.h"

namespace pagedkv::testing {

class RedisCluster {
 public:
  static constexpr int kMasters = 3;

  RedisCluster() {
    std::set<int> ports;  // distinct: a free port is only free until someone binds it
    while (ports.size() < 2 * kMasters) ports.insert(free_loopback_port());
    auto port = ports.begin();
    std::vector<std::string> create = {"--cluster", "create"};
    for (int i = 0; i < kMasters; ++i) {
      const std::string client = std::to_string(*port++);
      const std::string bus = std::to_string(*port++);
      servers_.push_back(std::make_unique<RedisServer>(
          std::stoi(client),
          std::vector<std::string>{"--cluster-enabled", "yes", "--cluster-port", bus,
                                   "--cluster-config-file",
                                   temp_dir_.path + "/nodes-" + client + ".conf",
                                   "--cluster-node-timeout", "5000", "--dir", temp_dir_.path}));
      create.push_back("127.0.0.1:" + client);
    }
    create.insert(create.end(), {"--cluster-replicas", "0", "--cluster-yes"});
    REQUIRE(run_cli(create) == 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (int i = 0; i < kMasters; ++i) {
      while (server(i).command({"CLUSTER", "INFO"}).find("cluster_state:ok") == std::string::npos) {
        REQUIRE(std::chrono::steady_clock::now() < deadline);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  RedisServer& server(int i) { return *servers_.at(i); }
  // The store's URL: the first master; the store learns the others.
  std::string url() const { return servers_[0]->url(); }
  std::string node_id(int i) { return server(i).command({"CLUSTER", "MYID"}); }
  int64_t dbsize(int i) { return std::stoll(server(i).command({"DBSIZE"})); }

  // Starts redis-cli with `args` (after the binary) in the background, its output in the
  // cluster's log; returns its pid.
  pid_t spawn_cli(std::vector<std::string> args) {
    args.insert(args.begin(), binary_on_path("redis-cli"));
    return spawn_process(args, log_path());
  }
  // Runs redis-cli to its end; returns its exit status (the log shown when it fails).
  int run_cli(const std::vector<std::string>& args) {
    const pid_t pid = spawn_cli(args);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    if (code != 0) WARN("redis-cli exited with " << code << ":\n" << log());
    return code;
  }
  std::string log() const {
    std::stringstream text;
    text << std::ifstream(log_path()).rdbuf();
    return text.str();
  }

 private:
  std::string log_path() const { return temp_dir_.path + "/redis-cli.log"; }

  // The nodes files and redis-cli's log; removed after the servers are killed (members go
  // in reverse order), also when the constructor fails.
  struct TempDir {
    TempDir() {
      char name[] = "/tmp/pagedkv-cluster-XXXXXX";
      REQUIRE(mkdtemp(name) != nullptr);
      path = name;
    }
    ~TempDir() { std::filesystem::remove_all(path); }
    std::string path;
  };
  TempDir temp_dir_;
  std::vector<std::unique_ptr<RedisServer>> servers_;
};

}  // namespace pagedkv::testing

#endif  // PAGEDKV_TESTS_REMOTE_REDIS_TEST_CLUSTER_H_
