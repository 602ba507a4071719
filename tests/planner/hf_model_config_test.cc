// hf_model_config.h: Hugging Face config.json -> KvCacheConfig, on the ten public
// models (tests/planner/fixtures: the fields the reader takes, each with its SOURCE.md;
// fixtures.h) and on small configs that exercise one field each. Bytes per token are worked out in
// the comments: (latent ? 1 : 2) x layers x KV heads x head_dim x bytes per element.
#include "pagedkv/hf_model_config.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "planner/fixtures.h"
#include "support/skip.h"

namespace pagedkv {
namespace {

// The fixture's model, read from its excerpt (fixtures.h).
std::optional<HfModelConfig> read_fixture(const std::string& name,
                                          const HfConfigOptions& options = {}) {
  absl::StatusOr<HfModelConfig> model = read_hf_config(testing::fixture_excerpt(name), options);
  INFO(model.status().ToString());
  REQUIRE(model.ok());
  return *model;
}

absl::Status parse_error(const std::string& json) { return parse_hf_config(json).status(); }

void expect_invalid(const absl::Status& s, const std::string& fragment) {
  INFO(s.ToString());
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find(fragment) != std::string::npos);
}

// --- the fixtures ----------------------------------------------------------------------

TEST_CASE("Llama-3.1-8B and 70B: one full group, 131,072 and 327,680 bytes per token",
          "[planner]") {
  std::optional<HfModelConfig> m = read_fixture("meta-llama--Llama-3.1-8B");
  CHECK(m->model_type == "llama");
  REQUIRE(m->kv.groups.size() == 1);
  CHECK(m->kv.groups[0].kind == AttentionKind::kFull);
  CHECK(m->kv.groups[0].shape.num_layers == 32);
  CHECK(m->kv.groups[0].shape.num_kv_heads == 8);
  CHECK(m->kv.groups[0].shape.head_dim == 128);  // hidden_size 4,096 / 32 heads
  CHECK(m->kv.dtype == DType::kBFloat16);
  CHECK(m->kv.bytes_per_token() == 131072);  // 2 x 32 x 8 x 128 x 2
  CHECK(m->max_position_embeddings == 131072);
  std::optional<HfModelConfig> fp8 =
      read_fixture("meta-llama--Llama-3.1-8B", {.kv_dtype = DType::kFloat8E4M3});
  REQUIRE(fp8);
  CHECK(fp8->kv.bytes_per_token() == 65536);  // 2 x 32 x 8 x 128 x 1

  m = read_fixture("meta-llama--Llama-3.1-70B");
  REQUIRE(m->kv.groups.size() == 1);
  CHECK(m->kv.groups[0].shape.num_layers == 80);
  CHECK(m->kv.groups[0].shape.head_dim == 128);  // 8,192 / 64
  CHECK(m->kv.bytes_per_token() == 327680);      // 2 x 80 x 8 x 128 x 2
}

TEST_CASE("Qwen3-8B: sliding_window null, every layer full, 147,456 bytes per token", "[planner]") {
  std::optional<HfModelConfig> m = read_fixture("Qwen--Qwen3-8B");
  REQUIRE(m->kv.groups.size() == 1);
  CHECK(m->kv.groups[0].kind == AttentionKind::kFull);
  CHECK(m->kv.groups[0].shape.num_layers == 36);
  CHECK(m->kv.bytes_per_token() == 147456);  // 2 x 36 x 8 x 128 x 2
  CHECK(m->max_position_embeddings == 40960);
}

TEST_CASE("Gemma-3-27B: text_config, 52 sliding window 1,024 + 10 full layers", "[planner]") {
  std::optional<HfModelConfig> m = read_fixture("google--gemma-3-27b-it");
  CHECK(m->model_type == "gemma3_text");
  REQUIRE(m->kv.groups.size() == 2);
  // No sliding_window_pattern: every 6th layer (5, 11, ..., 59) is full: 10 of 62.
  CHECK(m->kv.groups[0].kind == AttentionKind::kSlidingWindow);
  CHECK(m->kv.groups[0].window == 1024);
  CHECK(m->kv.groups[0].shape.num_layers == 52);
  CHECK(m->kv.groups[1].kind == AttentionKind::kFull);
  CHECK(m->kv.groups[1].shape.num_layers == 10);
  CHECK(m->layer_group[4] == 0);
  CHECK(m->layer_group[5] == 1);
  CHECK(m->layer_group[59] == 1);
  CHECK(m->layer_group[61] == 0);
  // head_dim 128 as given (hidden_size 5,376 / 32 would be 168).
  CHECK(m->kv.groups[0].shape.head_dim == 128);
  CHECK(m->kv.groups[0].shape.num_kv_heads == 16);
  CHECK(m->kv.bytes_per_token(0) == 425984);  // 2 x 52 x 16 x 128 x 2
  CHECK(m->kv.bytes_per_token(1) == 81920);   // 2 x 10 x 16 x 128 x 2
  CHECK(m->kv.dtype == DType::kBFloat16);     // the root's torch_dtype
  CHECK(m->max_position_embeddings == 131072);
  CHECK(m->notes.size() == 2);  // both defaults are recorded
}

TEST_CASE("gpt-oss-120b: layer_types, 18 sliding window 128 + 18 full of 8 x 64", "[planner]") {
  // The config names no torch_dtype: the KV dtype must be given.
  expect_invalid(read_hf_config(testing::fixture_excerpt("openai--gpt-oss-120b")).status(),
                 "names no torch_dtype or dtype");
  std::optional<HfModelConfig> m =
      read_fixture("openai--gpt-oss-120b", {.kv_dtype = DType::kBFloat16});
  REQUIRE(m);
  REQUIRE(m->kv.groups.size() == 2);
  CHECK(m->kv.groups[0].kind == AttentionKind::kSlidingWindow);
  CHECK(m->kv.groups[0].window == 128);
  CHECK(m->kv.groups[0].shape.num_layers == 18);
  CHECK(m->kv.groups[1].shape.num_layers == 18);
  CHECK(m->layer_group[0] == 0);
  CHECK(m->layer_group[1] == 1);
  CHECK(m->kv.bytes_per_token(0) == 36864);  // 2 x 18 x 8 x 64 x 2
  CHECK(m->kv.bytes_per_token() == 73728);
}

TEST_CASE("Llama-4-Scout: the RoPE layers are chunked local 8,192, every 4th is full",
          "[planner]") {
  std::optional<HfModelConfig> m = read_fixture("meta-llama--Llama-4-Scout-17B-16E-Instruct");
  CHECK(m->model_type == "llama4_text");
  REQUIRE(m->kv.groups.size() == 2);
  CHECK(m->kv.groups[0].kind == AttentionKind::kChunkedLocal);
  CHECK(m->kv.groups[0].window == 8192);
  CHECK(m->kv.groups[0].shape.num_layers == 36);
  CHECK(m->kv.groups[1].kind == AttentionKind::kFull);
  CHECK(m->kv.groups[1].shape.num_layers == 12);
  CHECK(m->layer_group[3] == 1);  // (3 + 1) % 4 == 0: NoPE, full attention
  CHECK(m->layer_group[47] == 1);
  CHECK(m->layer_group[46] == 0);
  CHECK(m->kv.bytes_per_token(0) == 147456);  // 2 x 36 x 8 x 128 x 2
  CHECK(m->kv.bytes_per_token(1) == 49152);   // 2 x 12 x 8 x 128 x 2
  CHECK(m->max_position_embeddings == 10485760);
}

TEST_CASE("DeepSeek-V3: MLA, one latent of 512 + 64 per layer, 70,272 bytes per token",
          "[planner]") {
  std::optional<HfModelConfig> m = read_fixture("deepseek-ai--DeepSeek-V3");
  REQUIRE(m->kv.groups.size() == 1);
  const KvCacheSpec& shape = m->kv.groups[0].shape;
  CHECK(shape.latent);
  CHECK(shape.num_kv_heads == 1);  // not num_key_value_heads (128)
  CHECK(shape.head_dim == 576);
  CHECK(shape.num_layers == 61);
  CHECK(m->kv.bytes_per_token() == 70272);  // 61 x 576 x 2
  CHECK(m->max_position_embeddings == 163840);
}

// Each excerpt holds every field the reader takes: the upstream file, where it is here,
// reads to the same groups, layers, length and notes.
// --- state layers -----------------------------------------------------------------------------

TEST_CASE("Qwen3-Next-80B: 36 Gated DeltaNet layers of 1,097,728 state bytes, 12 full",
          "[planner]") {
  std::optional<HfModelConfig> m = read_fixture("Qwen--Qwen3-Next-80B-A3B-Instruct");
  CHECK(m->model_type == "qwen3_next");
  REQUIRE(m->kv.groups.size() == 2);
  // Layer 0 is linear attention: the state group comes first.
  const KvCacheGroup& state = m->kv.groups[0];
  CHECK(state.kind == AttentionKind::kState);
  CHECK(state.state.num_layers == 36);  // 48 - 12
  // conv 3 x (2 x 16 x 128 + 32 x 128) = 3 x 8,192 = 24,576; recurrent 32 x 128 x 128.
  CHECK(state.state.conv_elements == 24576);
  CHECK(state.state.recurrent_elements == 524288);
  CHECK(state.state.conv_dtype == DType::kBFloat16);  // vLLM: the model's dtype for both
  CHECK(state.state.recurrent_dtype == DType::kBFloat16);
  CHECK(state.state.bytes_per_layer() == 1097728);  // 2 x (24,576 + 524,288)
  CHECK(m->kv.page_bytes(0) == 39518208);           // a slot: 36 x 1,097,728
  CHECK(m->kv.groups[1].kind == AttentionKind::kFull);
  CHECK(m->kv.groups[1].shape.num_layers == 12);  // layers 3, 7, ..., 47
  CHECK(m->kv.bytes_per_token() == 24576);        // 2 x 12 x 2 x 256 x 2
  CHECK(m->layer_group[2] == 0);
  CHECK(m->layer_group[3] == 1);
  CHECK(m->max_position_embeddings == 262144);
  // The same layers listed in layer_types read alike.
  std::string types;
  for (int i = 0; i < 48; ++i) {
    types += std::string(i ? ", " : "") +
             ((i + 1) % 4 == 0 ? "\"full_attention\"" : "\"linear_attention\"");
  }
  absl::StatusOr<HfModelConfig> listed = parse_hf_config(R"({"model_type": "qwen3_next",
      "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2,
      "head_dim": 256, "torch_dtype": "bfloat16", "linear_conv_kernel_dim": 4,
      "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
      "linear_value_head_dim": 128, "layer_types": [)" + types +
                                                         "]}");
  REQUIRE(listed.ok());
  CHECK(listed->layer_group == m->layer_group);
  CHECK(listed->kv.page_bytes(0) == 39518208);
  // --mamba-cache-dtype fp32 keeps both in fp32: 4 x 548,864 = 2,195,456 bytes per layer.
  m = read_fixture("Qwen--Qwen3-Next-80B-A3B-Instruct", {.state_dtype = DType::kFloat32});
  CHECK(m->kv.groups[0].state.bytes_per_layer() == 2195456);
}

TEST_CASE("Nemotron-H-8B: 24 Mamba2 layers of 4,255,744 state bytes, 4 attention, 24 MLP",
          "[planner]") {
  std::optional<HfModelConfig> m = read_fixture("nvidia--Nemotron-H-8B-Base-8K");
  CHECK(m->model_type == "nemotron_h");
  REQUIRE(m->kv.groups.size() == 2);
  const KvCacheGroup& state = m->kv.groups[0];
  CHECK(state.kind == AttentionKind::kState);
  CHECK(state.state.num_layers == 24);  // the M of the pattern
  // intermediate 128 x 64 = 8,192; conv 3 x (8,192 + 2 x 8 x 128) = 3 x 10,240 = 30,720;
  // recurrent 128 x 64 x 128 = 1,048,576.
  CHECK(state.state.conv_elements == 30720);
  CHECK(state.state.recurrent_elements == 1048576);
  CHECK(state.state.conv_dtype == DType::kBFloat16);
  CHECK(state.state.recurrent_dtype == DType::kFloat32);  // vLLM's NemotronH default
  CHECK(state.state.bytes_per_layer() == 4255744);        // 30,720 x 2 + 1,048,576 x 4
  CHECK(m->kv.page_bytes(0) == 102137856);                // 24 x 4,255,744
  CHECK(m->kv.groups[1].shape.num_layers == 4);           // the * of the pattern
  CHECK(m->kv.groups[1].shape.head_dim == 128);           // attention_head_dim
  CHECK(m->kv.bytes_per_token() == 16384);                // 2 x 4 x 8 x 128 x 2
  CHECK(m->kv.num_layers() == 28);                        // the 24 MLP layers keep nothing
  CHECK(m->layer_group[0] == 0);
  CHECK(m->layer_group[1] == -1);
  CHECK(m->layer_group[7] == 1);
  bool noted = false;
  for (const std::string& note : m->notes) {
    noted = noted ||
            note.find("recurrent fp32 (vLLM's NemotronH default float32)") != std::string::npos;
  }
  CHECK(noted);
  // --mamba-ssm-cache-dtype bf16: 30,720 x 2 + 1,048,576 x 2 = 2,158,592 bytes per layer.
  m = read_fixture("nvidia--Nemotron-H-8B-Base-8K", {.recurrent_dtype = DType::kBFloat16});
  CHECK(m->kv.groups[0].state.bytes_per_layer() == 2158592);
  CHECK(m->kv.page_bytes(0) == 51806208);  // 24 x 2,158,592
}

TEST_CASE("Granite-4.0-H-Tiny: 36 Mamba2 layers of 806,400 state bytes, 4 attention", "[planner]") {
  std::optional<HfModelConfig> m = read_fixture("ibm-granite--granite-4.0-h-tiny");
  CHECK(m->model_type == "granitemoehybrid");
  REQUIRE(m->kv.groups.size() == 2);
  const KvCacheGroup& state = m->kv.groups[0];
  CHECK(state.state.num_layers == 36);
  // intermediate mamba_expand 2 x hidden 1,536 = 3,072; conv 3 x (3,072 + 2 x 1 x 128) =
  // 3 x 3,328 = 9,984; recurrent 48 x 64 x 128 = 393,216; both bf16.
  CHECK(state.state.conv_elements == 9984);
  CHECK(state.state.recurrent_elements == 393216);
  CHECK(state.state.recurrent_dtype == DType::kBFloat16);
  CHECK(state.state.bytes_per_layer() == 806400);  // 2 x (9,984 + 393,216)
  CHECK(m->kv.page_bytes(0) == 29030400);          // 36 x 806,400
  CHECK(m->kv.groups[1].shape.num_layers == 4);    // layers 5, 15, 25, 35
  CHECK(m->kv.groups[1].shape.head_dim == 128);    // 1,536 / 12
  CHECK(m->kv.bytes_per_token() == 8192);          // 2 x 4 x 4 x 128 x 2
  CHECK(m->layer_group[5] == 1);
}

TEST_CASE("state layers the planner cannot size are refused by name", "[planner]") {
  // All Mamba2: no attention group to verify hits along.
  expect_invalid(parse_error(R"({"model_type": "nemotron_h", "num_hidden_layers": 2,
      "hybrid_override_pattern": "MM", "num_attention_heads": 4, "hidden_size": 512,
      "mamba_num_heads": 8, "mamba_head_dim": 64, "ssm_state_size": 16, "n_groups": 1,
      "conv_kernel": 4, "torch_dtype": "bfloat16"})"),
                 "only state groups");
  expect_invalid(parse_error(R"({"model_type": "nemotron_h", "num_hidden_layers": 2,
      "hybrid_override_pattern": "M*", "num_attention_heads": 4, "hidden_size": 512,
      "mamba_head_dim": 64, "ssm_state_size": 16, "n_groups": 1, "conv_kernel": 4,
      "torch_dtype": "bfloat16"})"),
                 "mamba_num_heads is missing");
  expect_invalid(parse_error(R"({"model_type": "nemotron_h", "num_hidden_layers": 2,
      "hybrid_override_pattern": "M*", "num_attention_heads": 4, "hidden_size": 512,
      "mamba_num_heads": 8, "mamba_head_dim": 64, "ssm_state_size": 16, "n_groups": 1,
      "conv_kernel": 4, "mamba_ssm_cache_dtype": "int8", "torch_dtype": "bfloat16"})"),
                 "mamba_ssm_cache_dtype is \"int8\", must be bfloat16, float16 or float32");
  expect_invalid(parse_error(R"({"model_type": "qwen3_next", "num_hidden_layers": 4,
      "num_attention_heads": 4, "head_dim": 64, "torch_dtype": "bfloat16",
      "linear_num_key_heads": 2147483647, "linear_key_head_dim": 2147483647,
      "linear_num_value_heads": 1, "linear_value_head_dim": 1, "linear_conv_kernel_dim": 4})"),
                 "more than 2^36");
}

TEST_CASE("each fixture excerpt reads like its upstream config.json", "[planner]") {
  int compared = 0;
  for (const char* name : testing::kPlannerFixtures) {
    INFO(name);
    const std::optional<std::string> upstream = testing::fixture_upstream(name);
    if (!upstream) continue;
    const HfConfigOptions options{.kv_dtype = DType::kBFloat16};
    absl::StatusOr<HfModelConfig> full = read_hf_config(*upstream, options);
    absl::StatusOr<HfModelConfig> excerpt = read_hf_config(testing::fixture_excerpt(name), options);
    REQUIRE(full.ok());
    REQUIRE(excerpt.ok());
    CHECK(full->model_type == excerpt->model_type);
    CHECK(full->layer_group == excerpt->layer_group);
    CHECK(full->max_position_embeddings == excerpt->max_position_embeddings);
    CHECK(full->notes == excerpt->notes);
    REQUIRE(full->kv.groups.size() == excerpt->kv.groups.size());
    for (size_t g = 0; g < full->kv.groups.size(); ++g) {
      CHECK(full->kv.groups[g].kind == excerpt->kv.groups[g].kind);
      CHECK(full->kv.groups[g].window == excerpt->kv.groups[g].window);
      CHECK(full->kv.bytes_per_token(static_cast<int32_t>(g)) ==
            excerpt->kv.bytes_per_token(static_cast<int32_t>(g)));
    }
    // Without the override, the dtype each names agrees too (gpt-oss names none).
    absl::StatusOr<HfModelConfig> full_dtype = read_hf_config(*upstream);
    absl::StatusOr<HfModelConfig> excerpt_dtype = read_hf_config(testing::fixture_excerpt(name));
    CHECK(full_dtype.status().code() == excerpt_dtype.status().code());
    if (full_dtype.ok() && excerpt_dtype.ok())
      CHECK(full_dtype->kv.dtype == excerpt_dtype->kv.dtype);
    ++compared;
  }
  if (compared == 0) {
    testing::report_skip("no upstream config.json next to the excerpts (fixtures.h)");
  }
}

// --- one field at a time ---------------------------------------------------------------------

constexpr const char* kBase = R"("num_hidden_layers": 4, "num_attention_heads": 32,
    "num_key_value_heads": 8, "hidden_size": 4096, "torch_dtype": "bfloat16")";

std::string config(const std::string& extra) {
  return "{" + std::string(kBase) + (extra.empty() ? "" : ", " + extra) + "}";
}

TEST_CASE("defaults: head_dim from hidden_size, KV heads from attention heads", "[planner]") {
  absl::StatusOr<HfModelConfig> m = parse_hf_config(
      R"({"num_hidden_layers": 2, "num_attention_heads": 16, "hidden_size": 2048,
          "torch_dtype": "float16"})");
  REQUIRE(m.ok());
  CHECK(m->kv.groups[0].shape.num_kv_heads == 16);
  CHECK(m->kv.groups[0].shape.head_dim == 128);
  CHECK(m->kv.dtype == DType::kFloat16);
  CHECK(m->max_position_embeddings == 0);
  // The newer "dtype" field reads like torch_dtype.
  m = parse_hf_config(R"({"num_hidden_layers": 2, "num_attention_heads": 16,
                          "hidden_size": 2048, "dtype": "float32"})");
  REQUIRE(m.ok());
  CHECK(m->kv.dtype == DType::kFloat32);
}

TEST_CASE("sliding windows the way each model family's config says", "[planner]") {
  // Mistral: sliding_window alone slides every layer.
  absl::StatusOr<HfModelConfig> m = parse_hf_config(config(R"("sliding_window": 4096)"));
  REQUIRE(m.ok());
  REQUIRE(m->kv.groups.size() == 1);
  CHECK(m->kv.groups[0].kind == AttentionKind::kSlidingWindow);
  CHECK(m->kv.groups[0].window == 4096);
  // Qwen2: use_sliding_window false keeps every layer full, and says so.
  m = parse_hf_config(config(R"("sliding_window": 131072, "use_sliding_window": false,
                                "max_window_layers": 2)"));
  REQUIRE(m.ok());
  REQUIRE(m->kv.groups.size() == 1);
  CHECK(m->kv.groups[0].kind == AttentionKind::kFull);
  CHECK(m->notes.size() == 1);
  // With it true, layers from max_window_layers on slide.
  m = parse_hf_config(config(R"("sliding_window": 512, "use_sliding_window": true,
                                "max_window_layers": 3)"));
  REQUIRE(m.ok());
  REQUIRE(m->kv.groups.size() == 2);
  CHECK(m->layer_group == std::vector<int32_t>{0, 0, 0, 1});
  CHECK(m->kv.groups[1].kind == AttentionKind::kSlidingWindow);
  // Gemma 2: every second layer full by default.
  m = parse_hf_config(config(R"("model_type": "gemma2", "sliding_window": 4096)"));
  REQUIRE(m.ok());
  CHECK(m->layer_group == std::vector<int32_t>{0, 1, 0, 1});
  CHECK(m->kv.groups[0].kind == AttentionKind::kSlidingWindow);
  // An explicit sliding_window_pattern.
  m = parse_hf_config(config(R"("sliding_window": 64, "sliding_window_pattern": 4)"));
  REQUIRE(m.ok());
  CHECK(m->layer_group == std::vector<int32_t>{0, 0, 0, 1});
}

TEST_CASE("Llama 4: an explicit no_rope_layers and a consistent layer_types", "[planner]") {
  absl::StatusOr<HfModelConfig> m =
      parse_hf_config(config(R"("attention_chunk_size": 8192, "no_rope_layers": [1, 0, 1, 1])"));
  REQUIRE(m.ok());
  CHECK(m->layer_group == std::vector<int32_t>{0, 1, 0, 0});
  CHECK(m->kv.groups[0].kind == AttentionKind::kChunkedLocal);
  m = parse_hf_config(config(R"("attention_chunk_size": 8192, "no_rope_layers": [1, 0, 1, 1],
      "layer_types": ["chunked_attention", "full_attention", "chunked_attention",
                      "chunked_attention"])"));
  REQUIRE(m.ok());
  CHECK(m->layer_group == std::vector<int32_t>{0, 1, 0, 0});
}

TEST_CASE("malformed or contradictory configs are refused, naming the field", "[planner]") {
  expect_invalid(parse_error("{"), "config.json is not JSON");
  expect_invalid(parse_error("[1, 2]"), "not a JSON object");
  expect_invalid(parse_error(R"({"num_attention_heads": 8, "hidden_size": 512,
                                 "torch_dtype": "bfloat16"})"),
                 "num_hidden_layers is missing");
  expect_invalid(parse_error(R"({"num_hidden_layers": -1, "num_attention_heads": 8})"),
                 "num_hidden_layers is -1, must be in [1, 2147483647]");
  expect_invalid(parse_error(R"({"num_hidden_layers": 2.5, "num_attention_heads": 8})"),
                 "num_hidden_layers is 2.5, must be an integer");
  expect_invalid(parse_error(config(R"("layer_types": ["full_attention"])")),
                 "has 1 entries but num_hidden_layers is 4");
  expect_invalid(parse_error(config(R"("layer_types": ["full_attention", "linear_attention",
                                            "full_attention", "full_attention"])")),
                 "model_type '' has state layers the planner does not size");
  expect_invalid(parse_error(config(R"("layer_types": ["full_attention", "ssm",
                                            "full_attention", "full_attention"])")),
                 "layer_types[1] is \"ssm\", a layer kind the planner does not size");
  expect_invalid(parse_error(config(R"("layer_types": ["sliding_attention", "full_attention",
                                            "full_attention", "full_attention"])")),
                 "layer_types[0] is \"sliding_attention\", but sliding_window is not set");
  expect_invalid(parse_error(config(R"("sliding_window": 128, "use_sliding_window": false,
          "layer_types": ["sliding_attention", "full_attention", "full_attention",
                          "full_attention"])")),
                 "but use_sliding_window is false");
  expect_invalid(parse_error(config(R"("layer_types": ["chunked_attention", "full_attention",
                                            "full_attention", "full_attention"])")),
                 "but attention_chunk_size is not set");
  expect_invalid(parse_error(config(R"("sliding_window": 128, "attention_chunk_size": 8192)")),
                 "sliding_window (128) and attention_chunk_size (8192) are both set");
  expect_invalid(parse_error(config(R"("sliding_window": 64, "sliding_window_pattern": 2,
          "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
                          "full_attention"])")),
                 "layer_types and sliding_window_pattern (2) disagree");
  expect_invalid(parse_error(config(R"("attention_chunk_size": 8192, "no_rope_layers": [1, 1, 1, 0],
          "layer_types": ["chunked_attention", "full_attention", "chunked_attention",
                          "full_attention"])")),
                 "layer_types[1] is not chunked_attention but no_rope_layers[1] is 1");
  expect_invalid(parse_error(config(R"("attention_chunk_size": 8192, "no_rope_layers": [1, 0])")),
                 "no_rope_layers is [1,0], has 2 entries but num_hidden_layers is 4");
  expect_invalid(parse_error(config(R"("attention_chunk_size": 8192,
                                       "no_rope_layers": [1, 2, 1, 1])")),
                 "no_rope_layers[1] is 2, must be 0 or 1");
  expect_invalid(parse_error(R"({"num_hidden_layers": 4, "num_attention_heads": 32,
                                 "num_key_value_heads": 3, "hidden_size": 4096})"),
                 "num_key_value_heads (3) must divide num_attention_heads (32)");
  expect_invalid(parse_error(R"({"num_hidden_layers": 4, "num_attention_heads": 32,
                                 "hidden_size": 100, "torch_dtype": "bfloat16"})"),
                 "hidden_size (100) is not a multiple of num_attention_heads (32)");
  expect_invalid(parse_error(R"({"num_hidden_layers": 4, "num_attention_heads": 32,
                                 "torch_dtype": "bfloat16"})"),
                 "head_dim and hidden_size are both missing");
  expect_invalid(parse_error(config(R"("kv_lora_rank": 512)")), "qk_rope_head_dim is missing");
  expect_invalid(parse_error(config(R"("hybrid_override_pattern": "M-M")")),
                 "hybrid_override_pattern is \"M-M\", has 3 characters but num_hidden_layers is 4");
  expect_invalid(parse_error(config(R"("hybrid_override_pattern": "M-X*")")),
                 "hybrid_override_pattern[2] is \"X\", is not M (Mamba2)");
  // Jamba's Mamba1 layers are not sized.
  expect_invalid(parse_error(config(R"("layers_block_type": ["mamba", "attention"])")),
                 "layers_block_type is [\"mamba\",\"attention\"], a layer structure the planner "
                 "does not size");
  expect_invalid(parse_error(R"({"text_config": 3})"), "text_config is 3, must be an object");
}

TEST_CASE("the dtype: named once, known, or given", "[planner]") {
  expect_invalid(parse_error(R"({"num_hidden_layers": 1, "num_attention_heads": 1,
                                 "head_dim": 64, "torch_dtype": "int8"})"),
                 "torch_dtype is \"int8\", must be bfloat16, float16, float32 or float8_e4m3fn");
  expect_invalid(parse_error(R"({"num_hidden_layers": 1, "num_attention_heads": 1,
                                 "head_dim": 64, "torch_dtype": "bfloat16",
                                 "dtype": "float16"})"),
                 "torch_dtype and dtype name different dtypes (bf16 and fp16)");
  expect_invalid(parse_error(R"({"num_hidden_layers": 1, "num_attention_heads": 1,
                                 "head_dim": 64})"),
                 "names no torch_dtype or dtype; pass the KV dtype (--kv-dtype)");
  // A given KV dtype wins over the config's.
  absl::StatusOr<HfModelConfig> m =
      parse_hf_config(config(""), {.kv_dtype = DType::kFloat8E4M3, .block_size = 32});
  REQUIRE(m.ok());
  CHECK(m->kv.dtype == DType::kFloat8E4M3);
  CHECK(m->kv.block_size == 32);
  CHECK(*parse_kv_dtype("bf16") == DType::kBFloat16);
  CHECK(*parse_kv_dtype("fp16") == DType::kFloat16);
  CHECK(*parse_kv_dtype("float32") == DType::kFloat32);
  CHECK(*parse_kv_dtype("fp8") == DType::kFloat8E4M3);
  expect_invalid(parse_kv_dtype("int4").status(), "KV dtype 'int4' is not one of");
  CHECK(std::string(kv_dtype_name(DType::kFloat8E4M3)) == "fp8");
}

TEST_CASE("a config file that cannot be read names its path", "[planner]") {
  absl::StatusOr<HfModelConfig> m = read_hf_config("/nonexistent/config.json");
  CHECK(m.status().code() == absl::StatusCode::kNotFound);
  CHECK(m.status().message().find("/nonexistent/config.json") != std::string::npos);
}

}  // namespace
}  // namespace pagedkv
