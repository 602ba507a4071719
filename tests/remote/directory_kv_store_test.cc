// DirectoryKvStore in a temporary directory: round trips, safe file names, atomic
// replacement seen by a second store on the same directory, refused input.
#include "pagedkv/directory_kv_store.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <thread>

#include "events/temp_dir.h"
#include "remote/directory_kv_store.h"
#include "remote/store_test_util.h"

namespace pagedkv {
namespace {

using testing::all_results;
using testing::milliseconds;
using testing::Poller;
using testing::test_keys;
using testing::test_value;

std::unique_ptr<RemoteKvStore> make_store(const DirectoryKvStoreOptions& options) {
  auto store = create_directory_kv_store(options);
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  return *std::move(store);
}

std::vector<std::string> file_names(const std::string& directory) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST_CASE("directory store: puts, gets and exists round-trip, missing keys miss",
          "[remote][directory]") {
  testing::TempDir dir;
  for (const bool fsync : {false, true}) {
    auto store =
        make_store({.directory = dir.path() + (fsync ? "/synced" : "/plain"), .fsync = fsync});
    Poller poller(*store);
    std::vector<std::string> keys = test_keys("pagedkv:ns", 50);
    std::vector<std::string> values;
    for (int i = 0; i < 50; ++i) values.push_back(test_value(i, i == 0 ? 2 << 20 : 10 * i));
    const auto put = store->put(keys, values);
    REQUIRE(put.ok());
    const RemoteCompletion stored = poller.wait(*put);
    INFO(stored.error.ToString());
    CHECK(all_results(stored, RemoteKeyResult::kOk));

    keys.push_back("pagedkv:ns:absent");
    const auto get = store->get(keys);
    const auto exists = store->exists(keys);
    REQUIRE((get.ok() && exists.ok()));
    const RemoteCompletion got = poller.wait(*get);
    const RemoteCompletion present = poller.wait(*exists);
    for (int i = 0; i < 50; ++i) {
      CHECK(got.results[i] == RemoteKeyResult::kOk);
      CHECK(got.values[i] == values[i]);
      CHECK(present.results[i] == RemoteKeyResult::kOk);
    }
    CHECK(got.results[50] == RemoteKeyResult::kNotFound);
    CHECK(present.results[50] == RemoteKeyResult::kNotFound);
    const RemoteKvStats stats = store->stats();
    CHECK(stats.hits == 100);
    CHECK(stats.misses == 2);
    CHECK(stats.errors == 0);
  }
}

TEST_CASE("directory store: keys become single safe file names", "[remote][directory]") {
  CHECK(internal::key_file_name("pagedkv:ns:00ff") == "pagedkv%3Ans%3A00ff");
  CHECK(internal::key_file_name("../etc/passwd") == "%2E%2E%2Fetc%2Fpasswd");
  CHECK(internal::key_file_name(".hidden") == "%2Ehidden");

  testing::TempDir dir;
  auto store = make_store({.directory = dir.path() + "/kv"});
  Poller poller(*store);
  const auto put = store->put({"../escape", "a/b", "pagedkv:x:1"}, {"1", "2", "3"});
  REQUIRE(put.ok());
  CHECK(all_results(poller.wait(*put), RemoteKeyResult::kOk));
  CHECK(file_names(dir.path() + "/kv") ==
        std::vector<std::string>{"%2E%2E%2Fescape", "a%2Fb", "pagedkv%3Ax%3A1"});
  CHECK(file_names(dir.path()) == std::vector<std::string>{"kv"});
}

TEST_CASE("directory store: a reader never sees a partly written value", "[remote][directory]") {
  testing::TempDir dir;
  auto writer = make_store({.directory = dir.path()});
  auto reader = make_store({.directory = dir.path()});
  Poller write_poller(*writer);
  const size_t size = 1 << 20;
  const std::string a(size, 'a'), b(size, 'b');

  // The writer replaces the value 40 times while the reader's own thread reads it.
  std::vector<RemoteRequestId> writes;
  for (int i = 0; i < 40; ++i) writes.push_back(*writer->put({"hot"}, {i % 2 ? b : a}));
  Poller read_poller(*reader);
  int found = 0;
  while (true) {
    const auto get = reader->get({"hot"});
    REQUIRE(get.ok());
    const RemoteCompletion got = read_poller.wait(*get);
    if (got.results[0] == RemoteKeyResult::kOk) {
      ++found;
      REQUIRE((got.values[0] == a || got.values[0] == b));
    } else {
      REQUIRE(got.results[0] == RemoteKeyResult::kNotFound);  // before the first rename
    }
    write_poller.poll_once();
    if (writer->stats().requests == 40) break;
  }
  for (RemoteRequestId id : writes) CHECK(all_results(write_poller.wait(id), RemoteKeyResult::kOk));
  CHECK(found > 0);
  CHECK(file_names(dir.path()) == std::vector<std::string>{"hot"});  // no temporary left
}

TEST_CASE("directory store: a failed write is a key error naming the file", "[remote][directory]") {
  testing::TempDir dir;
  auto store = make_store({.directory = dir.path() + "/gone"});
  Poller poller(*store);
  std::filesystem::remove_all(dir.path() + "/gone");  // removed under the store
  const auto put = store->put({"k"}, {"v"});
  REQUIRE(put.ok());
  const RemoteCompletion done = poller.wait(*put);
  CHECK(done.results[0] == RemoteKeyResult::kError);
  CHECK_THAT(done.error.ToString(), Catch::Contains("create " + dir.path() + "/gone/.tmp-"));
  CHECK_THAT(done.error.ToString(), Catch::Contains("No such file or directory"));
  CHECK(store->stats().errors == 1);
  CHECK(store->stats().bytes_written == 0);
}

TEST_CASE("directory store: refused keys and directories", "[remote][directory]") {
  testing::TempDir dir;
  auto store = make_store({.directory = dir.path()});
  const auto long_key = store->get({std::string(100, ':')});
  REQUIRE(long_key.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(long_key.status().message()),
             Catch::Contains("its file name is 300 bytes; the limit is 240"));
  CHECK(store->stats().requests == 0);

  const std::string file = dir.file("plain-file", "x");
  const auto not_a_directory =
      create_directory_kv_store({.directory = file, .create_directory = false});
  REQUIRE(not_a_directory.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(not_a_directory.status().message()), Catch::Contains("not a directory"));
  CHECK(create_directory_kv_store({}).status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pagedkv
