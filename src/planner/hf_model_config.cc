// Hugging Face config.json -> KvCacheConfig: which layers are full, sliding window, chunked
// local or state (Mamba2, Gated DeltaNet), and their KV shape or state size, read as transformers'
// config classes and vLLM's model code read the same fields.
#include "pagedkv/hf_model_config.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace pagedkv {
namespace {

using Json = nlohmann::json;

// Fields of layer kinds whose state the planner does not size (Mamba1, KV shared across
// layers, per-kind head shapes): refused by name rather than silently sized as attention.
constexpr const char* kUnsupportedFields[] = {
    "layers_block_type",     // Jamba: Mamba1 layers
    "attn_layer_period",     // Jamba
    "num_kv_shared_layers",  // Gemma 3n: layers reusing another layer's KV
    "global_head_dim",       // Gemma 4: full layers with another head shape
    "index_topk",            // DeepSeek-V3.2: the sparse-attention indexer's own cache
};

// The object the attention fields live in: "text_config" of a multimodal config, else the
// root; `prefix` names it in messages.
struct Scope {
  const Json* object;
  std::string prefix;  // "" or "text_config."
};

std::string excerpt(const Json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

absl::Status field_error(const Scope& scope, absl::string_view name, const Json& value,
                         absl::string_view requirement) {
  return absl::InvalidArgumentError(
      absl::StrCat("config.json: ", scope.prefix, name, " is ", excerpt(value), ", ", requirement));
}

// The field, or nullptr when absent or null (transformers treats both as "not set").
const Json* find(const Scope& scope, absl::string_view name) {
  auto it = scope.object->find(std::string(name));
  if (it == scope.object->end() || it->is_null()) return nullptr;
  return &*it;
}

// An integer field in [min, 2^31 - 1], or nullopt when absent or null.
absl::StatusOr<std::optional<int64_t>> get_int(const Scope& scope, absl::string_view name,
                                               int64_t min = 1) {
  const Json* value = find(scope, name);
  if (value == nullptr) return std::optional<int64_t>();
  if (!value->is_number_integer()) return field_error(scope, name, *value, "must be an integer");
  const int64_t v = value->get<int64_t>();
  if (v < min || v > INT32_MAX) {
    return field_error(scope, name, *value,
                       absl::StrCat("must be in [", min, ", ", INT32_MAX, "]"));
  }
  return std::optional<int64_t>(v);
}

absl::StatusOr<int64_t> require_int(const Scope& scope, absl::string_view name) {
  PAGEDKV_ASSIGN_OR_RETURN(std::optional<int64_t> v, get_int(scope, name));
  if (!v) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: ", scope.prefix, name, " is missing; the planner needs it"));
  }
  return *v;
}

absl::StatusOr<std::optional<bool>> get_bool(const Scope& scope, absl::string_view name) {
  const Json* value = find(scope, name);
  if (value == nullptr) return std::optional<bool>();
  if (!value->is_boolean()) return field_error(scope, name, *value, "must be true or false");
  return std::optional<bool>(value->get<bool>());
}

// torch_dtype names (and the newer "dtype" field's) of the dtypes a KV cache is kept in.
std::optional<DType> torch_dtype(absl::string_view name) {
  if (name == "bfloat16") return DType::kBFloat16;
  if (name == "float16" || name == "half") return DType::kFloat16;
  if (name == "float32" || name == "float") return DType::kFloat32;
  if (name == "float8_e4m3fn") return DType::kFloat8E4M3;
  return std::nullopt;
}

// The model's dtype from torch_dtype or dtype (transformers renamed the field), in the text
// config or the root. Two that disagree are an error naming both.
absl::StatusOr<std::optional<DType>> config_dtype(const Scope& text, const Scope& root) {
  std::optional<DType> found;
  std::string found_at;
  for (const Scope* scope : {&text, &root}) {
    for (const char* name : {"torch_dtype", "dtype"}) {
      const Json* value = find(*scope, name);
      if (value == nullptr) continue;
      if (!value->is_string()) return field_error(*scope, name, *value, "must be a string");
      std::optional<DType> dtype = torch_dtype(value->get<std::string>());
      if (!dtype) {
        return field_error(*scope, name, *value,
                           "must be bfloat16, float16, float32 or float8_e4m3fn (or pass a KV "
                           "dtype: --kv-dtype)");
      }
      const std::string at = absl::StrCat(scope->prefix, name);
      if (found && *found != *dtype) {
        return absl::InvalidArgumentError(
            absl::StrCat("config.json: ", found_at, " and ", at, " name different dtypes (",
                         kv_dtype_name(*found), " and ", kv_dtype_name(*dtype), ")"));
      }
      if (!found) found_at = at;
      found = dtype;
    }
    if (text.object == root.object) break;
  }
  return found;
}

struct LayerKind {
  AttentionKind kind = AttentionKind::kFull;
  int32_t window = 0;
  bool cached = true;  // false: an MLP or MoE layer, no KV and no state
  bool operator==(const LayerKind&) const = default;
};

constexpr LayerKind kStateLayer{.kind = AttentionKind::kState};
constexpr LayerKind kNoCacheLayer{.cached = false};

// Nemotron-H: one character per layer, M Mamba2, * attention, - MLP, E MoE.
absl::StatusOr<std::vector<LayerKind>> pattern_kinds(const Scope& text, const Json& pattern,
                                                     int64_t layers) {
  if (!pattern.is_string()) {
    return field_error(text, "hybrid_override_pattern", pattern, "must be a string");
  }
  const std::string p = pattern.get<std::string>();
  if (static_cast<int64_t>(p.size()) != layers) {
    return field_error(
        text, "hybrid_override_pattern", pattern,
        absl::StrCat("has ", p.size(), " characters but num_hidden_layers is ", layers));
  }
  std::vector<LayerKind> kinds(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    switch (p[i]) {
      case 'M':
        kinds[i] = kStateLayer;
        break;
      case '*':
        kinds[i] = {};
        break;
      case '-':
      case 'E':
        kinds[i] = kNoCacheLayer;
        break;
      default:
        return field_error(text, absl::StrCat("hybrid_override_pattern[", i, "]"),
                           Json(std::string(1, p[i])),
                           "is not M (Mamba2), * (attention), - (MLP) or E (MoE)");
    }
  }
  return kinds;
}

// Llama 4: layers that use RoPE are chunked local, the NoPE layers full attention. vLLM's
// Llama4Attention: nope = no_rope_layers[i] == 0, chunked iff not nope. transformers fills
// an empty no_rope_layers with int((i + 1) % no_rope_layer_interval != 0), interval 4.
absl::StatusOr<std::vector<bool>> rope_layers(const Scope& text, int64_t layers,
                                              std::vector<std::string>* notes) {
  std::vector<bool> rope(static_cast<size_t>(layers));
  const Json* list = find(text, "no_rope_layers");
  if (list != nullptr && !list->is_array()) {
    return field_error(text, "no_rope_layers", *list, "must be a list of 0 and 1");
  }
  if (list != nullptr && !list->empty()) {
    if (static_cast<int64_t>(list->size()) != layers) {
      return field_error(
          text, "no_rope_layers", *list,
          absl::StrCat("has ", list->size(), " entries but num_hidden_layers is ", layers));
    }
    for (size_t i = 0; i < list->size(); ++i) {
      const Json& v = (*list)[i];
      if (!v.is_number_integer() || (v.get<int64_t>() != 0 && v.get<int64_t>() != 1)) {
        return field_error(text, absl::StrCat("no_rope_layers[", i, "]"), v, "must be 0 or 1");
      }
      rope[i] = v.get<int64_t>() == 1;
    }
    return rope;
  }
  PAGEDKV_ASSIGN_OR_RETURN(std::optional<int64_t> interval,
                           get_int(text, "no_rope_layer_interval"));
  const int64_t every = interval.value_or(4);
  notes->push_back(absl::StrCat("no_rope_layers ", list == nullptr ? "absent" : "empty", ": every ",
                                every,
                                "th layer is NoPE (full attention), as transformers' "
                                "Llama4TextConfig fills it",
                                interval ? "" : " (no_rope_layer_interval default 4)"));
  for (int64_t i = 0; i < layers; ++i) rope[static_cast<size_t>(i)] = (i + 1) % every != 0;
  return rope;
}

// Gemma 2/3: every pattern-th layer (1-based) is full attention, the others slide.
std::vector<LayerKind> pattern_layers(int64_t layers, int64_t pattern, int32_t window) {
  std::vector<LayerKind> kinds(static_cast<size_t>(layers));
  for (int64_t i = 0; i < layers; ++i) {
    if ((i + 1) % pattern != 0)
      kinds[static_cast<size_t>(i)] = {AttentionKind::kSlidingWindow, window};
  }
  return kinds;
}

// The attention kind of every layer, from whichever fields the config uses.
absl::StatusOr<std::vector<LayerKind>> layer_kinds(const Scope& text, const std::string& model_type,
                                                   int64_t layers,
                                                   std::vector<std::string>* notes) {
  PAGEDKV_ASSIGN_OR_RETURN(std::optional<int64_t> sliding_window, get_int(text, "sliding_window"));
  PAGEDKV_ASSIGN_OR_RETURN(std::optional<int64_t> chunk, get_int(text, "attention_chunk_size"));
  PAGEDKV_ASSIGN_OR_RETURN(std::optional<bool> use_sliding, get_bool(text, "use_sliding_window"));
  PAGEDKV_ASSIGN_OR_RETURN(std::optional<int64_t> pattern, get_int(text, "sliding_window_pattern"));
  const bool gemma3 = model_type == "gemma3_text" || model_type == "gemma3";
  const bool gemma2 = model_type == "gemma2";
  if (gemma3 && !sliding_window) {
    sliding_window = 4096;
    notes->push_back("sliding_window absent: gemma3_text default 4096");
  }
  if (sliding_window && use_sliding.has_value() && !*use_sliding) {
    notes->push_back(
        absl::StrCat("sliding_window ", *sliding_window, " not used: use_sliding_window is false"));
    sliding_window.reset();
  }
  if (sliding_window && chunk) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: ", text.prefix, "sliding_window (", *sliding_window, ") and ", text.prefix,
        "attention_chunk_size (", *chunk, ") are both set; a model has one kind of local layer"));
  }
  const int32_t window = static_cast<int32_t>(sliding_window.value_or(0));
  std::vector<LayerKind> kinds(static_cast<size_t>(layers));
  if (const Json* pattern = find(text, "hybrid_override_pattern"); pattern != nullptr) {
    return pattern_kinds(text, *pattern, layers);
  }

  if (const Json* types = find(text, "layer_types"); types != nullptr) {
    if (!types->is_array()) return field_error(text, "layer_types", *types, "must be a list");
    if (static_cast<int64_t>(types->size()) != layers) {
      return field_error(
          text, "layer_types", *types,
          absl::StrCat("has ", types->size(), " entries but num_hidden_layers is ", layers));
    }
    for (size_t i = 0; i < types->size(); ++i) {
      const Json& t = (*types)[i];
      const std::string name = t.is_string() ? t.get<std::string>() : "";
      const std::string field = absl::StrCat("layer_types[", i, "]");
      if (name == "full_attention") {
        kinds[i] = {};
      } else if (name == "sliding_attention") {
        if (!sliding_window) {
          return field_error(text, field, t,
                             use_sliding.has_value() && !*use_sliding
                                 ? "but use_sliding_window is false"
                                 : "but sliding_window is not set");
        }
        kinds[i] = {AttentionKind::kSlidingWindow, window};
      } else if (name == "chunked_attention") {
        if (!chunk) return field_error(text, field, t, "but attention_chunk_size is not set");
        kinds[i] = {AttentionKind::kChunkedLocal, static_cast<int32_t>(*chunk)};
      } else if (name == "attention") {  // granitemoehybrid
        kinds[i] = {};
      } else if (name == "linear_attention" || name == "mamba") {  // qwen3_next, granite
        kinds[i] = kStateLayer;
      } else {
        return field_error(text, field, t,
                           "a layer kind the planner does not size (it sizes full_attention, "
                           "attention, sliding_attention, chunked_attention, linear_attention "
                           "and mamba)");
      }
    }
    // Older fields that say the same must agree with it.
    if (pattern && sliding_window && pattern_layers(layers, *pattern, window) != kinds) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.json: ", text.prefix, "layer_types and ", text.prefix, "sliding_window_pattern (",
          *pattern, ") disagree on which layers are full attention"));
    }
    if (const Json* nope = find(text, "no_rope_layers"); nope != nullptr && chunk) {
      std::vector<std::string> ignored;
      PAGEDKV_ASSIGN_OR_RETURN(std::vector<bool> rope, rope_layers(text, layers, &ignored));
      for (int64_t i = 0; i < layers; ++i) {
        const bool chunked = kinds[static_cast<size_t>(i)].kind == AttentionKind::kChunkedLocal;
        if (!nope->empty() && chunked != rope[static_cast<size_t>(i)]) {
          return absl::InvalidArgumentError(absl::StrCat(
              "config.json: ", text.prefix, "layer_types[", i, "] is ",
              chunked ? "chunked_attention" : "not chunked_attention", " but ", text.prefix,
              "no_rope_layers[", i, "] is ", rope[static_cast<size_t>(i)] ? 1 : 0,
              " (chunked layers are the RoPE layers, 1)"));
        }
      }
    }
    return kinds;
  }

  if (model_type == "qwen3_next") {
    // transformers' Qwen3NextConfig: layer i is full attention iff (i + 1) % interval == 0,
    // the others Gated DeltaNet.
    PAGEDKV_ASSIGN_OR_RETURN(std::optional<int64_t> interval,
                             get_int(text, "full_attention_interval"));
    if (!interval) notes->push_back("full_attention_interval absent: qwen3_next default 4");
    for (int64_t i = 0; i < layers; ++i) {
      kinds[static_cast<size_t>(i)] =
          (i + 1) % interval.value_or(4) == 0 ? LayerKind{} : kStateLayer;
    }
    return kinds;
  }
  if (chunk) {
    PAGEDKV_ASSIGN_OR_RETURN(std::vector<bool> rope, rope_layers(text, layers, notes));
    for (int64_t i = 0; i < layers; ++i) {
      if (rope[static_cast<size_t>(i)]) {
        kinds[static_cast<size_t>(i)] = {AttentionKind::kChunkedLocal,
                                         static_cast<int32_t>(*chunk)};
      }
    }
    return kinds;
  }
  if (!sliding_window) return kinds;  // every layer full attention
  if (pattern || gemma3 || gemma2) {
    const int64_t every = pattern.value_or(gemma3 ? 6 : 2);
    if (!pattern) {
      notes->push_back(absl::StrCat("sliding_window_pattern absent: ", model_type, " default ",
                                    every, " (every ", every, "th layer full attention)"));
    }
    return pattern_layers(layers, every, window);
  }
  PAGEDKV_ASSIGN_OR_RETURN(std::optional<int64_t> max_window_layers,
                           get_int(text, "max_window_layers", 0));
  if (use_sliding.value_or(false) && max_window_layers) {
    // transformers' Qwen2/Qwen3 configs: layers from max_window_layers on slide.
    for (int64_t i = *max_window_layers; i < layers; ++i) {
      kinds[static_cast<size_t>(i)] = {AttentionKind::kSlidingWindow, window};
    }
    return kinds;
  }
  for (LayerKind& k : kinds) k = {AttentionKind::kSlidingWindow, window};  // Mistral
  return kinds;
}

// Per-layer state elements in vLLM's MambaStateShapeCalculator; its dtypes are set by the
// caller. Products in 128 bits: a count beyond 2^36 is refused by name.
absl::StatusOr<StateShape> state_elements(const Scope& text, const std::string& model_type,
                                          std::vector<std::string>* notes) {
  auto count = [&](__int128 v, const char* what) -> absl::StatusOr<int64_t> {
    if (v > (__int128{1} << 36)) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: ", text.prefix, model_type, "'s ", what, " state has ",
                       static_cast<double>(v), " elements per layer, more than 2^36"));
    }
    return static_cast<int64_t>(v);
  };
  StateShape state;
  if (find(text, "linear_num_value_heads") != nullptr || model_type == "qwen3_next") {
    // Gated DeltaNet: conv (kernel - 1) x (2 x k_heads x k_dim + v_heads x v_dim), recurrent
    // v_heads x k_dim x v_dim (gated_delta_net_state_shape).
    PAGEDKV_ASSIGN_OR_RETURN(const int64_t kh, require_int(text, "linear_num_key_heads"));
    PAGEDKV_ASSIGN_OR_RETURN(const int64_t kd, require_int(text, "linear_key_head_dim"));
    PAGEDKV_ASSIGN_OR_RETURN(const int64_t vh, require_int(text, "linear_num_value_heads"));
    PAGEDKV_ASSIGN_OR_RETURN(const int64_t vd, require_int(text, "linear_value_head_dim"));
    PAGEDKV_ASSIGN_OR_RETURN(const int64_t k, require_int(text, "linear_conv_kernel_dim"));
    PAGEDKV_ASSIGN_OR_RETURN(
        state.conv_elements,
        count(__int128{k - 1} * (__int128{2} * kh * kd + __int128{vh} * vd), "conv"));
    PAGEDKV_ASSIGN_OR_RETURN(state.recurrent_elements, count(__int128{vh} * kd * vd, "recurrent"));
    notes->push_back(absl::StrCat("Gated DeltaNet state per layer: conv ", k - 1, " x (2 x ", kh,
                                  " x ", kd, " + ", vh, " x ", vd, "), recurrent ", vh, " x ", kd,
                                  " x ", vd, " elements"));
    return state;
  }
  // Mamba2: conv (kernel - 1) x (intermediate + 2 x n_groups x state_size), recurrent
  // heads x head_dim x state_size (mamba2_state_shape); the intermediate size as vLLM's
  // model classes pass it.
  int64_t heads = 0, head_dim = 0, state_size = 0, groups = 0, kernel = 0;
  __int128 intermediate = 0;
  if (model_type == "nemotron_h") {
    PAGEDKV_ASSIGN_OR_RETURN(heads, require_int(text, "mamba_num_heads"));
    PAGEDKV_ASSIGN_OR_RETURN(head_dim, require_int(text, "mamba_head_dim"));
    PAGEDKV_ASSIGN_OR_RETURN(state_size, require_int(text, "ssm_state_size"));
    PAGEDKV_ASSIGN_OR_RETURN(groups, require_int(text, "n_groups"));
    PAGEDKV_ASSIGN_OR_RETURN(kernel, require_int(text, "conv_kernel"));
    intermediate = __int128{heads} * head_dim;  // NemotronH: mamba_num_heads x mamba_head_dim
  } else if (model_type == "granitemoehybrid") {
    PAGEDKV_ASSIGN_OR_RETURN(heads, require_int(text, "mamba_n_heads"));
    PAGEDKV_ASSIGN_OR_RETURN(head_dim, require_int(text, "mamba_d_head"));
    PAGEDKV_ASSIGN_OR_RETURN(state_size, require_int(text, "mamba_d_state"));
    PAGEDKV_ASSIGN_OR_RETURN(groups, require_int(text, "mamba_n_groups"));
    PAGEDKV_ASSIGN_OR_RETURN(kernel, require_int(text, "mamba_d_conv"));
    PAGEDKV_ASSIGN_OR_RETURN(const int64_t expand, require_int(text, "mamba_expand"));
    PAGEDKV_ASSIGN_OR_RETURN(const int64_t hidden, require_int(text, "hidden_size"));
    intermediate = __int128{expand} * hidden;  // GraniteMoeHybrid: mamba_expand x hidden_size
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: model_type '", model_type,
        "' has state layers the planner does not size (it sizes qwen3_next's Gated DeltaNet "
        "and nemotron_h's and granitemoehybrid's Mamba2)"));
  }
  PAGEDKV_ASSIGN_OR_RETURN(
      state.conv_elements,
      count(__int128{kernel - 1} * (intermediate + __int128{2} * groups * state_size), "conv"));
  PAGEDKV_ASSIGN_OR_RETURN(state.recurrent_elements,
                           count(__int128{heads} * head_dim * state_size, "recurrent"));
  notes->push_back(absl::StrCat("Mamba2 state per layer: conv ", kernel - 1, " x (",
                                static_cast<int64_t>(intermediate), " + 2 x ", groups, " x ",
                                state_size, "), recurrent ", heads, " x ", head_dim, " x ",
                                state_size, " elements"));
  return state;
}

// The state dtypes vLLM takes by default (mamba_utils.py's MambaStateDtypeCalculator):
// conv in mamba_cache_dtype, "auto" the model's dtype; Mamba2's recurrent state in
// mamba_ssm_cache_dtype, "auto" the conv dtype, except Nemotron-H's (vLLM's
// NemotronHForCausalLMConfig: the config's mamba_ssm_cache_dtype, else float32); Gated
// DeltaNet's recurrent state in the conv dtype.
absl::Status state_dtypes(const Scope& text, const std::string& model_type, DType model_dtype,
                          const HfConfigOptions& options, StateShape* state,
                          std::vector<std::string>* notes) {
  state->conv_dtype = options.state_dtype.value_or(model_dtype);
  std::string why = options.state_dtype ? "given" : "vLLM's mamba_cache_dtype auto: the model's";
  state->recurrent_dtype = state->conv_dtype;
  std::string recurrent_why = "the conv state's";
  const bool gated_delta_net = find(text, "linear_num_value_heads") != nullptr;
  if (options.recurrent_dtype) {
    state->recurrent_dtype = *options.recurrent_dtype;
    recurrent_why = "given";
  } else if (model_type == "nemotron_h" && !gated_delta_net) {
    state->recurrent_dtype = DType::kFloat32;
    recurrent_why = "vLLM's NemotronH default float32";
    if (const Json* v = find(text, "mamba_ssm_cache_dtype"); v != nullptr) {
      std::optional<DType> d = v->is_string() ? torch_dtype(v->get<std::string>()) : std::nullopt;
      if (!d) {
        return field_error(text, "mamba_ssm_cache_dtype", *v,
                           "must be bfloat16, float16 or float32");
      }
      state->recurrent_dtype = *d;
      recurrent_why = "the config's mamba_ssm_cache_dtype";
    }
  }
  notes->push_back(absl::StrCat("state dtypes: conv ", kv_dtype_name(state->conv_dtype), " (", why,
                                "), recurrent ", kv_dtype_name(state->recurrent_dtype), " (",
                                recurrent_why, ")"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DType> parse_kv_dtype(std::string_view name) {
  if (name == "bf16" || name == "bfloat16") return DType::kBFloat16;
  if (name == "fp16" || name == "float16" || name == "half") return DType::kFloat16;
  if (name == "fp32" || name == "float32" || name == "float") return DType::kFloat32;
  if (name == "fp8" || name == "fp8_e4m3") return DType::kFloat8E4M3;
  return absl::InvalidArgumentError(absl::StrCat("KV dtype '",
                                                 absl::string_view(name.data(), name.size()),
                                                 "' is not one of bf16, fp16, fp32, fp8"));
}

const char* kv_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat16:
      return "fp16";
    case DType::kFloat32:
      return "fp32";
    case DType::kFloat8E4M3:
      return "fp8";
  }
  return "unknown";
}

absl::StatusOr<HfModelConfig> parse_hf_config(std::string_view json_text,
                                              const HfConfigOptions& options) {
  Json root;
  try {
    root = Json::parse(json_text.begin(), json_text.end());
  } catch (const Json::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat("config.json is not JSON: ", e.what()));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json is ", excerpt(root), ", not a JSON object"));
  }
  const Scope root_scope{&root, ""};
  Scope text = root_scope;
  if (const Json* nested = find(root_scope, "text_config"); nested != nullptr) {
    if (!nested->is_object())
      return field_error(root_scope, "text_config", *nested, "must be an object");
    text = Scope{nested, "text_config."};
  }
  HfModelConfig model;
  for (const Scope* scope : {static_cast<const Scope*>(&text), &root_scope}) {
    if (const Json* type = find(*scope, "model_type"); type != nullptr && type->is_string()) {
      model.model_type = type->get<std::string>();
      break;
    }
  }
  // A multimodal root without the text config's own model_type names the text model's.
  if (model.model_type == "gemma3" && text.object != &root) model.model_type = "gemma3_text";
  if (model.model_type == "llama4" && text.object != &root) model.model_type = "llama4_text";

  for (const char* name : kUnsupportedFields) {
    if (const Json* value = find(text, name); value != nullptr) {
      return field_error(text, name, *value,
                         "a layer structure the planner does not size (it sizes full, sliding "
                         "window, chunked local and MLA attention KV, and Mamba2 and Gated "
                         "DeltaNet state)");
    }
  }

  PAGEDKV_ASSIGN_OR_RETURN(const int64_t layers, require_int(text, "num_hidden_layers"));
  PAGEDKV_ASSIGN_OR_RETURN(const int64_t heads, require_int(text, "num_attention_heads"));
  PAGEDKV_ASSIGN_OR_RETURN(std::optional<int64_t> kv_heads, get_int(text, "num_key_value_heads"));
  if (kv_heads && (*kv_heads > heads || heads % *kv_heads != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: ", text.prefix, "num_key_value_heads (", *kv_heads,
                     ") must divide ", text.prefix, "num_attention_heads (", heads, ")"));
  }
  KvCacheSpec shape{.num_layers = 1,
                    .num_kv_heads = static_cast<int32_t>(kv_heads.value_or(heads))};
  PAGEDKV_ASSIGN_OR_RETURN(std::optional<int64_t> kv_lora_rank, get_int(text, "kv_lora_rank"));
  if (kv_lora_rank) {
    // MLA: K and V of every head are computed from one cached latent vector of
    // kv_lora_rank elements plus the decoupled RoPE key of qk_rope_head_dim.
    PAGEDKV_ASSIGN_OR_RETURN(const int64_t rope_dim, require_int(text, "qk_rope_head_dim"));
    shape.num_kv_heads = 1;
    shape.head_dim = static_cast<int32_t>(*kv_lora_rank + rope_dim);
    shape.latent = true;
    model.notes.push_back(absl::StrCat("MLA: one latent vector of kv_lora_rank ", *kv_lora_rank,
                                       " + qk_rope_head_dim ", rope_dim,
                                       " elements per token per layer (num_key_value_heads ",
                                       kv_heads.value_or(heads), " is not the cached shape)"));
  } else {
    PAGEDKV_ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, get_int(text, "head_dim"));
    if (!head_dim) {  // Nemotron-H names it attention_head_dim
      PAGEDKV_ASSIGN_OR_RETURN(head_dim, get_int(text, "attention_head_dim"));
    }
    if (!head_dim) {
      PAGEDKV_ASSIGN_OR_RETURN(std::optional<int64_t> hidden, get_int(text, "hidden_size"));
      if (!hidden) {
        return absl::InvalidArgumentError(absl::StrCat("config.json: ", text.prefix,
                                                       "head_dim and ", text.prefix,
                                                       "hidden_size are both missing"));
      }
      if (*hidden % heads != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "config.json: ", text.prefix, "head_dim is missing and ", text.prefix, "hidden_size (",
            *hidden, ") is not a multiple of num_attention_heads (", heads, ")"));
      }
      head_dim = *hidden / heads;
    }
    shape.head_dim = static_cast<int32_t>(*head_dim);
  }
  if (const Json* mtp = find(text, "num_nextn_predict_layers");
      mtp != nullptr && mtp->is_number_integer() && mtp->get<int64_t>() > 0) {
    model.notes.push_back(absl::StrCat("num_nextn_predict_layers ", mtp->get<int64_t>(),
                                       ": the multi-token-prediction layer's KV is not counted "
                                       "(it is a draft model's, sized with speculative decoding)"));
  }

  PAGEDKV_ASSIGN_OR_RETURN(std::optional<DType> dtype, config_dtype(text, root_scope));
  const std::optional<DType> model_dtype = dtype;
  if (options.kv_dtype) {
    dtype = options.kv_dtype;
  } else if (!dtype) {
    return absl::InvalidArgumentError(
        "config.json names no torch_dtype or dtype; pass the KV dtype (--kv-dtype)");
  }

  PAGEDKV_ASSIGN_OR_RETURN(std::optional<int64_t> max_pos,
                           get_int(text, "max_position_embeddings"));
  if (!max_pos && model.model_type == "gemma3_text") {
    max_pos = 131072;
    model.notes.push_back("max_position_embeddings absent: gemma3_text default 131072");
  }
  model.max_position_embeddings = max_pos.value_or(0);

  PAGEDKV_ASSIGN_OR_RETURN(std::vector<LayerKind> kinds,
                           layer_kinds(text, model.model_type, layers, &model.notes));
  model.kv.dtype = *dtype;
  model.kv.block_size = options.block_size;
  StateShape state;
  if (std::find(kinds.begin(), kinds.end(), kStateLayer) != kinds.end()) {
    PAGEDKV_ASSIGN_OR_RETURN(state, state_elements(text, model.model_type, &model.notes));
    // vLLM's "auto" is the model's dtype; a config that names none falls back to the KV's.
    PAGEDKV_RETURN_IF_ERROR(state_dtypes(text, model.model_type, model_dtype.value_or(*dtype),
                                         options, &state, &model.notes));
  }
  std::vector<LayerKind> group_kinds;
  for (const LayerKind& k : kinds) {
    if (!k.cached) {
      model.layer_group.push_back(-1);
      continue;
    }
    size_t g = 0;
    while (g < group_kinds.size() && !(group_kinds[g] == k)) ++g;
    if (g == group_kinds.size()) {
      group_kinds.push_back(k);
      KvCacheSpec group_shape = shape;
      group_shape.num_layers = 0;
      StateShape group_state = state;
      group_state.num_layers = 0;
      model.kv.groups.push_back(
          {.kind = k.kind, .window = k.window, .shape = group_shape, .state = group_state});
    }
    KvCacheGroup& group = model.kv.groups[g];
    ++(k.kind == AttentionKind::kState ? group.state.num_layers : group.shape.num_layers);
    model.layer_group.push_back(static_cast<int32_t>(g));
  }
  PAGEDKV_RETURN_IF_ERROR(model.kv.validate());
  return model;
}

absl::StatusOr<HfModelConfig> read_hf_config(const std::string& path,
                                             const HfConfigOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open config ", path));
  std::ostringstream text;
  text << in.rdbuf();
  absl::StatusOr<HfModelConfig> model = parse_hf_config(text.str(), options);
  if (!model.ok()) {
    return absl::Status(model.status().code(), absl::StrCat(path, ": ", model.status().message()));
  }
  return model;
}

}  // namespace pagedkv
