#include "command_line.h"

#include <algorithm>
#include <cstddef>
#include <map>

#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"

namespace pagedkv::examples {
namespace {

// A source file's path as --help prints it: relative to the source tree.
std::string relative_to_source_tree(absl::string_view file) {
  return std::string(absl::StripPrefix(file, PAGEDKV_SOURCE_DIR "/"));
}

// --help and --helpshort list the flags of `main_file` only.
void list_flags_of(absl::string_view main_file) {
  absl::FlagsUsageConfig config;
  config.normalize_filename = relative_to_source_tree;
  config.contains_help_flags = [main = relative_to_source_tree(main_file)](absl::string_view file) {
    return file == main;
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
}

}  // namespace

std::vector<std::string> to_abseil_spelling(const std::vector<std::string>& args,
                                            absl::Span<const absl::string_view> repeatable_flags) {
  std::vector<std::string> out;
  std::map<std::string, std::vector<std::string>> repeated_values;  // flag name -> values
  size_t i = 0;
  for (; i < args.size() && args[i] != "--"; ++i) {
    const std::string& arg = args[i];
    if (arg == "-h") {
      out.push_back("--help");
      continue;
    }
    absl::string_view name = arg;
    if (!absl::ConsumePrefix(&name, "--")) {
      out.push_back(arg);
      continue;
    }
    const size_t equals = name.find('=');
    const bool inline_value = equals != absl::string_view::npos;
    const std::string abseil_name = absl::StrReplaceAll(name.substr(0, equals), {{"-", "_"}});
    if (absl::FindCommandLineFlag(abseil_name) == nullptr) {
      out.push_back(arg);  // Abseil names it in its error
      continue;
    }
    const bool repeatable = std::find(repeatable_flags.begin(), repeatable_flags.end(),
                                      abseil_name) != repeatable_flags.end();
    if (repeatable && (inline_value || i + 1 < args.size())) {
      repeated_values[abseil_name].push_back(inline_value ? std::string(name.substr(equals + 1))
                                                          : args[++i]);
      continue;
    }
    out.push_back(
        absl::StrCat("--", abseil_name, inline_value ? name.substr(equals) : absl::string_view()));
  }
  for (const auto& [flag, values] : repeated_values) {
    out.push_back(absl::StrCat("--", flag, "=", absl::StrJoin(values, ",")));
  }
  out.insert(out.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());  // "--" on
  return out;
}

std::vector<std::string> parse_command_line(int argc, char** argv, absl::string_view usage,
                                            absl::string_view main_file,
                                            absl::Span<const absl::string_view> repeatable_flags) {
  absl::SetProgramUsageMessage(usage);
  list_flags_of(main_file);
  std::vector<std::string> args =
      to_abseil_spelling(std::vector<std::string>(argv + 1, argv + argc), repeatable_flags);
  std::vector<char*> abseil_argv = {argv[0]};
  for (std::string& arg : args) abseil_argv.push_back(arg.data());
  const std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(abseil_argv.size()), abseil_argv.data());
  return std::vector<std::string>(positional.begin() + 1, positional.end());
}

}  // namespace pagedkv::examples
