// CPU reference kernels. The arguments are validated by the wrappers in attention.cc;
// these assume valid, host-resident inputs.
#ifndef PAGEDKV_ATTENTION_CPU_KERNELS_H_
#define PAGEDKV_ATTENTION_CPU_KERNELS_H_

#include "pagedkv/attention_params.h"

namespace pagedkv::internal {

// Runs every (sequence, KV head, z) work item of `p` and writes o (and lse). For a decode
// split (p.num_splits > 1) the splits of one (sequence, KV head) run in order and are
// merged by merge_into() in split order, as the CUDA combine kernel does.
void paged_attention_cpu(const AttentionParams& p);

// Scatters the tokens of `p` into their slots.
void write_kv_cpu(const WriteKvParams& p);

}  // namespace pagedkv::internal

#endif  // PAGEDKV_ATTENTION_CPU_KERNELS_H_
