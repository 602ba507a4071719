// Unit tests of the decode loop's checkpoint reader: a safetensors file written here (its
// format from the specification, not by the reader), a config.json, and the errors for
// what the decode loop cannot run. python/tests/integrations/test_llama_checkpoint.py
// compares a real transformers checkpoint's logits.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint.h"

namespace decode_loop {
namespace {

namespace fs = std::filesystem;

struct TensorSpec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// The safetensors layout: header length (u64, little-endian), JSON header, data.
std::string safetensors(const std::vector<TensorSpec>& tensors) {
  std::ostringstream header;
  std::string data;
  header << "{";
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& t = tensors[i];
    header << (i > 0 ? "," : "") << "\"" << t.name << "\":{\"dtype\":\"" << t.dtype
           << "\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d) header << (d > 0 ? "," : "") << t.shape[d];
    header << "],\"data_offsets\":[" << data.size() << "," << data.size() + t.bytes.size() << "]}";
    data.append(t.bytes.begin(), t.bytes.end());
  }
  header << "}";
  const std::string json = header.str();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return out + json + data;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& values) {
  std::vector<uint8_t> out(values.size() * 4);
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

fs::path write(const std::string& name, const std::string& contents) {
  const fs::path path = fs::temp_directory_path() / ("pagedkv_checkpoint_test_" + name);
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

TEST_CASE("safetensors tensors read as fp32 from F32, BF16 and F16", "[decode_loop]") {
  // 1.5 and -2 in each dtype: BF16 0x3fc0 0xc000, F16 0x3e00 0xc000.
  const fs::path path =
      write("dtypes.safetensors", safetensors({{"a", "F32", {2}, f32_bytes({1.5f, -2.0f})},
                                               {"b", "BF16", {1, 2}, {0xc0, 0x3f, 0x00, 0xc0}},
                                               {"c", "F16", {2}, {0x00, 0x3e, 0x00, 0xc0}},
                                               {"d", "I64", {1}, {1, 0, 0, 0, 0, 0, 0, 0}}}));
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::open(path.string());
  REQUIRE(file.ok());
  CHECK(*(*file)->read("a", std::vector<int64_t>{2}) == std::vector<float>{1.5f, -2.0f});
  CHECK(*(*file)->read("b", std::vector<int64_t>{1, 2}) == std::vector<float>{1.5f, -2.0f});
  CHECK(*(*file)->read("c", std::vector<int64_t>{2}) == std::vector<float>{1.5f, -2.0f});
  CHECK((*file)->read("b", std::vector<int64_t>{2}).status().message() ==
        path.string() + ": tensor b has shape [1, 2], the config gives [2]");
  CHECK((*file)->read("d", std::vector<int64_t>{1}).status().message() ==
        path.string() + ": tensor d is I64; F32, BF16 or F16 are read");
  CHECK((*file)->read("e", std::vector<int64_t>{1}).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("a malformed safetensors file is refused, naming what is wrong", "[decode_loop]") {
  CHECK(SafetensorsFile::open("/nonexistent/model.safetensors").status().code() ==
        absl::StatusCode::kNotFound);
  const auto error = [](const std::string& name, const std::string& contents) {
    const fs::path path = write(name, contents);
    return std::string(SafetensorsFile::open(path.string()).status().message());
  };
  CHECK_THAT(error("short", "abc"), Catch::Contains("not a safetensors file"));
  std::string huge_header(8, '\0');
  huge_header[6] = 1;
  CHECK_THAT(error("huge", huge_header + "{}"), Catch::Contains("header of 281474976710656"));
  std::string file = safetensors({{"a", "F32", {2}, f32_bytes({1.0f, 2.0f})}});
  CHECK_THAT(error("cut", file.substr(0, file.size() - 4)),
             Catch::Contains("tensor a: data_offsets [0, 8) outside the 4 data bytes"));
  CHECK_THAT(error("mismatch", safetensors({{"a", "F32", {3}, f32_bytes({1.0f, 2.0f})}})),
             Catch::Contains("tensor a: 8 bytes for 3 F32 elements"));
  CHECK_THAT(error("notjson", std::string("\x02\0\0\0\0\0\0\0{[", 10)),
             Catch::Contains("not a JSON object"));
}

TEST_CASE("a llama config.json gives the model's sizes, and other models are refused by name",
          "[decode_loop]") {
  const std::string base = R"({"model_type": "llama", "vocab_size": 512, "hidden_size": 128,
      "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 64, "rms_norm_eps": 1e-05,
      "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"})";
  absl::StatusOr<ModelConfig> c = read_llama_config(base + "}");
  REQUIRE(c.ok());
  CHECK(c->vocab_size == 512);
  CHECK(c->d_model == 128);
  CHECK(c->num_q_heads == 4);
  CHECK(c->num_kv_heads == 2);
  CHECK(c->head_dim == 64);
  CHECK(c->ffn_dim == 256);
  CHECK(c->rope_theta == 500000.0f);
  CHECK(c->rms_eps == 1e-5f);
  const auto refused = [&](const std::string& extra) {
    return std::string(read_llama_config(base + ", " + extra + "}").status().message());
  };
  CHECK(refused(R"("mlp_bias": true)") == "config.json: mlp_bias is true: the model has no biases");
  CHECK(refused(R"("hidden_act": "gelu")") ==
        "config.json: hidden_act is \"gelu\": the model's MLP is SwiGLU (silu)");
  CHECK(refused(R"("rope_scaling": {"type": "linear", "factor": 2.0})") ==
        "config.json: rope_scaling is {\"factor\":2.0,\"type\":\"linear\"}: only default RoPE");
  CHECK_THAT(refused(R"("head_dim": 48)"), Catch::Contains("head_dim"));
  CHECK(std::string(read_llama_config(R"({"model_type": "mistral"})").status().message()) ==
        "config.json: model_type is \"mistral\": the decode loop reads llama");
  CHECK(std::string(read_llama_config(R"({"model_type": "llama"})").status().message()) ==
        "config.json: no vocab_size");
}

}  // namespace
}  // namespace decode_loop
