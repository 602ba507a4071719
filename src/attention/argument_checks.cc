#include "attention/argument_checks.h"

#include <cmath>
#include <cstdint>

#include "common/status_macros.h"
#include "pagedkv/attention_params.h"

namespace pagedkv::internal {

absl::Status invalid(const char* fn, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(fn, ": ", what));
}

absl::Status check_device(const char* fn, Device device) {
  if (device == Device::kCuda && !cuda_device_available()) {
    return absl::FailedPreconditionError(
        absl::StrCat(fn, ": no usable CUDA device (", cuda_unavailable_reason(), ")"));
  }
  return absl::OkStatus();
}

absl::Status validate_cache(const char* fn, Device device, const KvCacheView& c, bool need_v) {
  if (c.num_kv_heads <= 0) return invalid(fn, absl::StrCat("num_kv_heads is ", c.num_kv_heads));
  if (c.block_size <= 0) return invalid(fn, absl::StrCat("block_size is ", c.block_size));
  if (c.num_blocks < 0) return invalid(fn, absl::StrCat("num_blocks is ", c.num_blocks));
  if (c.head_dim <= 0) return invalid(fn, absl::StrCat("head_dim is ", c.head_dim));
  if (c.num_blocks > 0 && (c.k == nullptr || (need_v && c.v == nullptr))) {
    return invalid(fn,
                   need_v ? "cache K or V pointer is null" : "cache latent (K) pointer is null");
  }
  if (c.block_stride <= 0 || c.head_stride <= 0 || c.token_stride <= 0) {
    return invalid(fn, absl::StrCat("cache strides must be positive (block ", c.block_stride,
                                    ", head ", c.head_stride, ", token ", c.token_stride, ")"));
  }
  if (device == Device::kCuda) {
    const int64_t elem = bytes_per_element(c.dtype);
    const int64_t bytes[] = {c.block_stride * elem, c.head_stride * elem, c.token_stride * elem,
                             c.head_dim * elem};
    for (int64_t b : bytes) {
      if (b % 16 != 0) {
        return invalid(fn, absl::StrCat("CUDA needs 16-byte aligned rows; a cache stride of ", b,
                                        " bytes is not a multiple of 16"));
      }
    }
    if (reinterpret_cast<uintptr_t>(c.k) % 16 != 0 ||
        (need_v && reinterpret_cast<uintptr_t>(c.v) % 16 != 0)) {
      return invalid(fn, "CUDA needs 16-byte aligned K and V pools");
    }
  }
  return absl::OkStatus();
}

absl::Status validate_dtypes(const char* fn, DType q_dtype, const KvCacheView& c) {
  if (q_dtype == DType::kFloat8E4M3) {
    return invalid(fn, "q/out dtype fp8_e4m3 is not supported (fp32, fp16, bf16 are)");
  }
  if (c.dtype != q_dtype && c.dtype != DType::kFloat8E4M3) {
    return invalid(fn, absl::StrCat("cache dtype ", dtype_name(c.dtype), " must be the q dtype (",
                                    dtype_name(q_dtype), ") or fp8_e4m3"));
  }
  return absl::OkStatus();
}

absl::Status validate_attention_types(const char* fn, DType q_dtype, const KvCacheView& c,
                                      int32_t num_q_heads) {
  PAGEDKV_RETURN_IF_ERROR(validate_dtypes(fn, q_dtype, c));
  if (c.head_dim != 64 && c.head_dim != 128 && c.head_dim != 256) {
    return invalid(fn, absl::StrCat("head_dim ", c.head_dim, " is not supported (64, 128, 256)"));
  }
  if (num_q_heads <= 0 || num_q_heads % c.num_kv_heads != 0) {
    return invalid(fn,
                   absl::StrCat("num_q_heads ", num_q_heads,
                                " must be a positive multiple of num_kv_heads ", c.num_kv_heads));
  }
  return absl::OkStatus();
}

absl::Status validate_table_shape(const char* fn, Device device, const KvCacheView& c,
                                  const BlockTableView& t) {
  if (t.num_seqs < 0) return invalid(fn, absl::StrCat("num_seqs is ", t.num_seqs));
  if (t.block_size != c.block_size) {
    return invalid(fn, absl::StrCat("table block_size ", t.block_size,
                                    " differs from the cache block_size ", c.block_size));
  }
  if (t.max_blocks < 0) return invalid(fn, absl::StrCat("max_blocks is ", t.max_blocks));
  if (t.num_seqs > 0 && (t.context_lens == nullptr || t.block_table == nullptr)) {
    return invalid(fn, "block_table or context_lens is null");
  }
  if (device == Device::kCuda && t.num_seqs > 0x7fffffff - 1) {
    return invalid(fn, "too many sequences");
  }
  return absl::OkStatus();
}

int32_t first_read_token(AttentionKind kind, int32_t window, int64_t pos) {
  return pos <= 0 ? 0 : static_cast<int32_t>(first_attended(kind, window, pos));
}

absl::Status validate_window(const char* fn, AttentionKind kind, int32_t window) {
  switch (kind) {
    case AttentionKind::kFull:
      return absl::OkStatus();
    case AttentionKind::kSlidingWindow:
    case AttentionKind::kChunkedLocal:
      if (window <= 0) {
        return invalid(fn, absl::StrCat("window ", window, " of a ", attention_kind_name(kind),
                                        " group must be > 0 tokens"));
      }
      return absl::OkStatus();
    case AttentionKind::kState:
      break;
  }
  return invalid(fn, absl::StrCat("attention kind ", static_cast<int>(kind),
                                  " is not full (0), sliding_window (1) or chunked_local (2)"));
}

absl::Status validate_sinks(const char* fn, Device device, const float* sinks,
                            int32_t num_q_heads) {
  if (sinks == nullptr || device == Device::kCuda) return absl::OkStatus();
  for (int32_t h = 0; h < num_q_heads; ++h) {
    if (std::isnan(sinks[h]) || sinks[h] == INFINITY) {
      return invalid(fn, absl::StrCat("sink logit of head ", h, " is ", sinks[h],
                                      "; must be finite (or -inf: no sink)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace pagedkv::internal
