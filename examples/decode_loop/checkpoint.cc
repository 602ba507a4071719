#include "checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "pagedkv/numeric.h"

namespace decode_loop {

namespace {

using Json = nlohmann::json;

absl::Status malformed(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

int64_t dtype_bytes(absl::string_view dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  return 0;  // unsupported
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  struct stat st {};
  const bool sized = ::fstat(fd, &st) == 0;
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->size_ = sized ? static_cast<size_t>(st.st_size) : 0;
  if (file->size_ >= 8) {
    file->map_ = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (file->map_ == MAP_FAILED) file->map_ = nullptr;
  }
  ::close(fd);
  if (file->map_ == nullptr) return malformed(path, "not a safetensors file (cannot map 8 bytes)");
  const auto* bytes = static_cast<const std::byte*>(file->map_);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | std::to_integer<uint64_t>(bytes[i]);
  if (header_len > file->size_ - 8) {
    return malformed(path,
                     absl::StrCat("header of ", header_len, " bytes in a file of ", file->size_));
  }
  const Json header = Json::parse(reinterpret_cast<const char*>(bytes + 8),
                                  reinterpret_cast<const char*>(bytes + 8 + header_len), nullptr,
                                  /*allow_exceptions=*/false);
  if (!header.is_object()) return malformed(path, "the header is not a JSON object");
  const std::span<const std::byte> data(bytes + 8 + header_len, file->size_ - 8 - header_len);
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const auto bad = [&](absl::string_view what) {
      return malformed(path, absl::StrCat("tensor ", name, ": ", what));
    };
    if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() ||
        !entry.contains("shape") || !entry["shape"].is_array() || !entry.contains("data_offsets") ||
        !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2) {
      return bad("needs dtype, shape and two data_offsets");
    }
    Tensor t;
    t.dtype = entry["dtype"].get<std::string>();
    int64_t elements = 1;
    for (const Json& dim : entry["shape"]) {
      if (!dim.is_number_unsigned() || dim.get<uint64_t>() > (uint64_t{1} << 40)) {
        return bad(absl::StrCat("shape ", entry["shape"].dump()));
      }
      t.shape.push_back(dim.get<int64_t>());
      elements *= t.shape.back();
      if (elements > (int64_t{1} << 40)) return bad("more than 2^40 elements");
    }
    const Json& offsets = entry["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
      return bad("data_offsets are not byte offsets");
    }
    const auto begin = offsets[0].get<uint64_t>();
    const auto end = offsets[1].get<uint64_t>();
    if (begin > end || end > data.size()) {
      return bad(absl::StrCat("data_offsets [", begin, ", ", end, ") outside the ", data.size(),
                              " data bytes"));
    }
    const int64_t width = dtype_bytes(t.dtype);
    if (width != 0 && static_cast<int64_t>(end - begin) != elements * width) {
      return bad(absl::StrCat(end - begin, " bytes for ", elements, " ", t.dtype, " elements"));
    }
    t.bytes = data.subspan(begin, end - begin);
    file->tensors_.emplace(name, std::move(t));
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

const SafetensorsFile::Tensor* SafetensorsFile::find(absl::string_view name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<std::vector<float>> SafetensorsFile::read(absl::string_view name,
                                                         std::span<const int64_t> shape) const {
  const Tensor* t = find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat(path_, ": no tensor ", name));
  if (!std::equal(t->shape.begin(), t->shape.end(), shape.begin(), shape.end())) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor ", name, " has shape [", absl::StrJoin(t->shape, ", "),
                     "], the config gives [", absl::StrJoin(shape, ", "), "]"));
  }
  if (dtype_bytes(t->dtype) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor ", name, " is ", t->dtype, "; F32, BF16 or F16 are read"));
  }
  const int64_t n = static_cast<int64_t>(t->bytes.size()) / dtype_bytes(t->dtype);
  std::vector<float> out(static_cast<size_t>(n));
  // Element by element (a tensor's offset need not be aligned); safetensors and this
  // machine are little-endian.
  const std::byte* data = t->bytes.data();
  for (int64_t i = 0; i < n; ++i) {
    if (t->dtype == "F32") {
      std::memcpy(&out[i], data + i * 4, 4);
    } else {
      uint16_t bits = 0;
      std::memcpy(&bits, data + i * 2, 2);
      out[i] = t->dtype == "BF16" ? pagedkv::to_float(pagedkv::BFloat16{bits})
                                  : pagedkv::to_float(pagedkv::Half{bits});
    }
  }
  return out;
}

absl::StatusOr<ModelConfig> read_llama_config(absl::string_view config_json) {
  const Json j = Json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  const auto refuse = [](absl::string_view field, const Json& value, absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: ", field, " is ", value.dump(), ": ", why));
  };
  const std::string model_type = j.value("model_type", "");
  if (model_type != "llama") {
    return refuse("model_type", j.value("model_type", Json()), "the decode loop reads llama");
  }
  ModelConfig c;  // kLlama, every layer full attention
  // An integer field, required unless it has a default.
  const auto integer = [&](const char* field, std::optional<int64_t> fallback,
                           int32_t* out) -> absl::Status {
    if (!j.contains(field) || j[field].is_null()) {
      if (!fallback) return absl::InvalidArgumentError(absl::StrCat("config.json: no ", field));
      *out = static_cast<int32_t>(*fallback);
      return absl::OkStatus();
    }
    if (!j[field].is_number_integer() || j[field].get<int64_t>() <= 0 ||
        j[field].get<int64_t>() > (int64_t{1} << 24)) {
      return refuse(field, j[field], "a positive integer up to 2^24 is needed");
    }
    *out = j[field].get<int32_t>();
    return absl::OkStatus();
  };
  for (const auto& [field, out] : {std::pair<const char*, int32_t*>{"vocab_size", &c.vocab_size},
                                   {"hidden_size", &c.d_model},
                                   {"num_hidden_layers", &c.num_layers},
                                   {"num_attention_heads", &c.num_q_heads},
                                   {"intermediate_size", &c.ffn_dim}}) {
    if (absl::Status s = integer(field, std::nullopt, out); !s.ok()) return s;
  }
  if (absl::Status s = integer("num_key_value_heads", c.num_q_heads, &c.num_kv_heads); !s.ok()) {
    return s;
  }
  if (absl::Status s = integer("head_dim", c.d_model / c.num_q_heads, &c.head_dim); !s.ok()) {
    return s;
  }
  // transformers 5 writes rope_parameters, earlier versions rope_theta and rope_scaling.
  const Json rope = j.value("rope_parameters", Json::object());
  const Json theta =
      rope.contains("rope_theta") ? rope["rope_theta"] : j.value("rope_theta", Json(10000.0));
  if (!theta.is_number() || theta.get<double>() <= 1) {
    return refuse("rope_theta", theta, "a number above 1 is needed");
  }
  c.rope_theta = theta.get<float>();
  if (const std::string type = rope.value("rope_type", "default"); type != "default") {
    return refuse("rope_parameters.rope_type", rope["rope_type"], "only default RoPE");
  }
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    return refuse("rope_scaling", j["rope_scaling"], "only default RoPE");
  }
  const Json eps = j.value("rms_norm_eps", Json(1e-6));
  if (!eps.is_number() || eps.get<double>() <= 0 || eps.get<double>() > 1) {
    return refuse("rms_norm_eps", eps, "a number in (0, 1] is needed");
  }
  c.rms_eps = eps.get<float>();
  if (const std::string act = j.value("hidden_act", "silu"); act != "silu") {
    return refuse("hidden_act", j["hidden_act"], "the model's MLP is SwiGLU (silu)");
  }
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    if (j.value(bias, false)) return refuse(bias, j[bias], "the model has no biases");
  }
  if (absl::Status s = validate(c); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", s.message()));
  }
  return c;
}

absl::StatusOr<Model> load_llama_checkpoint(const std::string& dir) {
  const std::string config_path = dir + "/config.json";
  std::ifstream config_file(config_path);
  if (!config_file) return absl::NotFoundError(absl::StrCat(config_path, ": cannot read"));
  std::stringstream text;
  text << config_file.rdbuf();
  absl::StatusOr<ModelConfig> config = read_llama_config(text.str());
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/", config.status().message()));
  }
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::open(dir + "/model.safetensors");
  if (!file.ok()) return file.status();
  const ModelConfig& c = *config;
  const int64_t d = c.d_model;
  Model::Weights w;
  absl::Status status;
  const auto read = [&](const std::string& name, std::initializer_list<int64_t> shape) {
    if (!status.ok()) return std::vector<float>();
    absl::StatusOr<std::vector<float>> t = (*file)->read(name, shape);
    if (!t.ok()) {
      status = t.status();
      return std::vector<float>();
    }
    return *std::move(t);
  };
  w.embedding = read("model.embed_tokens.weight", {c.vocab_size, d});
  w.final_norm = read("model.norm.weight", {d});
  // Tied embeddings: the output projection is the embedding (no lm_head tensor).
  const bool tied = (*file)->find("lm_head.weight") == nullptr;
  w.w_out = tied ? w.embedding : read("lm_head.weight", {c.vocab_size, d});
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    w.layers.push_back({.attn_norm = read(p + "input_layernorm.weight", {d}),
                        .wq = read(p + "self_attn.q_proj.weight", {c.q_dim(), d}),
                        .wk = read(p + "self_attn.k_proj.weight", {c.kv_dim(), d}),
                        .wv = read(p + "self_attn.v_proj.weight", {c.kv_dim(), d}),
                        .wo = read(p + "self_attn.o_proj.weight", {d, c.attn_out_dim()}),
                        .mlp_norm = read(p + "post_attention_layernorm.weight", {d}),
                        .w1 = read(p + "mlp.gate_proj.weight", {c.ffn_dim, d}),
                        .w3 = read(p + "mlp.up_proj.weight", {c.ffn_dim, d}),
                        .w2 = read(p + "mlp.down_proj.weight", {d, c.ffn_dim})});
  }
  if (!status.ok()) return status;
  return Model::with_weights(c, std::move(w));
}

}  // namespace decode_loop
