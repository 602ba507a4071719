// The kernels through DLPack: write_kv, paged_decode_attention, paged_extend_attention,
// paged_mla_decode on tensors of any framework (PyTorch, CuPy, JAX, NumPy), on CPU (the reference
// kernels) or CUDA (launched on the given stream, by default the current stream of the framework
// that owns the tensors). The GIL is released while a kernel runs.
#include <nanobind/stl/optional.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "bindings.h"
#include "pagedkv/attention.h"
#include "tensors.h"

#ifdef PAGEDKV_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace pagedkv::python {
namespace {

using namespace nb::literals;

constexpr std::initializer_list<DType> kQueryDtypes = {DType::kFloat32, DType::kFloat16,
                                                       DType::kBFloat16};

// The CUDA stream to launch on: `stream` when given, else the current stream of the
// framework holding the tensors (PyTorch, then CuPy, when loaded), else the default stream.
void* resolve_stream(const ArgCheck& check, std::optional<uintptr_t> stream) {
  if (stream.has_value()) return reinterpret_cast<void*>(*stream);
  if (check.device() != Device::kCuda) return nullptr;
  nb::object modules = nb::module_::import_("sys").attr("modules");
  nb::object torch = modules.attr("get")("torch");
  if (!torch.is_none()) {
    return reinterpret_cast<void*>(nb::cast<uintptr_t>(
        torch.attr("cuda").attr("current_stream")(check.device_id()).attr("cuda_stream")));
  }
  nb::object cupy = modules.attr("get")("cupy");
  if (!cupy.is_none()) {
    return reinterpret_cast<void*>(
        nb::cast<uintptr_t>(cupy.attr("cuda").attr("get_current_stream")().attr("ptr")));
  }
  return nullptr;
}

// Makes the tensors' CUDA device current for the call (the kernels use the current device).
class DeviceScope {
 public:
  explicit DeviceScope(const ArgCheck& check) {
#ifdef PAGEDKV_HAVE_CUDA
    if (check.device() != Device::kCuda) return;
    if (cudaGetDevice(&previous_) != cudaSuccess) return;
    if (previous_ != check.device_id()) {
      if (cudaSetDevice(check.device_id()) != cudaSuccess) {
        check.fail(absl::StrCat("cannot make CUDA device ", check.device_id(), " current"));
      }
      switched_ = true;
    }
#else
    if (check.device() == Device::kCuda) {
      check.fail(absl::StrCat("tensors are on CUDA but ", cuda_unavailable_reason()));
    }
#endif
  }
  ~DeviceScope() {
#ifdef PAGEDKV_HAVE_CUDA
    if (switched_) cudaSetDevice(previous_);
#endif
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

// The padded block table and context lengths of `num_seqs` sequences.
BlockTableView table_view(ArgCheck& check, const Tensor& block_table, const Tensor& context_lens,
                          int64_t num_seqs, int32_t block_size) {
  check.device_of(block_table, "block_table");
  check.device_of(context_lens, "context_lens");
  check.int_dtype(block_table, "block_table", 32);
  check.int_dtype(context_lens, "context_lens", 32);
  check.ndim(block_table, "block_table", 2);
  check.ndim(context_lens, "context_lens", 1);
  check.dim(block_table, "block_table", 0, num_seqs, "num_seqs");
  check.dim(context_lens, "context_lens", 0, num_seqs, "num_seqs");
  check.contiguous(block_table, "block_table");
  check.contiguous(context_lens, "context_lens");
  return {static_cast<const int32_t*>(block_table.data()),
          static_cast<const int32_t*>(context_lens.data()), static_cast<int32_t>(num_seqs),
          static_cast<int32_t>(block_table.shape(1)), block_size};
}

// q (and out, same shape and dtype): [rows, num_q_heads, head_dim], contiguous.
DType check_query(ArgCheck& check, const Tensor& q, const Tensor& out, int32_t head_dim) {
  check.device_of(q, "q");
  check.device_of(out, "out");
  check.ndim(q, "q", 3);
  check.dim(q, "q", 2, head_dim, "the cache's head_dim");
  check.contiguous(q, "q");
  check.contiguous(out, "out");
  const DType dtype = check.float_dtype(q, "q", kQueryDtypes);
  if (out.dtype() != q.dtype()) check.fail("out must have q's dtype");
  check.ndim(out, "out", 3);
  for (size_t i = 0; i < 3; ++i) check.dim(out, "out", i, static_cast<int64_t>(q.shape(i)), "q's");
  return dtype;
}

float* check_lse(ArgCheck& check, const Tensor& lse, const Tensor& q) {
  if (!lse.is_valid()) return nullptr;
  check.device_of(lse, "lse");
  check.float_dtype(lse, "lse", {DType::kFloat32});
  check.ndim(lse, "lse", 2);
  check.dim(lse, "lse", 0, static_cast<int64_t>(q.shape(0)), "q's rows");
  check.dim(lse, "lse", 1, static_cast<int64_t>(q.shape(1)), "num_q_heads");
  check.contiguous(lse, "lse");
  return static_cast<float*>(lse.data());
}

// Sink logits: fp32 [num_q_heads] on the tensors' device, or None.
const float* check_sinks(ArgCheck& check, const Tensor& sinks, int64_t num_q_heads) {
  if (!sinks.is_valid()) return nullptr;
  check.device_of(sinks, "sinks");
  check.float_dtype(sinks, "sinks", {DType::kFloat32});
  check.ndim(sinks, "sinks", 1);
  check.dim(sinks, "sinks", 0, num_q_heads, "num_q_heads");
  check.contiguous(sinks, "sinks");
  return static_cast<const float*>(sinks.data());
}

// --- the calls --------------------------------------------------------------------------

void py_write_kv(const Tensor& k, const Tensor& v, const Tensor& slot_mapping,
                 const Tensor& k_cache, const Tensor& v_cache, KvLayout layout,
                 std::optional<DType> kv_dtype, const Tensor& k_scale, const Tensor& v_scale,
                 std::optional<uintptr_t> stream) {
  ArgCheck check("write_kv");
  if (v.is_valid() != v_cache.is_valid()) {
    check.fail(v.is_valid() ? "v_cache is None but v is given (K only: both None)"
                            : "v is None but v_cache is given (K only: both None)");
  }
  const KvCacheView cache = check.cache_view(k_cache, v_cache, layout, kv_dtype);
  check.device_of(k, "k");
  check.device_of(slot_mapping, "slot_mapping");
  check.ndim(k, "k", 3);
  const int64_t num_tokens = static_cast<int64_t>(k.shape(0));
  check.dim(k, "k", 1, cache.num_kv_heads, "num_kv_heads");
  check.dim(k, "k", 2, cache.head_dim, "head_dim");
  check.contiguous(k, "k");
  const DType src_dtype = check.float_dtype(k, "k", kQueryDtypes);
  if (v.is_valid()) {
    check.device_of(v, "v");
    check.contiguous(v, "v");
    if (v.dtype() != k.dtype()) check.fail("v must have k's dtype");
    check.ndim(v, "v", 3);
    for (size_t i = 0; i < 3; ++i) check.dim(v, "v", i, static_cast<int64_t>(k.shape(i)), "k's");
  }
  check.int_dtype(slot_mapping, "slot_mapping", 64);
  check.ndim(slot_mapping, "slot_mapping", 1);
  check.dim(slot_mapping, "slot_mapping", 0, num_tokens, "num_tokens");
  check.contiguous(slot_mapping, "slot_mapping");
  WriteKvArgs args;
  args.k = k.data();
  args.v = v.is_valid() ? v.data() : nullptr;
  args.src_dtype = src_dtype;
  args.slot_mapping = static_cast<const int64_t*>(slot_mapping.data());
  args.num_tokens = static_cast<int32_t>(num_tokens);
  args.maybe_k_scale = check.scale(k_scale, "k_scale");
  args.maybe_v_scale = check.scale(v_scale, "v_scale");
  void* s = resolve_stream(check, stream);
  DeviceScope scope(check);
  absl::Status status;
  {
    nb::gil_scoped_release release;
    status = write_kv(check.device(), cache, args, s);
  }
  raise_if_error(status);
}

struct DecodeCall {
  ArgCheck check{"paged_decode_attention"};
  KvCacheView cache;
  BlockTableView table;
  DecodeArgs args;
  DecodeOptions options;
};

DecodeCall prepare_decode(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                          const Tensor& block_table, const Tensor& context_lens, const Tensor& out,
                          KvLayout layout, std::optional<DType> kv_dtype, float sm_scale,
                          const Tensor& k_scale, const Tensor& v_scale, int32_t max_context_len,
                          int64_t total_context_len, int32_t num_splits, AttentionKind kind,
                          int32_t window, const Tensor& sinks) {
  DecodeCall call;
  ArgCheck& check = call.check;
  call.cache = check.cache_view(k_cache, v_cache, layout, kv_dtype);
  call.args.dtype = check_query(check, q, out, call.cache.head_dim);
  call.table = table_view(check, block_table, context_lens, static_cast<int64_t>(q.shape(0)),
                          call.cache.block_size);
  call.args.q = q.data();
  call.args.out = out.data();
  call.args.num_q_heads = static_cast<int32_t>(q.shape(1));
  call.args.sm_scale = sm_scale;
  call.args.maybe_k_scale = check.scale(k_scale, "k_scale");
  call.args.maybe_v_scale = check.scale(v_scale, "v_scale");
  call.args.max_context_len = max_context_len;
  call.args.total_context_len = total_context_len;
  call.args.kind = kind;
  call.args.window = window;
  call.args.maybe_sinks = check_sinks(check, sinks, call.args.num_q_heads);
  call.options.num_splits = num_splits;
  return call;
}

void py_paged_decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                               const Tensor& block_table, const Tensor& context_lens,
                               const Tensor& out, KvLayout layout, std::optional<DType> kv_dtype,
                               const Tensor& lse, float sm_scale, const Tensor& k_scale,
                               const Tensor& v_scale, int32_t max_context_len,
                               int64_t total_context_len, int32_t num_splits,
                               const Tensor& workspace, AttentionKind kind, int32_t window,
                               const Tensor& sinks, std::optional<uintptr_t> stream) {
  DecodeCall call = prepare_decode(q, k_cache, v_cache, block_table, context_lens, out, layout,
                                   kv_dtype, sm_scale, k_scale, v_scale, max_context_len,
                                   total_context_len, num_splits, kind, window, sinks);
  call.args.maybe_lse = check_lse(call.check, lse, q);
  if (workspace.is_valid()) {
    call.check.device_of(workspace, "workspace");
    call.check.contiguous(workspace, "workspace");
    call.options.maybe_workspace = workspace.data();
    call.options.workspace_bytes = static_cast<int64_t>(workspace.nbytes());
  }
  void* s = resolve_stream(call.check, stream);
  DeviceScope scope(call.check);
  absl::Status status;
  {
    nb::gil_scoped_release release;
    status = paged_decode_attention(call.check.device(), call.cache, call.table, call.args,
                                    call.options, s);
  }
  raise_if_error(status);
}

int64_t py_decode_workspace_bytes(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                  const Tensor& block_table, const Tensor& context_lens,
                                  KvLayout layout, std::optional<DType> kv_dtype,
                                  int32_t max_context_len, int64_t total_context_len,
                                  int32_t num_splits, AttentionKind kind, int32_t window) {
  DecodeCall call = prepare_decode(q, k_cache, v_cache, block_table, context_lens, q, layout,
                                   kv_dtype, 0.0f, Tensor(), Tensor(), max_context_len,
                                   total_context_len, num_splits, kind, window, Tensor());
  DeviceScope scope(call.check);
  const DecodePlan plan =
      plan_decode_for(call.check.device(), call.cache, call.table, call.args, call.options);
  return decode_workspace_bytes(plan, call.table.num_seqs, call.args.num_q_heads,
                                call.cache.head_dim);
}

void py_paged_extend_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                               const Tensor& block_table, const Tensor& context_lens,
                               const Tensor& qo_indptr, const Tensor& out, KvLayout layout,
                               std::optional<DType> kv_dtype, const Tensor& lse, float sm_scale,
                               const Tensor& k_scale, const Tensor& v_scale, int32_t max_query_len,
                               AttentionKind kind, int32_t window, const Tensor& sinks,
                               std::optional<uintptr_t> stream) {
  ArgCheck check("paged_extend_attention");
  const KvCacheView cache = check.cache_view(k_cache, v_cache, layout, kv_dtype);
  ExtendArgs args;
  args.dtype = check_query(check, q, out, cache.head_dim);
  check.device_of(qo_indptr, "qo_indptr");
  check.int_dtype(qo_indptr, "qo_indptr", 32);
  check.ndim(qo_indptr, "qo_indptr", 1);
  check.contiguous(qo_indptr, "qo_indptr");
  const int64_t num_seqs = static_cast<int64_t>(qo_indptr.shape(0)) - 1;
  if (num_seqs < 0) check.fail("qo_indptr needs num_seqs + 1 entries, has 0");
  const BlockTableView table =
      table_view(check, block_table, context_lens, num_seqs, cache.block_size);
  if (check.device() == Device::kCpu) {  // the kernels trust qo_indptr's last entry
    const int32_t* indptr = static_cast<const int32_t*>(qo_indptr.data());
    if (indptr[num_seqs] != static_cast<int64_t>(q.shape(0))) {
      check.fail(
          absl::StrCat("qo_indptr[-1] = ", indptr[num_seqs], " but q has ", q.shape(0), " rows"));
    }
  }
  args.q = q.data();
  args.out = out.data();
  args.maybe_lse = check_lse(check, lse, q);
  args.num_q_heads = static_cast<int32_t>(q.shape(1));
  args.sm_scale = sm_scale;
  args.maybe_k_scale = check.scale(k_scale, "k_scale");
  args.maybe_v_scale = check.scale(v_scale, "v_scale");
  args.qo_indptr = static_cast<const int32_t*>(qo_indptr.data());
  args.max_query_len = max_query_len;
  args.kind = kind;
  args.window = window;
  args.maybe_sinks = check_sinks(check, sinks, args.num_q_heads);
  void* s = resolve_stream(check, stream);
  DeviceScope scope(check);
  absl::Status status;
  {
    nb::gil_scoped_release release;
    status = paged_extend_attention(check.device(), cache, table, args, s);
  }
  raise_if_error(status);
}

struct MlaCall {
  ArgCheck check{"paged_mla_decode"};
  KvCacheView cache;
  BlockTableView table;
  MlaDecodeArgs args;
  DecodeOptions options;
};

// q [num_seqs, num_heads, kv_lora_rank + rope dims] and, when given, out [num_seqs,
// num_heads, kv_lora_rank] against a latent cache (one vector per token: num_kv_heads 1).
MlaCall prepare_mla(const Tensor& q, const Tensor& kv_cache, const Tensor& block_table,
                    const Tensor& context_lens, const Tensor& out, int32_t kv_lora_rank,
                    KvLayout layout, std::optional<DType> kv_dtype, int32_t max_context_len,
                    int64_t total_context_len, int32_t num_splits) {
  MlaCall call;
  ArgCheck& check = call.check;
  call.cache = check.cache_view(kv_cache, Tensor(), layout, kv_dtype);
  const int32_t latent = call.cache.head_dim;
  if (kv_lora_rank < 1 || kv_lora_rank > latent) {
    check.fail(absl::StrCat("kv_lora_rank ", kv_lora_rank, " must be in [1, ", latent,
                            "] (the latent cache's head_dim)"));
  }
  check.device_of(q, "q");
  check.ndim(q, "q", 3);
  check.dim(q, "q", 2, latent, "the latent cache's head_dim");
  check.contiguous(q, "q");
  call.args.dtype = check.float_dtype(q, "q", kQueryDtypes);
  if (out.is_valid()) {
    check.device_of(out, "out");
    check.contiguous(out, "out");
    if (out.dtype() != q.dtype()) check.fail("out must have q's dtype");
    check.ndim(out, "out", 3);
    check.dim(out, "out", 0, static_cast<int64_t>(q.shape(0)), "q's");
    check.dim(out, "out", 1, static_cast<int64_t>(q.shape(1)), "q's");
    check.dim(out, "out", 2, kv_lora_rank, "kv_lora_rank");
    call.args.out = out.data();
  }
  call.table = table_view(check, block_table, context_lens, static_cast<int64_t>(q.shape(0)),
                          call.cache.block_size);
  call.args.q = q.data();
  call.args.num_heads = static_cast<int32_t>(q.shape(1));
  call.args.kv_lora_rank = kv_lora_rank;
  call.args.qk_rope_head_dim = latent - kv_lora_rank;
  call.args.max_context_len = max_context_len;
  call.args.total_context_len = total_context_len;
  call.options.num_splits = num_splits;
  return call;
}

void py_paged_mla_decode(const Tensor& q, const Tensor& kv_cache, const Tensor& block_table,
                         const Tensor& context_lens, const Tensor& out, int32_t kv_lora_rank,
                         float sm_scale, KvLayout layout, std::optional<DType> kv_dtype,
                         const Tensor& kv_scale, const Tensor& lse, int32_t max_context_len,
                         int64_t total_context_len, int32_t num_splits, const Tensor& workspace,
                         std::optional<uintptr_t> stream) {
  MlaCall call = prepare_mla(q, kv_cache, block_table, context_lens, out, kv_lora_rank, layout,
                             kv_dtype, max_context_len, total_context_len, num_splits);
  ArgCheck& check = call.check;
  call.args.sm_scale = sm_scale;
  call.args.maybe_kv_scale = check.scale(kv_scale, "kv_scale");
  call.args.maybe_lse = check_lse(check, lse, q);
  if (workspace.is_valid()) {
    check.device_of(workspace, "workspace");
    check.contiguous(workspace, "workspace");
    call.options.maybe_workspace = workspace.data();
    call.options.workspace_bytes = static_cast<int64_t>(workspace.nbytes());
  }
  void* s = resolve_stream(check, stream);
  DeviceScope scope(check);
  absl::Status status;
  {
    nb::gil_scoped_release release;
    status = paged_mla_decode(check.device(), call.cache, call.table, call.args, call.options, s);
  }
  raise_if_error(status);
}

int64_t py_mla_decode_workspace_bytes(const Tensor& q, const Tensor& kv_cache,
                                      const Tensor& block_table, const Tensor& context_lens,
                                      int32_t kv_lora_rank, KvLayout layout,
                                      std::optional<DType> kv_dtype, int32_t max_context_len,
                                      int64_t total_context_len, int32_t num_splits) {
  MlaCall call = prepare_mla(q, kv_cache, block_table, context_lens, Tensor(), kv_lora_rank, layout,
                             kv_dtype, max_context_len, total_context_len, num_splits);
  DeviceScope scope(call.check);
  const DecodePlan plan =
      plan_mla_decode_for(call.check.device(), call.cache, call.table, call.args, call.options);
  return decode_workspace_bytes(plan, call.table.num_seqs, call.args.num_heads, kv_lora_rank);
}

}  // namespace

void bind_kernels(nb::module_& m) {
  m.def("write_kv", &py_write_kv, "k"_a, "v"_a.none(), "slot_mapping"_a, "k_cache"_a,
        "v_cache"_a.none(), nb::kw_only(), "layout"_a = KvLayout::kHND,
        "kv_dtype"_a.none() = nb::none(), "k_scale"_a.none() = nb::none(),
        "v_scale"_a.none() = nb::none(), "stream"_a.none() = nb::none(),
        "Scatters new tokens' K and V ([num_tokens, num_kv_heads, head_dim], fp32/fp16/bf16)\n"
        "into one layer's cache through slot_mapping (int64 [num_tokens]; negative slots are\n"
        "skipped). k_cache / v_cache: 4-D in `layout`; kv_dtype=DType.FLOAT8_E4M3 for uint8\n"
        "storage of fp8. Scales: 1-element fp32 tensors on the same device. v and v_cache\n"
        "None (both): K only, the latents of an MLA cache (paged_mla_decode).");
  m.def("paged_decode_attention", &py_paged_decode_attention, "q"_a, "k_cache"_a, "v_cache"_a,
        "block_table"_a, "context_lens"_a, "out"_a, nb::kw_only(), "layout"_a = KvLayout::kHND,
        "kv_dtype"_a.none() = nb::none(), "lse"_a.none() = nb::none(), "sm_scale"_a = 0.0f,
        "k_scale"_a.none() = nb::none(), "v_scale"_a.none() = nb::none(), "max_context_len"_a = 0,
        "total_context_len"_a = 0, "num_splits"_a = 0, "workspace"_a.none() = nb::none(),
        "kind"_a = AttentionKind::kFull, "window"_a = 0, "sinks"_a.none() = nb::none(),
        "stream"_a.none() = nb::none(),
        "out[i, h] = softmax(sm_scale * q[i, h] . K^T) V over sequence i's context_lens[i]\n"
        "tokens (kind SLIDING_WINDOW / CHUNKED_LOCAL with `window` tokens: those its query\n"
        "attends to, so a windowed group's released blocks are never read), read through\n"
        "block_table (int32 [num_seqs, max_blocks]). sinks: optional fp32 [num_q_heads] sink\n"
        "logits (gpt-oss), each joining its head's softmax denominator. q/out: [num_seqs,\n"
        "num_q_heads, head_dim]. lse: optional fp32 [num_seqs, num_q_heads]. max_context_len /\n"
        "total_context_len: bounds of the context lengths for the split plan (required on CUDA\n"
        "when splitting; 0 on CPU computes them). On CUDA, pass a workspace of\n"
        "decode_workspace_bytes() bytes for CUDA-graph capture and concurrent streams; stream\n"
        "defaults to the current PyTorch/CuPy stream of the tensors' device.");
  m.def("decode_workspace_bytes", &py_decode_workspace_bytes, "q"_a, "k_cache"_a, "v_cache"_a,
        "block_table"_a, "context_lens"_a, nb::kw_only(), "layout"_a = KvLayout::kHND,
        "kv_dtype"_a.none() = nb::none(), "max_context_len"_a = 0, "total_context_len"_a = 0,
        "num_splits"_a = 0, "kind"_a = AttentionKind::kFull, "window"_a = 0,
        "Bytes of split-K workspace paged_decode_attention() needs for these arguments.");
  m.def("paged_extend_attention", &py_paged_extend_attention, "q"_a, "k_cache"_a, "v_cache"_a,
        "block_table"_a, "context_lens"_a, "qo_indptr"_a, "out"_a, nb::kw_only(),
        "layout"_a = KvLayout::kHND, "kv_dtype"_a.none() = nb::none(), "lse"_a.none() = nb::none(),
        "sm_scale"_a = 0.0f, "k_scale"_a.none() = nb::none(), "v_scale"_a.none() = nb::none(),
        "max_query_len"_a = 0, "kind"_a = AttentionKind::kFull, "window"_a = 0,
        "sinks"_a.none() = nb::none(), "stream"_a.none() = nb::none(),
        "Prefill/extend attention: the new tokens of sequence i (q rows qo_indptr[i] ..\n"
        "qo_indptr[i+1], int32 [num_seqs + 1]) attend causally to its context_lens[i] tokens,\n"
        "the new ones included (write them with write_kv first); with a windowed kind each\n"
        "new token attends to its own window. sinks as in paged_decode_attention().");
  m.def("paged_mla_decode", &py_paged_mla_decode, "q"_a, "kv_cache"_a, "block_table"_a,
        "context_lens"_a, "out"_a, nb::kw_only(), "kv_lora_rank"_a, "sm_scale"_a,
        "layout"_a = KvLayout::kHND, "kv_dtype"_a.none() = nb::none(),
        "kv_scale"_a.none() = nb::none(), "lse"_a.none() = nb::none(), "max_context_len"_a = 0,
        "total_context_len"_a = 0, "num_splits"_a = 0, "workspace"_a.none() = nb::none(),
        "stream"_a.none() = nb::none(),
        "Multi-head latent attention decode (DeepSeek-V2/V3) over a latent cache: kv_cache is\n"
        "one layer's pool of one latent vector per token (4-D, num_kv_heads 1, head_dim\n"
        "kv_lora_rank + rope dims; write it with write_kv(k, None, slots, kv_cache, None)).\n"
        "q [num_seqs, num_heads, head_dim]: the absorbed queries; out [num_seqs, num_heads,\n"
        "kv_lora_rank]: softmax(sm_scale * q . latent) over the sequence's tokens times their\n"
        "first kv_lora_rank elements. sm_scale is required (> 0). kv_scale: fp8 caches.\n"
        "CUDA serves kv_lora_rank 512 + 64 rope dims with fp16/bf16 q; CPU any dims.");
  m.def("mla_decode_workspace_bytes", &py_mla_decode_workspace_bytes, "q"_a, "kv_cache"_a,
        "block_table"_a, "context_lens"_a, nb::kw_only(), "kv_lora_rank"_a,
        "layout"_a = KvLayout::kHND, "kv_dtype"_a.none() = nb::none(), "max_context_len"_a = 0,
        "total_context_len"_a = 0, "num_splits"_a = 0,
        "Bytes of split-K workspace paged_mla_decode() needs for these arguments.");
}

}  // namespace pagedkv::python
