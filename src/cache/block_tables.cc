// KvCacheManager: batched block tables for kernels, padded and CSR.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cache/sequence.h"
#include "common/status_macros.h"
#include "pagedkv/kv_cache_manager.h"

namespace pagedkv {

using internal::Sequence;

namespace {

// The blocks a kernel reads for `seq`: those holding its computed tokens.
std::span<const BlockId> context_blocks(const Sequence& seq, int32_t block_size) {
  return std::span<const BlockId>(seq.blocks)
      .first(num_blocks_for_tokens(seq.num_computed, block_size));
}

absl::Status require_running(const Sequence& seq, const char* caller) {
  if (seq.state == SequenceState::kRunning) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(caller, ": sequence ", seq.id, " is not running"));
}

}  // namespace

absl::Status KvCacheManager::write_block_tables(std::span<const SeqId> seqs, int32_t max_blocks,
                                                std::span<int32_t> block_table,
                                                std::span<int32_t> context_lens) const {
  const int64_t table_entries = static_cast<int64_t>(seqs.size()) * max_blocks;
  if (max_blocks < 0 || static_cast<int64_t>(block_table.size()) < table_entries ||
      context_lens.size() < seqs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("write_block_tables: ", seqs.size(), " sequences x max_blocks ", max_blocks,
                     " need ", table_entries, " table entries and ", seqs.size(),
                     " context lengths; got ", block_table.size(), " and ", context_lens.size()));
  }
  // Validate every sequence before writing anything.
  for (const SeqId id : seqs) {
    PAGEDKV_ASSIGN_OR_RETURN(const Sequence* s, find_or_error(id, "write_block_tables"));
    PAGEDKV_RETURN_IF_ERROR(require_running(*s, "write_block_tables"));
    const int32_t needed = num_blocks_for_tokens(s->num_computed, options_.block_size);
    if (needed > max_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("write_block_tables: sequence ", id, " needs ",
                                                     needed, " entries, more than max_blocks ",
                                                     max_blocks));
    }
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Sequence& s = *find(seqs[i]);
    const std::span<const BlockId> blocks = context_blocks(s, options_.block_size);
    const auto row = block_table.subspan(i * max_blocks, max_blocks);
    std::copy(blocks.begin(), blocks.end(), row.begin());
    std::fill(row.begin() + blocks.size(), row.end(), kPaddingBlock);
    context_lens[i] = s.num_computed;
  }
  return absl::OkStatus();
}

absl::Status KvCacheManager::write_csr_block_tables(std::span<const SeqId> seqs,
                                                    std::span<int32_t> indptr,
                                                    std::span<int32_t> indices,
                                                    std::span<int32_t> last_page_len) const {
  int64_t total = 0;
  for (const SeqId id : seqs) {
    PAGEDKV_ASSIGN_OR_RETURN(const Sequence* s, find_or_error(id, "write_csr_block_tables"));
    PAGEDKV_RETURN_IF_ERROR(require_running(*s, "write_csr_block_tables"));
    total += num_blocks_for_tokens(s->num_computed, options_.block_size);
  }
  if (indptr.size() < seqs.size() + 1 || static_cast<int64_t>(indices.size()) < total ||
      last_page_len.size() < seqs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("write_csr_block_tables: ", seqs.size(), " sequences need indptr[",
                     seqs.size() + 1, "], indices[", total, "], last_page_len[", seqs.size(),
                     "]; got ", indptr.size(), ", ", indices.size(), ", ", last_page_len.size()));
  }
  const int32_t bs = options_.block_size;
  int32_t offset = 0;
  indptr[0] = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Sequence& s = *find(seqs[i]);
    const std::span<const BlockId> blocks = context_blocks(s, bs);
    std::copy(blocks.begin(), blocks.end(), indices.begin() + offset);
    offset += static_cast<int32_t>(blocks.size());
    indptr[i + 1] = offset;
    last_page_len[i] =
        blocks.empty() ? 0 : s.num_computed - (static_cast<int32_t>(blocks.size()) - 1) * bs;
  }
  return absl::OkStatus();
}

absl::Status KvCacheManager::build_block_tables(std::span<const SeqId> seqs,
                                                BlockTables* out) const {
  int32_t max_blocks = 0;
  int32_t total = 0;
  for (const SeqId id : seqs) {
    PAGEDKV_ASSIGN_OR_RETURN(const Sequence* s, find_or_error(id, "build_block_tables"));
    PAGEDKV_RETURN_IF_ERROR(require_running(*s, "build_block_tables"));
    const int32_t n = num_blocks_for_tokens(s->num_computed, options_.block_size);
    max_blocks = std::max(max_blocks, n);
    total += n;
  }
  const auto num_seqs = static_cast<int32_t>(seqs.size());
  out->num_seqs = num_seqs;
  out->max_blocks = max_blocks;
  out->block_size = options_.block_size;
  out->block_table.resize(static_cast<size_t>(num_seqs) * max_blocks);
  out->context_lens.resize(num_seqs);
  out->indptr.resize(num_seqs + 1);
  out->indices.resize(total);
  out->last_page_len.resize(num_seqs);
  PAGEDKV_RETURN_IF_ERROR(
      write_block_tables(seqs, max_blocks, out->block_table, out->context_lens));
  return write_csr_block_tables(seqs, out->indptr, out->indices, out->last_page_len);
}

}  // namespace pagedkv
