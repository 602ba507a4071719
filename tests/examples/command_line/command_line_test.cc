// Tests of the example binaries' command lines (command_line.h): older spellings in
// Abseil's, and the messages of check_flag(). Flags defined here exist only in the test.
#include "command_line.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

ABSL_FLAG(std::string, command_line_test_dir, "", "a directory");
ABSL_FLAG(std::vector<std::string>, command_line_test_list, {}, "a repeatable list");
ABSL_FLAG(double, command_line_test_rate, 1, "a rate, > 0");

namespace pagedkv::examples {
namespace {

using Args = std::vector<std::string>;

constexpr absl::string_view kRepeatable[] = {"command_line_test_list"};

TEST_CASE("dashed flag names become Abseil's, values and unknown names stay as they are",
          "[command_line]") {
  CHECK(to_abseil_spelling({"--command-line-test-dir", "a-b", "--command-line-test-dir=c-d",
                            "--command_line_test_dir=e", "--no-such-flag", "-1", "x-y"},
                           kRepeatable) ==
        Args{"--command_line_test_dir", "a-b", "--command_line_test_dir=c-d",
             "--command_line_test_dir=e", "--no-such-flag", "-1", "x-y"});
  CHECK(to_abseil_spelling({"-h"}, kRepeatable) == Args{"--help"});
}

TEST_CASE("a repeatable flag's values accumulate in one comma-separated value", "[command_line]") {
  CHECK(to_abseil_spelling({"--command-line-test-list", "a", "--command-line-test-dir=d",
                            "--command_line_test_list=b,c"},
                           kRepeatable) ==
        Args{"--command_line_test_dir=d", "--command_line_test_list=a,b,c"});
  // Without a value the flag stays, for Abseil to report the missing value.
  CHECK(to_abseil_spelling({"--command-line-test-list"}, kRepeatable) ==
        Args{"--command_line_test_list"});
  // Not named repeatable: the last value wins, as in Abseil.
  CHECK(to_abseil_spelling({"--command-line-test-list=a", "--command-line-test-list=b"}, {}) ==
        Args{"--command_line_test_list=a", "--command_line_test_list=b"});
}

TEST_CASE("arguments after -- are left as they are", "[command_line]") {
  CHECK(to_abseil_spelling({"--command-line-test-list", "a", "--", "--command-line-test-dir", "-h"},
                           kRepeatable) ==
        Args{"--command_line_test_list=a", "--", "--command-line-test-dir", "-h"});
}

TEST_CASE("check_flag names the flag, its value and the requirement", "[command_line]") {
  absl::SetFlag(&FLAGS_command_line_test_rate, -1.5);
  const absl::Status status = check_flag(FLAGS_command_line_test_rate, false, "> 0");
  CHECK(absl::IsInvalidArgument(status));
  CHECK(status.message() == "--command_line_test_rate=-1.5: must be > 0");
  CHECK(check_flag(FLAGS_command_line_test_rate, true, "> 0").ok());
  absl::SetFlag(&FLAGS_command_line_test_rate, 1.0);
}

}  // namespace
}  // namespace pagedkv::examples
