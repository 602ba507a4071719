// A downstream project's view of pagedkv::remote: a directory store's round trip.
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "pagedkv/directory_kv_store.h"

int main() {
  char directory[] = "/tmp/pagedkv-remote-consumer-XXXXXX";
  if (mkdtemp(directory) == nullptr) return 1;
  bool ok = false;
  {
    auto store = pagedkv::create_directory_kv_store({.directory = directory});
    if (!store.ok()) return 1;
    const std::string key = pagedkv::remote_block_key("consumer", pagedkv::BlockHash{1, 2});
    auto put = (*store)->put({key}, {"payload"});
    auto get = (*store)->get({key});
    if (!put.ok() || !get.ok()) return 1;
    std::vector<pagedkv::RemoteCompletion> done;
    for (int i = 0; i < 5000 && done.size() < 2; ++i) {
      (*store)->poll(&done);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ok = done.size() == 2 && done[1].values.size() == 1 && done[1].values[0] == "payload";
  }
  std::filesystem::remove_all(directory);
  std::printf("remote_consumer: %s\n", ok ? "round trip" : "failed");
  return ok ? 0 : 1;
}
