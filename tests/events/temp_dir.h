// TempDir: a fresh directory under /tmp for a test's files, removed with everything in it
// when the test ends.
#ifndef PAGEDKV_TESTS_EVENTS_TEMP_DIR_H_
#define PAGEDKV_TESTS_EVENTS_TEMP_DIR_H_

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

namespace pagedkv::testing {

class TempDir {
 public:
  TempDir() {
    std::string pattern = "/tmp/pagedkv-test-XXXXXX";
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // Writes `text` to the file `name` in the directory; returns its path.
  std::string file(const std::string& name, const std::string& text) const {
    const std::string path = path_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace pagedkv::testing

#endif  // PAGEDKV_TESTS_EVENTS_TEMP_DIR_H_
