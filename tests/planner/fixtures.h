// The planner's model fixtures (tests/planner/fixtures/<model>/): excerpt.json, the fields
// of the model's public config.json that the planner reads, with the upstream values
// (committed); and the upstream config.json itself, which the repository does not carry
// (SOURCE.md says where it is published): when it is placed next to the excerpt, or under
// shared/planner/fixtures/<model>/ beside the source tree, the tests check that both read
// alike.
#ifndef PAGEDKV_TESTS_PLANNER_FIXTURES_H_
#define PAGEDKV_TESTS_PLANNER_FIXTURES_H_

#include <filesystem>
#include <optional>
#include <string>

namespace pagedkv::testing {

inline constexpr const char* kPlannerFixtures[] = {
    "meta-llama--Llama-3.1-8B",
    "meta-llama--Llama-3.1-70B",
    "Qwen--Qwen3-8B",
    "google--gemma-3-27b-it",
    "openai--gpt-oss-120b",
    "meta-llama--Llama-4-Scout-17B-16E-Instruct",
    "deepseek-ai--DeepSeek-V3",
    "Qwen--Qwen3-Next-80B-A3B-Instruct",
    "nvidia--Nemotron-H-8B-Base-8K",
    "ibm-granite--granite-4.0-h-tiny",
};

inline std::string fixture_excerpt(const std::string& model) {
  return std::string(PAGEDKV_SOURCE_DIR) + "/tests/planner/fixtures/" + model + "/excerpt.json";
}

// The upstream config.json of `model`, when it is here.
inline std::optional<std::string> fixture_upstream(const std::string& model) {
  for (const std::string& dir :
       {std::string(PAGEDKV_SOURCE_DIR) + "/tests/planner/fixtures/",
        std::string(PAGEDKV_SOURCE_DIR) + "/../shared/planner/fixtures/"}) {
    const std::string path = dir + model + "/config.json";
    if (std::filesystem::exists(path)) return path;
  }
  return std::nullopt;
}

}  // namespace pagedkv::testing

#endif  // PAGEDKV_TESTS_PLANNER_FIXTURES_H_
