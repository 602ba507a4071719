// File: examples/command_line/command_line.h
//
// The command lines of the example binaries: Abseil flags (`--flag=value` or
// `--flag value`), still accepting the spellings the binaries had before Abseil:
//   --traces-dir DIR       for --traces_dir DIR (Abseil flag names are C++ identifiers)
//   -h                     for --help
//   --trace A --trace B    for --trace=A,B, for the list flags the caller names repeatable
//                          (Abseil keeps the last value of a repeated flag)
// --help lists the flags defined in the caller's main file, not Abseil's own.
//
// Example:
//   ABSL_FLAG(std::vector<std::string>, trace, {}, "a trace to replay (repeatable)");
//   ABSL_FLAG(double, rate, 20, "arrivals per second");
//   int main(int argc, char** argv) {
//     const std::vector<std::string> positional =
//         parse_command_line(argc, argv, kUsage, __FILE__, {"trace"});
//     if (absl::Status s = check_flag(FLAGS_rate, absl::GetFlag(FLAGS_rate) > 0, "> 0"); ...
#ifndef PAGEDKV_EXAMPLES_COMMAND_LINE_COMMAND_LINE_H_
#define PAGEDKV_EXAMPLES_COMMAND_LINE_COMMAND_LINE_H_

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pagedkv::examples {

// Parses the command line into the binary's flags. Sets `usage` as the program's usage
// message and lists the flags of `main_file` (the caller's __FILE__) under --help.
// `repeatable_flags` are std::vector<std::string> flags whose repeats accumulate. Like
// absl::ParseCommandLine, exits after --help, and on an unknown flag or a value that does
// not parse, with Abseil's message naming the flag. Returns the positional arguments.
std::vector<std::string> parse_command_line(int argc, char** argv, absl::string_view usage,
                                            absl::string_view main_file,
                                            absl::Span<const absl::string_view> repeatable_flags);

// The arguments (argv without argv[0]) in Abseil's spelling, as described atop this file.
// Only names that are defined flags once dashes become underscores are rewritten, so
// Abseil still reports the unknown ones; "--" ends the flags.
std::vector<std::string> to_abseil_spelling(const std::vector<std::string>& args,
                                            absl::Span<const absl::string_view> repeatable_flags);

// OK when `valid`, else InvalidArgument "--name=value: must be <requirement>", for the
// checks a flag's type cannot make (a positive rate, a length of at least 2).
template <typename T>
absl::Status check_flag(const absl::Flag<T>& flag, bool valid, absl::string_view requirement) {
  if (valid) return absl::OkStatus();
  const absl::CommandLineFlag& handle = absl::GetFlagReflectionHandle(flag);
  return absl::InvalidArgumentError(
      absl::StrCat("--", handle.Name(), "=", handle.CurrentValue(), ": must be ", requirement));
}

}  // namespace pagedkv::examples

#endif  // PAGEDKV_EXAMPLES_COMMAND_LINE_COMMAND_LINE_H_
