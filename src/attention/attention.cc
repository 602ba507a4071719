// Host wrappers of the attention and cache-write kernels: validate, plan, dispatch to the
// CPU reference or the CUDA launchers.
#include "pagedkv/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "attention/argument_checks.h"
#include "attention/cpu_kernels.h"
#include "common/status_macros.h"
#include "kernels/dispatch.h"
#include "pagedkv/attention_params.h"
#include "pagedkv/decode_plan.h"

#if PAGEDKV_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/launch.h"
#endif

namespace pagedkv {

using internal::check_device;
using internal::first_read_token;
using internal::invalid;
using internal::validate_attention_types;
using internal::validate_cache;
using internal::validate_dtypes;
using internal::validate_sinks;
using internal::validate_table_entries;
using internal::validate_table_shape;
using internal::validate_window;

namespace {

float score_scale(float sm_scale, int32_t head_dim) {
  const float scale = sm_scale != 0.0f ? sm_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  return scale * kLog2e;
}

#if PAGEDKV_HAVE_CUDA
absl::Status cuda_status(const char* fn, cudaError_t err) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(fn, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

// The CUDA kernel a call runs: GQA decode / extend (windowed or not) or MLA decode, its
// types and the query rows of one work item. Shared memory and occupancy are per variant.
struct KernelVariant {
  bool mla = false;
  bool windowed = false;
  DType q_dtype = DType::kFloat32;
  DType kv_dtype = DType::kFloat32;
  int32_t head_dim = 0;
  int32_t rows = 0;  // GQA: query rows of a work item; MLA: heads
  bool operator==(const KernelVariant&) const = default;
};

size_t smem_bytes(const KernelVariant& v) {
  return v.mla ? internal::mla_smem_bytes(v.q_dtype, v.kv_dtype, v.rows)
               : internal::attention_smem_bytes(v.q_dtype, v.kv_dtype, v.head_dim, v.rows);
}

// Shared memory a CTA of the variant needs must fit the device's opt-in limit.
absl::Status check_smem(const char* fn, const KernelVariant& v) {
  int device = 0;
  int limit = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  }
  PAGEDKV_RETURN_IF_ERROR(cuda_status(fn, err));
  const size_t need = smem_bytes(v);
  if (need > static_cast<size_t>(limit)) {
    return invalid(fn, absl::StrCat(v.rows, v.mla ? " heads" : " query rows", " per CTA need ",
                                    need, " bytes of shared memory; the device allows ", limit,
                                    v.mla ? "" : " (lower num_q_heads / num_kv_heads)"));
  }
  return absl::OkStatus();
}

// SM count and resident CTAs per SM for a kernel variant on the current device, queried
// once per (device, variant) and cached: the plan is made on every decode call. {0, 0}
// when a query fails.
struct MachineShape {
  int num_sms = 0;
  int ctas_per_sm = 0;
};
MachineShape machine_shape(const KernelVariant& v) {
  struct Entry {
    int device;
    KernelVariant variant;
    MachineShape shape;
  };
  static std::mutex mutex;
  static std::vector<Entry> entries;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return {};
  std::lock_guard<std::mutex> lock(mutex);
  for (const Entry& e : entries) {
    if (e.device == device && e.variant == v) return e.shape;
  }
  MachineShape shape;
  int ctas = 0;
  const cudaError_t err = v.mla ? internal::mla_ctas_per_sm(v.q_dtype, v.kv_dtype, v.rows, &ctas)
                                : internal::attention_ctas_per_sm(v.q_dtype, v.kv_dtype, v.head_dim,
                                                                  v.rows, v.windowed, &ctas);
  if (cudaDeviceGetAttribute(&shape.num_sms, cudaDevAttrMultiProcessorCount, device) !=
          cudaSuccess ||
      err != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  shape.ctas_per_sm = std::max(ctas, 1);
  entries.push_back({device, v, shape});
  return shape;
}

// Device workspace for split-K partials when the caller passes none, grown on demand;
// never grown (nor first allocated) while `stream` captures a graph: cudaMalloc / cudaFree
// there would invalidate the capture.
absl::StatusOr<void*> library_workspace(const char* fn, int64_t bytes, cudaStream_t stream) {
  static std::mutex mutex;
  static void* buffer = nullptr;
  static int64_t capacity = 0;
  static int owner = -1;
  std::lock_guard<std::mutex> lock(mutex);
  int device = 0;
  PAGEDKV_RETURN_IF_ERROR(cuda_status(fn, cudaGetDevice(&device)));
  if (buffer != nullptr && capacity >= bytes && owner == device) return buffer;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  PAGEDKV_RETURN_IF_ERROR(cuda_status(fn, cudaStreamIsCapturing(stream, &capture)));
  if (capture != cudaStreamCaptureStatusNone) {
    return absl::FailedPreconditionError(
        absl::StrCat(fn, ": the library workspace holds ", capacity, " bytes on device ", owner,
                     "; ", bytes, " bytes on device ", device,
                     " cannot be allocated while the stream is capturing a graph (pass "
                     "DecodeOptions::maybe_workspace of decode_workspace_bytes())"));
  }
  if (buffer != nullptr) {
    int current = device;
    cudaSetDevice(owner);
    cudaFree(buffer);
    cudaSetDevice(current);
    buffer = nullptr;
    capacity = 0;
  }
  const int64_t size = std::max<int64_t>(bytes, int64_t{1} << 20);
  PAGEDKV_RETURN_IF_ERROR(cuda_status(fn, cudaMalloc(&buffer, static_cast<size_t>(size))));
  capacity = size;
  owner = device;
  return buffer;
}
#endif

AttentionParams base_params(const KvCacheView& cache, const BlockTableView& table, DType dtype,
                            int32_t num_q_heads, float sm_scale, const float* k_scale,
                            const float* v_scale) {
  AttentionParams p;
  p.q_dtype = dtype;
  p.kv = cache;
  p.table = table;
  p.num_q_heads = num_q_heads;
  p.group_size = num_q_heads / cache.num_kv_heads;
  p.score_scale = score_scale(sm_scale, cache.head_dim);
  p.maybe_k_scale = k_scale;
  p.maybe_v_scale = v_scale;
  return p;
}

// The decode plan's inputs: the batch shape, and for a windowed kind the window length in
// place of the context length (a sequence reads at most window + block_size - 1 tokens from
// its block-aligned split base), so the plan splits the window, not the context.
DecodePlanInputs plan_inputs(Device device, const KvCacheView& cache, const BlockTableView& table,
                             int32_t max_context_len, int64_t total_context_len, AttentionKind kind,
                             int32_t window, int32_t requested_splits) {
  DecodePlanInputs in;
  in.num_seqs = table.num_seqs;
  in.num_kv_heads = cache.num_kv_heads;
  in.max_context_len = max_context_len;
  in.total_context_len = total_context_len;
  in.block_size = std::max(cache.block_size, 1);
  in.requested_splits = requested_splits;
  if (device == Device::kCpu && in.max_context_len <= 0 && table.context_lens != nullptr) {
    for (int32_t i = 0; i < table.num_seqs; ++i) {
      in.max_context_len = std::max(in.max_context_len, table.context_lens[i]);
    }
  }
  if (kind != AttentionKind::kFull && window > 0) {
    const int64_t span = int64_t{window} + in.block_size - 1;
    const int64_t total =
        in.total_context_len > 0 ? in.total_context_len : int64_t{in.num_seqs} * in.max_context_len;
    in.max_context_len = static_cast<int32_t>(std::min<int64_t>(in.max_context_len, span));
    in.total_context_len = std::min<int64_t>(total, int64_t{in.num_seqs} * in.max_context_len);
  }
  return in;
}

// Split-K decode once the arguments are valid and `p` is filled: the plan's splits, the
// CPU reference, or on CUDA the workspace (caller's or the library's) and `launch`.
// `value_dim`: elements of one output row (head_dim; MLA: kv_lora_rank).
template <typename Launch>
absl::Status run_decode(const char* fn, Device device, AttentionParams& p, const DecodePlan& plan,
                        const DecodeOptions& options, int32_t value_dim, void* stream,
                        Launch launch) {
  p.num_splits = plan.num_splits;
  p.tokens_per_split = plan.tokens_per_split;
  p.q_tile = 1;
  p.num_q_tiles = 1;
  if (device == Device::kCpu) {
    internal::paged_attention_cpu(p);
    return absl::OkStatus();
  }
#if PAGEDKV_HAVE_CUDA
  if (plan.num_splits > 1) {
    const int64_t need = decode_workspace_bytes(plan, p.table.num_seqs, p.num_q_heads, value_dim);
    void* workspace = options.maybe_workspace;
    if (workspace != nullptr && options.workspace_bytes < need) {
      return invalid(
          fn, absl::StrCat("workspace of ", options.workspace_bytes, " bytes is smaller than the ",
                           need, " bytes ", plan.num_splits, " splits need"));
    }
    if (workspace == nullptr) {
      absl::StatusOr<void*> buffer = library_workspace(fn, need, static_cast<cudaStream_t>(stream));
      if (!buffer.ok()) return buffer.status();
      workspace = *buffer;
    }
    p.maybe_partial_o = static_cast<float*>(workspace);
    p.maybe_partial_ml =
        p.maybe_partial_o + int64_t{plan.num_splits} * p.table.num_seqs * p.num_q_heads * value_dim;
  }
  return cuda_status(fn, launch(p, static_cast<cudaStream_t>(stream)));
#else
  (void)options;
  (void)value_dim;
  (void)stream;
  (void)launch;
  return absl::FailedPreconditionError(absl::StrCat(fn, ": compiled without CUDA"));
#endif
}

}  // namespace

absl::Status write_kv(Device device, const KvCacheView& cache, const WriteKvArgs& args,
                      void* stream) {
  constexpr const char* fn = "write_kv";
  PAGEDKV_RETURN_IF_ERROR(check_device(fn, device));
  PAGEDKV_RETURN_IF_ERROR(validate_cache(fn, device, cache, /*need_v=*/args.v != nullptr));
  if (args.num_tokens < 0) return invalid(fn, absl::StrCat("num_tokens is ", args.num_tokens));
  if (args.num_tokens == 0) return absl::OkStatus();
  if (args.k == nullptr || args.slot_mapping == nullptr) {
    return invalid(fn, "k or slot_mapping is null");
  }
  if (args.src_dtype == DType::kFloat8E4M3) {
    return invalid(fn, "source dtype fp8_e4m3 is not supported (fp32, fp16, bf16 are)");
  }
  WriteKvParams p;
  p.k = args.k;
  p.v = args.v;
  p.src_dtype = args.src_dtype;
  p.slot_mapping = args.slot_mapping;
  p.num_tokens = args.num_tokens;
  p.maybe_k_scale = args.maybe_k_scale;
  p.maybe_v_scale = args.maybe_v_scale;
  p.kv = cache;
  if (device == Device::kCpu) {
    const int64_t num_slots = int64_t{cache.num_blocks} * cache.block_size;
    for (int32_t i = 0; i < args.num_tokens; ++i) {
      if (args.slot_mapping[i] >= num_slots) {
        return invalid(fn, absl::StrCat("token ", i, ": slot ", args.slot_mapping[i],
                                        " is at or beyond num_blocks ", cache.num_blocks,
                                        " x block_size ", cache.block_size, " = ", num_slots));
      }
    }
    internal::write_kv_cpu(p);
    return absl::OkStatus();
  }
#if PAGEDKV_HAVE_CUDA
  return cuda_status(fn, internal::launch_write_kv(p, static_cast<cudaStream_t>(stream)));
#else
  (void)stream;
  return absl::FailedPreconditionError("write_kv: compiled without CUDA");
#endif
}

DecodePlan plan_decode_for(Device device, const KvCacheView& cache, const BlockTableView& table,
                           const DecodeArgs& args, const DecodeOptions& options) {
  DecodePlanInputs in =
      plan_inputs(device, cache, table, args.max_context_len, args.total_context_len, args.kind,
                  args.window, options.num_splits);
#if PAGEDKV_HAVE_CUDA
  if (device == Device::kCuda && cuda_device_available() && options.num_splits == 0) {
    const KernelVariant variant{.windowed = args.kind != AttentionKind::kFull,
                                .q_dtype = args.dtype,
                                .kv_dtype = cache.dtype,
                                .head_dim = cache.head_dim,
                                .rows = args.num_q_heads / std::max(cache.num_kv_heads, 1)};
    if (const MachineShape shape = machine_shape(variant); shape.num_sms > 0) {
      in.num_sms = shape.num_sms;
      in.ctas_per_sm = shape.ctas_per_sm;
    }
  }
#endif
  return plan_decode(in);
}

absl::Status paged_decode_attention(Device device, const KvCacheView& cache,
                                    const BlockTableView& table, const DecodeArgs& args,
                                    const DecodeOptions& options, void* stream) {
  constexpr const char* fn = "paged_decode_attention";
  PAGEDKV_RETURN_IF_ERROR(check_device(fn, device));
  PAGEDKV_RETURN_IF_ERROR(validate_cache(fn, device, cache));
  PAGEDKV_RETURN_IF_ERROR(validate_attention_types(fn, args.dtype, cache, args.num_q_heads));
  PAGEDKV_RETURN_IF_ERROR(validate_window(fn, args.kind, args.window));
  PAGEDKV_RETURN_IF_ERROR(validate_table_shape(fn, device, cache, table));
  PAGEDKV_RETURN_IF_ERROR(
      validate_table_entries(fn, device, cache, table, [&](int32_t, int32_t len) {
        return first_read_token(args.kind, args.window, int64_t{len} - 1);
      }));
  PAGEDKV_RETURN_IF_ERROR(validate_sinks(fn, device, args.maybe_sinks, args.num_q_heads));
  if (table.num_seqs == 0) return absl::OkStatus();
  if (args.q == nullptr || args.out == nullptr) return invalid(fn, "q or out is null");
  if (options.num_splits < 0 || options.num_splits > kMaxSplits) {
    return invalid(
        fn, absl::StrCat("num_splits ", options.num_splits, " outside [0, ", kMaxSplits, "]"));
  }
  if (device == Device::kCuda && args.max_context_len <= 0 && options.num_splits != 1) {
    return invalid(fn, absl::StrCat("max_context_len is ", args.max_context_len,
                                    "; CUDA needs it to plan split-K (or set num_splits = 1)"));
  }
  const DecodePlan plan = plan_decode_for(device, cache, table, args, options);
  AttentionParams p = base_params(cache, table, args.dtype, args.num_q_heads, args.sm_scale,
                                  args.maybe_k_scale, args.maybe_v_scale);
  p.q = args.q;
  p.o = args.out;
  p.maybe_lse = args.maybe_lse;
  p.kind = args.kind;
  p.window = args.window;
  p.maybe_sinks = args.maybe_sinks;
#if PAGEDKV_HAVE_CUDA
  if (device == Device::kCuda) {
    PAGEDKV_RETURN_IF_ERROR(check_smem(fn, {.q_dtype = args.dtype,
                                            .kv_dtype = cache.dtype,
                                            .head_dim = cache.head_dim,
                                            .rows = p.group_size}));
  }
  return run_decode(fn, device, p, plan, options, cache.head_dim, stream,
                    internal::launch_paged_attention);
#else
  return run_decode(fn, device, p, plan, options, cache.head_dim, stream, nullptr);
#endif
}

absl::Status paged_extend_attention(Device device, const KvCacheView& cache,
                                    const BlockTableView& table, const ExtendArgs& args,
                                    void* stream) {
  constexpr const char* fn = "paged_extend_attention";
  PAGEDKV_RETURN_IF_ERROR(check_device(fn, device));
  PAGEDKV_RETURN_IF_ERROR(validate_cache(fn, device, cache));
  PAGEDKV_RETURN_IF_ERROR(validate_attention_types(fn, args.dtype, cache, args.num_q_heads));
  PAGEDKV_RETURN_IF_ERROR(validate_window(fn, args.kind, args.window));
  PAGEDKV_RETURN_IF_ERROR(validate_table_shape(fn, device, cache, table));
  if (table.num_seqs == 0) return absl::OkStatus();
  if (args.q == nullptr || args.out == nullptr || args.qo_indptr == nullptr) {
    return invalid(fn, "q, out or qo_indptr is null");
  }
  int32_t max_query_len = args.max_query_len;
  if (device == Device::kCpu) {
    if (args.qo_indptr[0] != 0) {
      return invalid(fn, absl::StrCat("qo_indptr[0] is ", args.qo_indptr[0], ", must be 0"));
    }
    int32_t longest = 0;
    for (int32_t i = 0; i < table.num_seqs; ++i) {
      const int32_t n = args.qo_indptr[i + 1] - args.qo_indptr[i];
      if (n < 0 || n > table.context_lens[i]) {
        return invalid(
            fn, absl::StrCat("sequence ", i, ": ", n, " new tokens, must be in [0, context length ",
                             table.context_lens[i], "]"));
      }
      longest = std::max(longest, n);
    }
    if (max_query_len > 0 && longest > max_query_len) {
      return invalid(fn, absl::StrCat("a sequence has ", longest,
                                      " new tokens, more than max_query_len ", max_query_len));
    }
    max_query_len = longest;
  } else if (max_query_len <= 0) {
    return invalid(
        fn, absl::StrCat("max_query_len is ", max_query_len, "; CUDA needs it to size the grid"));
  }
  // The first new token of each sequence attends the earliest token any of them reads.
  PAGEDKV_RETURN_IF_ERROR(
      validate_table_entries(fn, device, cache, table, [&](int32_t i, int32_t len) {
        const int32_t n = args.qo_indptr[i + 1] - args.qo_indptr[i];
        return first_read_token(args.kind, args.window, int64_t{len} - n);
      }));
  PAGEDKV_RETURN_IF_ERROR(validate_sinks(fn, device, args.maybe_sinks, args.num_q_heads));
  if (max_query_len == 0) return absl::OkStatus();
  AttentionParams p = base_params(cache, table, args.dtype, args.num_q_heads, args.sm_scale,
                                  args.maybe_k_scale, args.maybe_v_scale);
  p.q = args.q;
  p.o = args.out;
  p.maybe_lse = args.maybe_lse;
  p.maybe_qo_indptr = args.qo_indptr;
  p.num_splits = 1;
  p.kind = args.kind;
  p.window = args.window;
  p.maybe_sinks = args.maybe_sinks;
  if (device == Device::kCpu) {
    p.q_tile = std::min(max_query_len, 64);
    p.num_q_tiles = (max_query_len + p.q_tile - 1) / p.q_tile;
    internal::paged_attention_cpu(p);
    return absl::OkStatus();
  }
#if PAGEDKV_HAVE_CUDA
  // As many query tokens per CTA as the widest CTA shape of these types holds rows.
  const int32_t cta_rows =
      internal::attention_cta_rows(args.dtype, cache.dtype, cache.head_dim, /*item_rows=*/64);
  p.q_tile = std::max(1, cta_rows / p.group_size);
  p.num_q_tiles = (max_query_len + p.q_tile - 1) / p.q_tile;
  if (p.num_q_tiles > 65535) {
    return invalid(fn, absl::StrCat("max_query_len ", max_query_len, " needs ", p.num_q_tiles,
                                    " query tiles, above the CUDA grid limit 65535"));
  }
  PAGEDKV_RETURN_IF_ERROR(check_smem(fn, {.q_dtype = args.dtype,
                                          .kv_dtype = cache.dtype,
                                          .head_dim = cache.head_dim,
                                          .rows = p.q_tile * p.group_size}));
  return cuda_status(fn, internal::launch_paged_attention(p, static_cast<cudaStream_t>(stream)));
#else
  (void)stream;
  return absl::FailedPreconditionError("paged_extend_attention: compiled without CUDA");
#endif
}

// --- MLA ---------------------------------------------------------------------------------

namespace {

// The latent dims the CUDA kernel is compiled for (DeepSeek-V2/V3).
constexpr int32_t kCudaMlaRank = 512;
constexpr int32_t kCudaMlaRope = 64;

absl::Status validate_mla(const char* fn, Device device, const KvCacheView& cache,
                          const MlaDecodeArgs& args) {
  PAGEDKV_RETURN_IF_ERROR(validate_cache(fn, device, cache, /*need_v=*/false));
  PAGEDKV_RETURN_IF_ERROR(validate_dtypes(fn, args.dtype, cache));
  if (cache.num_kv_heads != 1) {
    return invalid(fn, absl::StrCat("cache num_kv_heads is ", cache.num_kv_heads,
                                    "; an MLA cache holds one latent per token (1)"));
  }
  if (args.kv_lora_rank <= 0 || args.qk_rope_head_dim < 0) {
    return invalid(fn, absl::StrCat("kv_lora_rank ", args.kv_lora_rank, " must be > 0 and ",
                                    "qk_rope_head_dim ", args.qk_rope_head_dim, " >= 0"));
  }
  if (int64_t{args.kv_lora_rank} + args.qk_rope_head_dim != cache.head_dim) {
    return invalid(fn, absl::StrCat("kv_lora_rank ", args.kv_lora_rank, " + qk_rope_head_dim ",
                                    args.qk_rope_head_dim, " must equal the cache head_dim ",
                                    cache.head_dim, " (one latent per token)"));
  }
  if (args.num_heads <= 0) return invalid(fn, absl::StrCat("num_heads is ", args.num_heads));
  if (!(args.sm_scale > 0.0f) || std::isinf(args.sm_scale)) {
    return invalid(fn, absl::StrCat("sm_scale ", args.sm_scale,
                                    " must be finite and > 0: the model's softmax scale "
                                    "(DeepSeek-V3: 1 / sqrt(192) times the YaRN mscale^2)"));
  }
  if (device == Device::kCuda) {
    if (args.kv_lora_rank != kCudaMlaRank || args.qk_rope_head_dim != kCudaMlaRope) {
      return invalid(
          fn, absl::StrCat("CUDA supports kv_lora_rank ", kCudaMlaRank, " + qk_rope_head_dim ",
                           kCudaMlaRope, " (DeepSeek-V2/V3); ", "got ", args.kv_lora_rank, " + ",
                           args.qk_rope_head_dim, " (the CPU reference takes any dims)"));
    }
    if (args.dtype == DType::kFloat32) {
      return invalid(fn, "CUDA needs q/out in fp16 or bf16; fp32 runs on the CPU reference");
    }
    if (reinterpret_cast<uintptr_t>(args.q) % 16 != 0) {
      return invalid(fn, "CUDA needs a 16-byte aligned q (its rows are read in 16-byte chunks)");
    }
  }
  return absl::OkStatus();
}

}  // namespace

DecodePlan plan_mla_decode_for(Device device, const KvCacheView& cache, const BlockTableView& table,
                               const MlaDecodeArgs& args, const DecodeOptions& options) {
  DecodePlanInputs in =
      plan_inputs(device, cache, table, args.max_context_len, args.total_context_len,
                  AttentionKind::kFull, 0, options.num_splits);
#if PAGEDKV_HAVE_CUDA
  if (device == Device::kCuda && cuda_device_available()) {
    // CTAs per (sequence, split): the heads in CTAs of up to 64.
    const int32_t cta_rows = internal::mla_cta_rows(args.num_heads);
    in.num_kv_heads = cta_rows > 0 ? (args.num_heads + cta_rows - 1) / cta_rows : 1;
    if (options.num_splits == 0) {
      const KernelVariant variant{
          .mla = true, .q_dtype = args.dtype, .kv_dtype = cache.dtype, .rows = args.num_heads};
      if (const MachineShape shape = machine_shape(variant); shape.num_sms > 0) {
        in.num_sms = shape.num_sms;
        in.ctas_per_sm = shape.ctas_per_sm;
      }
    }
  }
#endif
  return plan_decode(in);
}

absl::Status paged_mla_decode(Device device, const KvCacheView& cache, const BlockTableView& table,
                              const MlaDecodeArgs& args, const DecodeOptions& options,
                              void* stream) {
  constexpr const char* fn = "paged_mla_decode";
  PAGEDKV_RETURN_IF_ERROR(check_device(fn, device));
  PAGEDKV_RETURN_IF_ERROR(validate_mla(fn, device, cache, args));
  PAGEDKV_RETURN_IF_ERROR(validate_table_shape(fn, device, cache, table));
  PAGEDKV_RETURN_IF_ERROR(
      validate_table_entries(fn, device, cache, table, [](int32_t, int32_t) { return 0; }));
  if (table.num_seqs == 0) return absl::OkStatus();
  if (args.q == nullptr || args.out == nullptr) return invalid(fn, "q or out is null");
  if (options.num_splits < 0 || options.num_splits > kMaxSplits) {
    return invalid(
        fn, absl::StrCat("num_splits ", options.num_splits, " outside [0, ", kMaxSplits, "]"));
  }
  if (device == Device::kCuda && args.max_context_len <= 0 && options.num_splits != 1) {
    return invalid(fn, absl::StrCat("max_context_len is ", args.max_context_len,
                                    "; CUDA needs it to plan split-K (or set num_splits = 1)"));
  }
  const DecodePlan plan = plan_mla_decode_for(device, cache, table, args, options);
  // MQA over the latent: one KV head whose V is the first kv_lora_rank elements of K.
  KvCacheView latent = cache;
  latent.v = latent.k;
  AttentionParams p;
  p.q_dtype = args.dtype;
  p.kv = latent;
  p.table = table;
  p.num_q_heads = args.num_heads;
  p.group_size = args.num_heads;
  p.score_scale = args.sm_scale * kLog2e;
  p.maybe_k_scale = args.maybe_kv_scale;
  p.maybe_v_scale = args.maybe_kv_scale;
  p.v_dim = args.kv_lora_rank;
  p.q = args.q;
  p.o = args.out;
  p.maybe_lse = args.maybe_lse;
#if PAGEDKV_HAVE_CUDA
  if (device == Device::kCuda) {
    PAGEDKV_RETURN_IF_ERROR(check_smem(
        fn, {.mla = true, .q_dtype = args.dtype, .kv_dtype = cache.dtype, .rows = args.num_heads}));
  }
  return run_decode(fn, device, p, plan, options, args.kv_lora_rank, stream,
                    internal::launch_mla_decode);
#else
  return run_decode(fn, device, p, plan, options, args.kv_lora_rank, stream, nullptr);
#endif
}

}  // namespace pagedkv
