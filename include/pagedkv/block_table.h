// File: pagedkv/block_table.h
//
// Block tables as kernels consume them: plain pointers and int32 arrays, no allocator
// object. KvCacheManager::build_block_tables() fills a BlockTables for a batch of
// sequences; kernels take the views by value. No Abseil or CUDA dependency.
//
// Two forms describe the same batch:
//   padded  block_table [num_seqs, max_blocks] int32, row-major, plus
//           context_lens [num_seqs] int32. Entries at or beyond
//           ceil(context_lens[i] / block_size) are padding (kPaddingBlock) and must not be
//           read.
//   CSR     indptr [num_seqs + 1], indices [indptr[num_seqs]] (the blocks of sequence i
//           are indices[indptr[i] .. indptr[i+1])), last_page_len [num_seqs]: valid tokens
//           in each sequence's last block, in [1, block_size], or 0 for an empty sequence.
//           This is the FlashInfer paged_kv layout.
#ifndef PAGEDKV_BLOCK_TABLE_H_
#define PAGEDKV_BLOCK_TABLE_H_

#include <cstdint>
#include <vector>

#include "pagedkv/types.h"

namespace pagedkv {

// Value written into padded table entries that hold no block. A valid id, so a kernel that
// over-reads by mistake stays inside the pool; tests fill unused K/V with NaN to catch it.
inline constexpr BlockId kPaddingBlock = 0;

// Padded block table of a batch. Passed by value to kernels.
struct BlockTableView {
  const int32_t* block_table = nullptr;   // [num_seqs, max_blocks]
  const int32_t* context_lens = nullptr;  // [num_seqs], tokens
  int32_t num_seqs = 0;
  int32_t max_blocks = 0;  // row stride of block_table, in entries
  int32_t block_size = 0;  // tokens per block
};

// CSR block table of a batch. Passed by value to kernels.
struct CsrBlockTableView {
  const int32_t* indptr = nullptr;         // [num_seqs + 1]
  const int32_t* indices = nullptr;        // [indptr[num_seqs]]
  const int32_t* last_page_len = nullptr;  // [num_seqs], tokens
  int32_t num_seqs = 0;
  int32_t block_size = 0;
};

// Number of table entries a context of `num_tokens` tokens occupies.
constexpr int32_t num_blocks_for_tokens(int64_t num_tokens, int32_t block_size) {
  return static_cast<int32_t>((num_tokens + block_size - 1) / block_size);
}

// Host buffers of both forms for one batch, reused across steps: rebuilding a batch of the
// same or smaller size allocates nothing.
struct BlockTables {
  std::vector<int32_t> block_table;    // [num_seqs, max_blocks]
  std::vector<int32_t> context_lens;   // [num_seqs]
  std::vector<int32_t> indptr;         // [num_seqs + 1]
  std::vector<int32_t> indices;        // [indptr[num_seqs]]
  std::vector<int32_t> last_page_len;  // [num_seqs]
  int32_t num_seqs = 0;
  int32_t max_blocks = 0;
  int32_t block_size = 0;

  BlockTableView padded() const {
    return {block_table.data(), context_lens.data(), num_seqs, max_blocks, block_size};
  }
  CsrBlockTableView csr() const {
    return {indptr.data(), indices.data(), last_page_len.data(), num_seqs, block_size};
  }
};

}  // namespace pagedkv

#endif  // PAGEDKV_BLOCK_TABLE_H_
