// The capacity planner (pagedkv/capacity_plan.h, hf_model_config.h): one call from a
// config.json to the plan, returned as the dict of its JSON report (format_plan_json), so
// Python sees the same fields as `pagedkv-plan --json`.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "pagedkv/capacity_plan.h"
#include "pagedkv/hf_model_config.h"

namespace pagedkv::python {

using namespace nb::literals;

void bind_capacity_plan(nb::module_& m) {
  m.def(
      "plan_capacity",
      [](const std::string& config, int64_t budget_bytes, std::optional<std::string> kv_dtype,
         int32_t block_size, int64_t max_model_len, int64_t target_tokens,
         const std::vector<int64_t>& lengths) {
        HfConfigOptions options{.block_size = block_size};
        if (kv_dtype) options.kv_dtype = value_or_raise(parse_kv_dtype(*kv_dtype));
        const HfModelConfig model = value_or_raise(read_hf_config(config, options));
        const CapacityPlan plan =
            value_or_raise(plan_capacity(model, {.budget_bytes = budget_bytes,
                                                 .max_model_len = max_model_len,
                                                 .target_tokens = target_tokens,
                                                 .lengths = lengths}));
        return nb::module_::import_("json").attr("loads")(format_plan_json(plan));
      },
      "config"_a, "budget_bytes"_a, nb::kw_only(), "kv_dtype"_a = nb::none(), "block_size"_a = 16,
      "max_model_len"_a = 0, "target_tokens"_a = 0, "lengths"_a = std::vector<int64_t>(),
      "Plans the KV cache of the model whose Hugging Face config.json is at `config` for "
      "`budget_bytes` of memory: pagedkv's pools (one per layer group), sequences that fit "
      "at each length, the analytic minimum per sequence, and vLLM's grouping waste beside "
      "it. kv_dtype: 'bf16', 'fp16', 'fp32' or 'fp8' (default: the config's torch_dtype); "
      "max_model_len 0: the config's max_position_embeddings; target_tokens 0: "
      "max_model_len. Returns the report as a dict (the fields of pagedkv-plan --json). "
      "Raises KeyError for a config that cannot be opened, ValueError naming the field or "
      "value for anything else.");
}

}  // namespace pagedkv::python
