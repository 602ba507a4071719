// KvCacheManager: the public face of the coordinator of the layer groups
// (cache/cache_coordinator.h), which does the work.
#include "pagedkv/kv_cache_manager.h"

#include <utility>

#include "cache/cache_coordinator.h"

namespace pagedkv {

absl::StatusOr<KvCacheManager> KvCacheManager::create(Options options) {
  auto core = internal::CacheCoordinator::create(std::move(options));
  if (!core.ok()) return core.status();
  return KvCacheManager(*std::move(core));
}

KvCacheManager::KvCacheManager(std::unique_ptr<internal::CacheCoordinator> core)
    : core_(std::move(core)) {}
KvCacheManager::KvCacheManager(KvCacheManager&&) noexcept = default;
KvCacheManager& KvCacheManager::operator=(KvCacheManager&&) noexcept = default;
KvCacheManager::~KvCacheManager() = default;

absl::Status KvCacheManager::add_sequence(SeqId seq, std::span<const TokenId> prompt,
                                          SequenceOptions options) {
  return core_->add_sequence(seq, prompt, std::move(options));
}

absl::Status KvCacheManager::append_tokens(SeqId seq, std::span<const TokenId> tokens) {
  return core_->append_tokens(seq, tokens);
}

absl::StatusOr<int32_t> KvCacheManager::match_prefix(SeqId seq) { return core_->match_prefix(seq); }

absl::StatusOr<PrefixHit> KvCacheManager::peek_prefix(SeqId seq) { return core_->peek_prefix(seq); }

absl::StatusOr<std::span<const int64_t>> KvCacheManager::allocate_slots(SeqId seq,
                                                                        int32_t num_new_tokens,
                                                                        int32_t num_lookahead) {
  return core_->allocate_slots(seq, num_new_tokens, num_lookahead);
}

absl::StatusOr<std::span<const int64_t>> KvCacheManager::slot_mapping(int32_t group) const {
  return core_->slot_mapping(group);
}

absl::StatusOr<std::span<const int64_t>> KvCacheManager::allocate_draft_slots(
    SeqId seq, int32_t num_new_tokens, std::span<const TokenId> draft) {
  return core_->allocate_draft_slots(seq, num_new_tokens, draft);
}

absl::Status KvCacheManager::accept_draft(SeqId seq, int32_t num_accepted) {
  return core_->accept_draft(seq, num_accepted);
}

absl::StatusOr<KvExport> KvCacheManager::export_sequence(SeqId seq) {
  return core_->export_sequence(seq);
}

absl::Status KvCacheManager::release_export(SeqId seq) { return core_->release_export(seq); }

absl::StatusOr<KvImport> KvCacheManager::import_slots(SeqId seq, int32_t num_tokens) {
  return core_->import_slots(seq, num_tokens);
}

absl::StatusOr<int32_t> KvCacheManager::complete_import(SeqId seq,
                                                        std::span<const int32_t> verified_blocks) {
  return core_->complete_import(seq, verified_blocks);
}

absl::StatusOr<std::span<const int64_t>> KvCacheManager::allocate_slots_or_preempt(
    SeqId seq, int32_t num_new_tokens, int32_t num_lookahead) {
  return core_->allocate_slots_or_preempt(seq, num_new_tokens, num_lookahead);
}

absl::Status KvCacheManager::preempt(SeqId seq, PreemptionMode mode) {
  return core_->preempt(seq, mode);
}

absl::Status KvCacheManager::swap_in(SeqId seq) { return core_->swap_in(seq); }

absl::Status KvCacheManager::fork(SeqId parent, SeqId child) { return core_->fork(parent, child); }

absl::Status KvCacheManager::release_claim(SeqId seq) { return core_->release_claim(seq); }

absl::Status KvCacheManager::free(SeqId seq) { return core_->free(seq); }

absl::StatusOr<KvCacheManager::SlotBatch> KvCacheManager::allocate_slots_batch(
    std::span<const SeqId> seqs, std::span<const int32_t> num_new_tokens, int32_t num_lookahead,
    bool preempt) {
  return core_->allocate_slots_batch(seqs, num_new_tokens, num_lookahead, preempt);
}

absl::StatusOr<std::span<const int64_t>> KvCacheManager::batch_slot_mapping(int32_t group) const {
  return core_->batch_slot_mapping(group);
}

absl::StatusOr<std::span<const absl::Status>> KvCacheManager::append_tokens_batch(
    std::span<const SeqId> seqs, std::span<const TokenId> tokens, std::span<const int32_t> indptr) {
  return core_->append_tokens_batch(seqs, tokens, indptr);
}

absl::StatusOr<KvCacheManager::SlotBatch> KvCacheManager::allocate_draft_slots_batch(
    std::span<const SeqId> seqs, std::span<const int32_t> num_new_tokens,
    std::span<const TokenId> draft_tokens, std::span<const int32_t> draft_indptr) {
  return core_->allocate_draft_slots_batch(seqs, num_new_tokens, draft_tokens, draft_indptr);
}

absl::StatusOr<std::span<const absl::Status>> KvCacheManager::accept_draft_batch(
    std::span<const SeqId> seqs, std::span<const int32_t> num_accepted) {
  return core_->accept_draft_batch(seqs, num_accepted);
}

StepOps KvCacheManager::take_step_ops() { return core_->take_step_ops(); }

absl::Status KvCacheManager::build_block_tables(std::span<const SeqId> seqs, BlockTables* out,
                                                int32_t group) const {
  return core_->build_block_tables(seqs, out, group);
}

absl::Status KvCacheManager::write_block_tables(std::span<const SeqId> seqs, int32_t max_blocks,
                                                std::span<int32_t> block_table,
                                                std::span<int32_t> context_lens,
                                                int32_t group) const {
  return core_->write_block_tables(seqs, max_blocks, block_table, context_lens, group);
}

absl::Status KvCacheManager::write_csr_block_tables(std::span<const SeqId> seqs,
                                                    std::span<int32_t> indptr,
                                                    std::span<int32_t> indices,
                                                    std::span<int32_t> last_page_len,
                                                    int32_t group) const {
  return core_->write_csr_block_tables(seqs, indptr, indices, last_page_len, group);
}

absl::Status KvCacheManager::write_state_slots(std::span<const SeqId> seqs, int32_t group,
                                               std::span<int32_t> out) const {
  return core_->write_state_slots(seqs, group, out);
}

void KvCacheManager::reset_prefix_cache() { core_->reset_prefix_cache(); }

bool KvCacheManager::contains(SeqId seq) const { return core_->contains(seq); }

absl::StatusOr<SequenceView> KvCacheManager::sequence(SeqId seq, int32_t group) const {
  return core_->sequence(seq, group);
}

int32_t KvCacheManager::num_sequences() const { return core_->num_sequences(); }

std::vector<SequenceInfo> KvCacheManager::running_sequences() const {
  return core_->running_sequences();
}

KvCacheManager::Stats KvCacheManager::stats() const { return core_->stats(); }
const KvCacheManager::Options& KvCacheManager::options() const { return core_->options(); }
int32_t KvCacheManager::num_groups() const { return core_->num_groups(); }

absl::StatusOr<LayerGroup> KvCacheManager::layer_group(int32_t group) const {
  return core_->layer_group(group);
}

absl::StatusOr<KvCacheManager::GroupStats> KvCacheManager::group_stats(int32_t group) const {
  return core_->group_stats(group);
}

absl::StatusOr<const BlockPool*> KvCacheManager::device_pool(int32_t group) const {
  return core_->device_pool(group);
}

absl::StatusOr<const BlockPool*> KvCacheManager::host_pool(int32_t group) const {
  return core_->host_pool(group);
}

absl::Status KvCacheManager::check_invariants() const { return core_->check_invariants(); }

}  // namespace pagedkv
