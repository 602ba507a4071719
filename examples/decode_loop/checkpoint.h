// File: examples/decode_loop/checkpoint.h
//
// A Hugging Face Llama checkpoint as the decode loop's model (--checkpoint DIR): the
// architecture from DIR/config.json, the weights from DIR/model.safetensors (F32, BF16 or
// F16 tensors, mapped with mmap and converted to fp32). model.h's layout is Llama's and
// stores each matrix [out, in] as torch.nn.Linear does, so every tensor is taken as it is.
//
// safetensors: an 8-byte little-endian header length N, N bytes of JSON naming each
// tensor's dtype, shape and [begin, end) byte offsets after the header, then the data.
#ifndef PAGEDKV_EXAMPLES_DECODE_LOOP_CHECKPOINT_H_
#define PAGEDKV_EXAMPLES_DECODE_LOOP_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "model.h"

namespace decode_loop {

// A safetensors file, mapped read-only for the object's life.
class SafetensorsFile {
 public:
  struct Tensor {
    std::string dtype;  // "F32", "BF16", "F16", ...
    std::vector<int64_t> shape;
    std::span<const std::byte> bytes;
  };

  // Errors: NotFound for a missing file, InvalidArgument for a malformed one (a header
  // past the end, a tensor whose offsets leave the data or disagree with its shape and
  // dtype), each naming the file and what is wrong.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const Tensor* find(absl::string_view name) const;
  // The tensor as fp32, after checking its shape. Errors: NotFound (naming the tensor),
  // InvalidArgument for another shape or an unsupported dtype.
  absl::StatusOr<std::vector<float>> read(absl::string_view name,
                                          std::span<const int64_t> shape) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  absl::flat_hash_map<std::string, Tensor> tensors_;
};

// The model of a config.json: model_type "llama" (full-attention GQA layers, RoPE of the
// default type, SiLU, no biases). Errors: InvalidArgument naming the field and value that
// the decode loop's model does not take.
absl::StatusOr<ModelConfig> read_llama_config(absl::string_view config_json);

// The model of DIR/config.json with DIR/model.safetensors' weights.
absl::StatusOr<Model> load_llama_checkpoint(const std::string& dir);

}  // namespace decode_loop

#endif  // PAGEDKV_EXAMPLES_DECODE_LOOP_CHECKPOINT_H_
