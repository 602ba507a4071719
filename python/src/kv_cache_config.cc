// KvCacheConfig (pagedkv/kv_cache_config.h): a hybrid model's KV cache as layer groups,
// the bytes each costs and the split of a byte budget into one pool per group, whose
// PoolSplit.groups are the LayerGroups KvCacheManager(layer_groups=...) takes.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bindings.h"
#include "pagedkv/kv_cache_config.h"

namespace pagedkv::python {
namespace {

using namespace nb::literals;

// The config, once valid (the per-group figures divide by windows and the block size):
// else ValueError with validate()'s message. And group `g` in range, when given.
const KvCacheConfig& checked(const KvCacheConfig& config, const char* caller, int32_t g = 0) {
  raise_if_error(config.validate());
  if (g < 0 || g >= config.num_groups()) {
    raise_status(absl::InvalidArgumentError(
        absl::StrCat(caller, ": group ", g, " outside [0, ", config.num_groups(), ")")));
  }
  return config;
}

}  // namespace

void bind_kv_cache_config(nb::module_& m) {
  nb::class_<StateShape>(m, "StateShape",
                         "The per-sequence state of a STATE group's layers: per layer, conv and "
                         "recurrent elements in their dtypes.")
      .def(
          "__init__",
          [](StateShape* self, int32_t num_layers, int64_t conv_elements,
             int64_t recurrent_elements, DType conv_dtype, DType recurrent_dtype) {
            new (self) StateShape{num_layers, conv_elements, recurrent_elements, conv_dtype,
                                  recurrent_dtype};
          },
          nb::kw_only(), "num_layers"_a = 0, "conv_elements"_a = 0, "recurrent_elements"_a = 0,
          "conv_dtype"_a = DType::kBFloat16, "recurrent_dtype"_a = DType::kFloat32)
      .def_rw("num_layers", &StateShape::num_layers)
      .def_rw("conv_elements", &StateShape::conv_elements)
      .def_rw("recurrent_elements", &StateShape::recurrent_elements)
      .def_rw("conv_dtype", &StateShape::conv_dtype)
      .def_rw("recurrent_dtype", &StateShape::recurrent_dtype)
      .def("bytes_per_layer", &StateShape::bytes_per_layer)
      .def("bytes", &StateShape::bytes, "one state slot: every layer's state of one sequence");

  nb::class_<KvCacheGroup>(m, "KvCacheGroup",
                           "One layer group of a KvCacheConfig: the layers of one attention "
                           "kind (and window) and their KV shape, or a STATE group's state.")
      .def(
          "__init__",
          [](KvCacheGroup* self, AttentionKind kind, int32_t window, const KvCacheSpec& shape,
             const StateShape& state) {
            new (self) KvCacheGroup{kind, window, shape, state};
          },
          nb::kw_only(), "kind"_a = AttentionKind::kFull, "window"_a = 0, "shape"_a = KvCacheSpec{},
          "state"_a = StateShape{})
      .def_rw("kind", &KvCacheGroup::kind)
      .def_rw("window", &KvCacheGroup::window, "tokens: > 0 for the windowed kinds, 0 for FULL")
      .def_rw("shape", &KvCacheGroup::shape,
              "a KvCacheSpec: num_layers, num_kv_heads, head_dim, latent (its dtype and "
              "block_size are the config's)")
      .def_rw("state", &KvCacheGroup::state, "a STATE group's StateShape");

  nb::class_<PoolSplit>(m, "PoolSplit", "A byte budget split into one pool per layer group.")
      .def_ro("groups", &PoolSplit::groups,
              "LayerGroups (kind, window, num_blocks) for KvCacheManager(layer_groups=...)")
      .def_ro("pool_bytes", &PoolSplit::pool_bytes, "per group: num_blocks x page bytes")
      .def_ro("budget_bytes", &PoolSplit::budget_bytes)
      .def_ro("used_bytes", &PoolSplit::used_bytes)
      .def_ro("lost_bytes", &PoolSplit::lost_bytes,
              "budget_bytes - used_bytes: each pool's remainder below a page")
      .def_ro("target_tokens", &PoolSplit::target_tokens, "the sequence length the split balances")
      .def_ro("cached_tokens", &PoolSplit::cached_tokens,
              "the prefix-cache content the split counts (0: none)");

  nb::class_<KvCacheConfig>(
      m, "KvCacheConfig",
      "A model's KV cache as layer groups sharing one dtype and block size: bytes per token\n"
      "per group, the least KV a sequence keeps, and the split of a byte budget into one\n"
      "pool per group (docs/allocator.md, \"Layer groups and their pools\"). Methods taking\n"
      "a group raise ValueError for an invalid config or a group out of range.")
      .def(
          "__init__",
          [](KvCacheConfig* self, std::vector<KvCacheGroup> groups, DType dtype,
             int32_t block_size) {
            new (self) KvCacheConfig{std::move(groups), dtype, block_size};
          },
          "groups"_a, nb::kw_only(), "dtype"_a = DType::kBFloat16, "block_size"_a = 16)
      .def_rw("groups", &KvCacheConfig::groups)
      .def_rw("dtype", &KvCacheConfig::dtype)
      .def_rw("block_size", &KvCacheConfig::block_size)
      .def_rw("checkpoints_per_sequence", &KvCacheConfig::checkpoints_per_sequence,
              "checkpoint slots a STATE group's pool sets aside per sequence, beside its own")
      .def(
          "validate", [](const KvCacheConfig& c) { raise_if_error(c.validate()); },
          "Raises ValueError naming the first bad field.")
      .def("num_groups", &KvCacheConfig::num_groups)
      .def(
          "num_layers", [](const KvCacheConfig& c) { return c.num_layers(); }, "over all groups")
      .def(
          "group_spec",
          [](const KvCacheConfig& c, int32_t g) {
            return checked(c, "group_spec", g).group_spec(g);
          },
          "group"_a, "Group g's shape with the config's dtype and block_size.")
      .def(
          "bytes_per_token",
          [](const KvCacheConfig& c, std::optional<int32_t> g) {
            return g ? checked(c, "bytes_per_token", *g).bytes_per_token(*g)
                     : checked(c, "bytes_per_token").bytes_per_token();
          },
          "group"_a.none() = nb::none(), "Bytes of one token in group g's layers (None: all).")
      .def(
          "page_bytes",
          [](const KvCacheConfig& c, int32_t g) {
            return checked(c, "page_bytes", g).page_bytes(g);
          },
          "group"_a, "Bytes of one page of group g's pool: block_size tokens of its layers.")
      .def(
          "tokens_attended",
          [](const KvCacheConfig& c, int32_t g, int64_t tokens) {
            return checked(c, "tokens_attended", g).tokens_attended(g, tokens);
          },
          "group"_a, "tokens"_a,
          "Tokens of group g the last token of a sequence of `tokens` attends to.")
      .def(
          "min_bytes_per_sequence",
          [](const KvCacheConfig& c, int64_t tokens) {
            return checked(c, "min_bytes_per_sequence").min_bytes_per_sequence(tokens);
          },
          "tokens"_a, "The analytic minimum of KV bytes a sequence of `tokens` keeps.")
      .def(
          "blocks_held",
          [](const KvCacheConfig& c, int32_t g, int64_t tokens) {
            return checked(c, "blocks_held", g).blocks_held(g, tokens);
          },
          "group"_a, "tokens"_a,
          "Blocks of group g a sequence of `tokens` keeps once its window moved on.")
      .def(
          "held_bytes_per_sequence",
          [](const KvCacheConfig& c, int64_t tokens) {
            return checked(c, "held_bytes_per_sequence").held_bytes_per_sequence(tokens);
          },
          "tokens"_a)
      .def(
          "blocks_per_sequence",
          [](const KvCacheConfig& c, int32_t g, int64_t tokens) {
            return checked(c, "blocks_per_sequence", g).blocks_per_sequence(g, tokens);
          },
          "group"_a, "tokens"_a, "Blocks of group g the budget split sets aside per sequence.")
      .def(
          "reserved_bytes_per_sequence",
          [](const KvCacheConfig& c, int64_t tokens) {
            return checked(c, "reserved_bytes_per_sequence").reserved_bytes_per_sequence(tokens);
          },
          "tokens"_a)
      .def(
          "split_budget",
          [](const KvCacheConfig& c, int64_t budget_bytes, int64_t target_tokens,
             int64_t cached_tokens) {
            return value_or_raise(c.split_budget(budget_bytes, target_tokens, cached_tokens));
          },
          "budget_bytes"_a, "target_tokens"_a, "cached_tokens"_a = 0,
          "Splits budget_bytes into one pool per group in proportion to what a sequence of\n"
          "target_tokens needs in each, whole pages each. cached_tokens > 0 (the prefix\n"
          "content the cache should keep) caps each group at what it can use, all of it\n"
          "cached plus one target-length sequence, and gives the excess to the others.\n"
          "Raises ValueError for an invalid config, a budget outside [0, 2**50] bytes, a\n"
          "target below 1, cached_tokens outside [0, 2**50], or a budget that leaves a group\n"
          "less than one page.")
      .def(
          "max_sequences",
          [](const KvCacheConfig& c, const PoolSplit& split, int64_t tokens) {
            return checked(c, "max_sequences").max_sequences(split, tokens);
          },
          "split"_a, "tokens"_a, "Sequences of `tokens` tokens the pools of `split` hold at once.");
}

}  // namespace pagedkv::python
