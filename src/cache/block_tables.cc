// CacheCoordinator: batched block tables for kernels, padded and CSR, one layer group's at
// a time, and a state group's slots. A windowed group's released entries read as
// kPaddingBlock: kernels start at the window of their queries and never read them.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cache/cache_coordinator.h"
#include "common/status_macros.h"

namespace pagedkv::internal {

namespace {

// The table entries of `seq` in `group` that hold its computed tokens.
std::span<const BlockId> context_blocks(const Sequence& seq, int32_t group, int32_t block_size) {
  return std::span<const BlockId>(seq.tables[group].blocks)
      .first(num_blocks_for_tokens(seq.num_computed, block_size));
}

// Copies a table, released entries as kPaddingBlock.
template <typename Out>
void copy_table(const Sequence& seq, int32_t group, std::span<const BlockId> blocks, Out out) {
  const auto released = static_cast<size_t>(seq.tables[group].first_held);
  out = std::fill_n(out, released, kPaddingBlock);
  std::copy(blocks.begin() + released, blocks.end(), out);
}

}  // namespace

// Block tables are attention groups' (a state group's are write_state_slots()).
absl::Status CacheCoordinator::check_attention_group(int32_t group, const char* caller) const {
  PAGEDKV_RETURN_IF_ERROR(check_group(group, caller));
  if (groups_[group]->kind() != AttentionKind::kState) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(caller, ": layer group ", group, " is a state group; use write_state_slots()"));
}

absl::StatusOr<const Sequence*> CacheCoordinator::running_sequence(SeqId seq,
                                                                   const char* caller) const {
  PAGEDKV_ASSIGN_OR_RETURN(const Sequence* s, find_or_error(seq, caller));
  if (s->state != SequenceState::kRunning) {
    return absl::FailedPreconditionError(
        absl::StrCat(caller, ": sequence ", seq, " is not running"));
  }
  // No kernel may read K/V that a transfer is still writing.
  if (s->num_importing > 0) [[unlikely]] {
    return absl::FailedPreconditionError(
        absl::StrCat(caller, ": sequence ", seq, " has ", s->num_importing,
                     " imported tokens pending; complete_import() first"));
  }
  return s;
}

// Looks every sequence up once, into batch_, and checks that it is running.
absl::Status CacheCoordinator::resolve_running(std::span<const SeqId> seqs,
                                               const char* caller) const {
  batch_.clear();
  for (const SeqId id : seqs) {
    PAGEDKV_ASSIGN_OR_RETURN(const Sequence* s, running_sequence(id, caller));
    batch_.push_back(s);
  }
  return absl::OkStatus();
}

void CacheCoordinator::fill_padded(int32_t group, int32_t max_blocks,
                                   std::span<int32_t> block_table,
                                   std::span<int32_t> context_lens) const {
  for (size_t i = 0; i < batch_.size(); ++i) {
    const std::span<const BlockId> blocks = context_blocks(*batch_[i], group, shared_.block_size);
    const auto row = block_table.subspan(i * max_blocks, max_blocks);
    copy_table(*batch_[i], group, blocks, row.begin());
    std::fill(row.begin() + blocks.size(), row.end(), kPaddingBlock);
    context_lens[i] = batch_[i]->num_computed;
  }
}

void CacheCoordinator::fill_csr(int32_t group, std::span<int32_t> indptr,
                                std::span<int32_t> indices,
                                std::span<int32_t> last_page_len) const {
  const int32_t bs = shared_.block_size;
  int32_t offset = 0;
  indptr[0] = 0;
  for (size_t i = 0; i < batch_.size(); ++i) {
    const std::span<const BlockId> blocks = context_blocks(*batch_[i], group, bs);
    copy_table(*batch_[i], group, blocks, indices.begin() + offset);
    offset += static_cast<int32_t>(blocks.size());
    indptr[i + 1] = offset;
    last_page_len[i] =
        blocks.empty() ? 0
                       : batch_[i]->num_computed - (static_cast<int32_t>(blocks.size()) - 1) * bs;
  }
}

absl::Status CacheCoordinator::write_block_tables(std::span<const SeqId> seqs, int32_t max_blocks,
                                                  std::span<int32_t> block_table,
                                                  std::span<int32_t> context_lens,
                                                  int32_t group) const {
  PAGEDKV_RETURN_IF_ERROR(check_attention_group(group, "write_block_tables"));
  const int64_t table_entries = static_cast<int64_t>(seqs.size()) * max_blocks;
  if (max_blocks < 0 || static_cast<int64_t>(block_table.size()) < table_entries ||
      context_lens.size() < seqs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("write_block_tables: ", seqs.size(), " sequences x max_blocks ", max_blocks,
                     " need ", table_entries, " table entries and ", seqs.size(),
                     " context lengths; got ", block_table.size(), " and ", context_lens.size()));
  }
  // Validate every sequence, in order, before writing anything.
  batch_.clear();
  for (const SeqId id : seqs) {
    PAGEDKV_ASSIGN_OR_RETURN(const Sequence* s, running_sequence(id, "write_block_tables"));
    const int32_t needed = num_blocks_for_tokens(s->num_computed, shared_.block_size);
    if (needed > max_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("write_block_tables: sequence ", id, " needs ",
                                                     needed, " entries, more than max_blocks ",
                                                     max_blocks));
    }
    batch_.push_back(s);
  }
  fill_padded(group, max_blocks, block_table, context_lens);
  return absl::OkStatus();
}

absl::Status CacheCoordinator::write_csr_block_tables(std::span<const SeqId> seqs,
                                                      std::span<int32_t> indptr,
                                                      std::span<int32_t> indices,
                                                      std::span<int32_t> last_page_len,
                                                      int32_t group) const {
  PAGEDKV_RETURN_IF_ERROR(check_attention_group(group, "write_csr_block_tables"));
  PAGEDKV_RETURN_IF_ERROR(resolve_running(seqs, "write_csr_block_tables"));
  int64_t total = 0;
  for (const Sequence* s : batch_)
    total += num_blocks_for_tokens(s->num_computed, shared_.block_size);
  if (indptr.size() < seqs.size() + 1 || static_cast<int64_t>(indices.size()) < total ||
      last_page_len.size() < seqs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("write_csr_block_tables: ", seqs.size(), " sequences need indptr[",
                     seqs.size() + 1, "], indices[", total, "], last_page_len[", seqs.size(),
                     "]; got ", indptr.size(), ", ", indices.size(), ", ", last_page_len.size()));
  }
  fill_csr(group, indptr, indices, last_page_len);
  return absl::OkStatus();
}

absl::Status CacheCoordinator::build_block_tables(std::span<const SeqId> seqs, BlockTables* out,
                                                  int32_t group) const {
  if (out == nullptr) return absl::InvalidArgumentError("build_block_tables: out is null");
  PAGEDKV_RETURN_IF_ERROR(check_attention_group(group, "build_block_tables"));
  PAGEDKV_RETURN_IF_ERROR(resolve_running(seqs, "build_block_tables"));
  int32_t max_blocks = 0;
  int32_t total = 0;
  for (const Sequence* s : batch_) {
    const int32_t n = num_blocks_for_tokens(s->num_computed, shared_.block_size);
    max_blocks = std::max(max_blocks, n);
    total += n;
  }
  const auto num_seqs = static_cast<int32_t>(seqs.size());
  out->num_seqs = num_seqs;
  out->max_blocks = max_blocks;
  out->block_size = shared_.block_size;
  out->block_table.resize(static_cast<size_t>(num_seqs) * max_blocks);
  out->context_lens.resize(num_seqs);
  out->indptr.resize(num_seqs + 1);
  out->indices.resize(total);
  out->last_page_len.resize(num_seqs);
  // Sized exactly from the resolved batch: nothing left to check.
  fill_padded(group, max_blocks, out->block_table, out->context_lens);
  fill_csr(group, out->indptr, out->indices, out->last_page_len);
  return absl::OkStatus();
}

absl::Status CacheCoordinator::write_state_slots(std::span<const SeqId> seqs, int32_t group,
                                                 std::span<int32_t> out) const {
  PAGEDKV_RETURN_IF_ERROR(check_group(group, "write_state_slots"));
  if (groups_[group]->kind() != AttentionKind::kState || out.size() < seqs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("write_state_slots: layer group ", group, " is ",
                                                   attention_kind_name(groups_[group]->kind()),
                                                   " (need a state group), out has ", out.size(),
                                                   " entries for ", seqs.size(), " sequences"));
  }
  PAGEDKV_RETURN_IF_ERROR(resolve_running(seqs, "write_state_slots"));
  for (size_t i = 0; i < batch_.size(); ++i) out[i] = batch_[i]->tables[group].blocks[0];
  return absl::OkStatus();
}

}  // namespace pagedkv::internal
