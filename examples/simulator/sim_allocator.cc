#include "sim_allocator.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "pagedkv/block_table.h"
#include "studies/contiguous_allocator.h"

namespace pagedkv::sim {

std::string allocator_name(const AllocatorConfig& config) {
  switch (config.kind) {
    case AllocatorKind::kContiguousMax:
      return "contiguous-max";
    case AllocatorKind::kContiguousOracle:
      return "contiguous-oracle";
    case AllocatorKind::kPaged:
      return absl::StrCat("paged/", config.block_size);
    case AllocatorKind::kPagedPrefix:
      return absl::StrCat("paged+prefix/", config.block_size);
  }
  return "unknown";
}

namespace {

// --- paged: the library's KvCacheManager ---------------------------------------------------

class PagedAllocator final : public SimAllocator, public PreemptionHooks {
 public:
  static absl::StatusOr<std::unique_ptr<PagedAllocator>> create(const AllocatorSetup& setup) {
    const int32_t bs = setup.config.block_size;
    if (bs <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("block_size ", bs, " must be > 0"));
    }
    auto a = std::unique_ptr<PagedAllocator>(new PagedAllocator());
    KvCacheManager::Options o;
    o.block_size = bs;
    o.enable_prefix_caching = setup.config.kind == AllocatorKind::kPagedPrefix;
    o.max_model_len = setup.max_model_len;
    o.preemption_hooks = a.get();
    o.event_sink = setup.event_sink;
    o.preemption_mode = PreemptionMode::kRecompute;
    o.eviction_policy = setup.eviction_policy;
    if (setup.hybrid) {
      const HybridPools& h = *setup.hybrid;
      if (h.groups.empty() || h.pools.num_groups() != static_cast<int32_t>(h.groups.size()) ||
          h.pools.block_size != bs) {
        return absl::InvalidArgumentError(
            absl::StrCat("hybrid pools: ", h.groups.size(), " layer groups for a config of ",
                         h.pools.num_groups(), " groups of ", h.pools.block_size,
                         "-token blocks (block size ", bs, ")"));
      }
      if (setup.host_cache_tokens > 0 || setup.preemption_mode == PreemptionMode::kSwap) {
        return absl::InvalidArgumentError("hybrid pools: no host tier or swap in the simulator");
      }
      o.layer_groups = h.groups;
      for (LayerGroup& g : o.layer_groups) g.num_host_blocks = 0;
      o.watermark_blocks = watermark(setup, h.groups[0].num_blocks);
      for (int32_t g = 0; g < h.pools.num_groups(); ++g) {
        a->page_bytes_.push_back(h.pools.page_bytes(g));
      }
      a->hybrid_ = h;
    } else {
      const int64_t blocks = setup.budget_tokens / bs;
      if (blocks < 2 || blocks > INT32_MAX) {
        return absl::InvalidArgumentError(absl::StrCat("budget of ", setup.budget_tokens,
                                                       " tokens gives ", blocks, " blocks of ", bs,
                                                       "; need 2 to 2^31-1"));
      }
      // One host budget: swap space first, the host tier caches in the rest.
      const int64_t swap_blocks =
          setup.preemption_mode == PreemptionMode::kSwap ? setup.host_budget_tokens / bs : 0;
      const int64_t host_cache_blocks = o.enable_prefix_caching ? setup.host_cache_tokens / bs : 0;
      o.layer_groups = full_attention(
          static_cast<int32_t>(blocks),
          static_cast<int32_t>(std::min<int64_t>(swap_blocks + host_cache_blocks, INT32_MAX)));
      o.enable_host_cache = host_cache_blocks > 0;
      o.host_admission = setup.host_admission;
      o.watermark_blocks = watermark(setup, static_cast<int32_t>(blocks));
      o.preemption_mode = swap_blocks > 0 ? setup.preemption_mode : PreemptionMode::kRecompute;
    }
    absl::StatusOr<KvCacheManager> manager = KvCacheManager::create(std::move(o));
    if (!manager.ok()) return manager.status();
    a->manager_.emplace(std::move(*manager));
    a->block_size_ = bs;
    a->max_chunk_tokens_ = setup.max_chunk_tokens;
    return a;
  }

  void on_preempt(SeqId victim, PreemptionMode mode) override { notify_preempted(victim, mode); }
  // allocate_slots_or_preempt() gave back a waiting sequence's claimed prefix to make room.
  void on_claim_released(SeqId seq) override { matched_.erase(seq); }

  absl::Status add(SeqId seq, std::span<const TokenId> prompt, int32_t final_tokens,
                   int32_t /*num_forks*/) override {
    // Every group must hold the most blocks the sequence ever holds there at once, beside
    // the group's watermark.
    for (int32_t g = 0; g < manager_->num_groups(); ++g) {
      const LayerGroup group = *manager_->layer_group(g);
      const int64_t first = manager_->layer_group(0)->num_blocks;
      const int64_t watermark =
          (int64_t{manager_->options().watermark_blocks} * group.num_blocks + first - 1) / first;
      const int64_t admissible =
          group.num_blocks - std::min<int64_t>(watermark, group.num_blocks - 1);
      const int64_t need = peak_blocks(group, static_cast<int32_t>(prompt.size()), final_tokens);
      if (need > admissible) {
        return absl::InvalidArgumentError(
            absl::StrCat("add(seq ", seq, "): ", final_tokens, " tokens need ", need, " blocks",
                         manager_->num_groups() > 1 ? absl::StrCat(" in group ", g) : "",
                         "; the pool admits ", admissible));
      }
    }
    return manager_->add_sequence(seq, prompt);
  }

  absl::StatusOr<Work> admit(SeqId seq, int32_t max_tokens) override {
    // A sequence whose admission failed keeps its matched prefix until it retries next
    // step (match_prefix() takes references), so that its host-tier promotions are
    // written before the claim is given back. The retry matches again: the claim's blocks
    // are found again on the device (nothing evicts in between), and the match continues
    // into hits that were out of reach, such as host blocks that did not fit the device
    // room last time. Only the queue head retries; any other holder (the head changed
    // because a preempted sequence was queued in front) gives its blocks back, or waiting
    // sequences could pin the pool.
    // Host tokens this sequence's earlier claim promoted: found on the device now, but
    // host hits of this admission. (A claim that allocate_slots_or_preempt() released
    // loses this; its blocks count as device hits if they are still there.)
    int32_t promoted_before = 0;
    if (!matched_.empty()) {
      if (auto it = matched_.find(seq); it != matched_.end()) {
        promoted_before = it->second.host_tokens;
      }
      std::vector<SeqId> holders;
      for (const auto& [id, claim] : matched_) holders.push_back(id);
      for (SeqId holder : holders) {
        if (absl::Status s = release_match(holder); !s.ok()) return s;
      }
    }
    // match_prefix() promotes the host-tier hits that follow the device prefix.
    const int64_t host_before = manager_->stats().host_hit_tokens;
    absl::StatusOr<int32_t> cached = manager_->match_prefix(seq);
    if (!cached.ok()) return cached.status();
    const auto promoted = static_cast<int32_t>(manager_->stats().host_hit_tokens - host_before);
    matched_[seq] = {.cached_tokens = *cached, .host_tokens = promoted_before + promoted};
    absl::StatusOr<int32_t> left = uncomputed(seq);
    if (!left.ok()) return left.status();
    const int32_t work = std::min(*left, std::max(max_tokens, 0));
    absl::StatusOr<std::span<const int64_t>> slots = manager_->allocate_slots(seq, work);
    if (!slots.ok()) return slots.status();  // ResourceExhausted: keeps its matched prefix
    // Prefix statistics count admitted prefills only, not retries: the whole prompt, the
    // chunks to come included.
    const Claim claim = matched_.at(seq);
    query_tokens_ += claim.cached_tokens + *left;
    hit_tokens_ += claim.cached_tokens;
    host_hit_tokens_ += claim.host_tokens;
    matched_.erase(seq);
    return Work{.tokens = work, .remaining = *left - work};
  }

  absl::StatusOr<Work> reserve(SeqId seq, bool may_preempt, int32_t max_tokens) override {
    absl::StatusOr<int32_t> left = uncomputed(seq);
    if (!left.ok()) return left.status();
    const int32_t work = std::min(*left, std::max(max_tokens, 0));
    absl::StatusOr<std::span<const int64_t>> slots =
        may_preempt ? manager_->allocate_slots_or_preempt(seq, work)
                    : manager_->allocate_slots(seq, work);
    if (!slots.ok()) return slots.status();
    return Work{.tokens = work, .remaining = *left - work};
  }

  absl::Status preempt(SeqId seq) override {
    const PreemptionMode mode = manager_->options().preemption_mode;
    absl::Status s = manager_->preempt(seq, mode);
    if (absl::IsResourceExhausted(s) && mode == PreemptionMode::kSwap) {
      return manager_->preempt(seq, PreemptionMode::kRecompute);  // host pool full
    }
    return s;
  }

  absl::Status swap_in(SeqId seq) override { return manager_->swap_in(seq); }

  absl::Status check_invariants() const override { return manager_->check_invariants(); }

  void run_copies() override { (void)manager_->take_step_ops(); }

  absl::Status append(SeqId seq, TokenId token) override {
    return manager_->append_tokens(seq, std::span<const TokenId>(&token, 1));
  }

  absl::Status fork(SeqId parent, SeqId child) override { return manager_->fork(parent, child); }

  absl::Status free(SeqId seq) override {
    matched_.erase(seq);
    return manager_->free(seq);
  }

  AllocatorUsage usage(std::span<const SeqId> running) const override {
    if (hybrid_) return hybrid_usage(running);
    const int32_t bs = block_size_;
    AllocatorUsage u;
    u.reserved_slots = int64_t{manager_->stats().used_blocks} * bs;
    // Every held block is full except each sequence's last one (and any block past its
    // computed tokens); partial last blocks shared by forks count once.
    int64_t empty = 0;
    partial_.clear();
    auto account = [&](SeqId id) {
      absl::StatusOr<SequenceView> v = manager_->sequence(id);
      if (!v.ok() || v->block_table.empty()) return;
      const int32_t c = v->num_computed_tokens;
      const int32_t used = num_blocks_for_tokens(c, bs);
      for (size_t i = used; i < v->block_table.size(); ++i) {
        if (partial_.insert(v->block_table[i]).second) empty += bs;
      }
      if (c % bs != 0 && partial_.insert(v->block_table[used - 1]).second) empty += bs - c % bs;
    };
    for (SeqId id : running) account(id);
    for (const auto& [id, cached] : matched_) account(id);
    u.token_slots = u.reserved_slots - empty;
    return u;
  }

  AllocatorCounters counters() const override {
    const KvCacheManager::Stats s = manager_->stats();
    return {.prefix_query_tokens = query_tokens_,
            .prefix_hit_tokens = hit_tokens_,
            .evictions = s.evictions,
            .preemptions_recompute = s.preemptions_recompute,
            .preemptions_swap = s.preemptions_swap,
            .cow_copies = s.cow_copies,
            .blocks_swapped_out = s.blocks_swapped_out,
            .prefix_host_hit_tokens = host_hit_tokens_,
            .blocks_promoted = s.blocks_promoted,
            .blocks_demoted = s.blocks_demoted,
            .host_evictions = s.host_evictions};
  }

  std::string describe() const override {
    std::string pools;
    for (int32_t g = 0; g < manager_->num_groups(); ++g) {
      const KvCacheManager::GroupStats s = *manager_->group_stats(g);
      absl::StrAppend(&pools, g == 0 ? "" : ", ", s.used_blocks, " of ", s.num_blocks);
    }
    return absl::StrCat(manager_->num_sequences(), " sequences (",
                        manager_->running_sequences().size(), " running, ", matched_.size(),
                        " holding a matched prefix), ", pools, " blocks used");
  }

 private:
  PagedAllocator() = default;

  static int32_t watermark(const AllocatorSetup& setup, int32_t blocks) {
    return std::min<int32_t>(
        static_cast<int32_t>(std::floor(setup.watermark_fraction * static_cast<double>(blocks))),
        blocks - 1);
  }

  // The most blocks a sequence of `prompt` tokens growing to `final_tokens` holds at once
  // in `group`: a full group all of them; a windowed one the blocks that a step of at most
  // max_chunk_tokens new tokens (the whole prompt when 0) writes, and those before it that
  // the step's first token still attends to, straddling block boundaries.
  int64_t peak_blocks(const LayerGroup& group, int32_t prompt, int32_t final_tokens) const {
    const int64_t all = num_blocks_for_tokens(final_tokens, block_size_);
    if (group.kind == AttentionKind::kFull) return all;
    const int64_t step = max_chunk_tokens_ > 0 ? std::min(max_chunk_tokens_, prompt) : prompt;
    return std::min(all, (step + group.window - 1) / block_size_ + 2);
  }

  // Hybrid: the running sequences' analytic need against the bytes of every group's
  // blocks in use.
  AllocatorUsage hybrid_usage(std::span<const SeqId> running) const {
    AllocatorUsage u;
    for (int32_t g = 0; g < manager_->num_groups(); ++g) {
      u.reserved_slots += int64_t{manager_->group_stats(g)->used_blocks} * page_bytes_[g];
    }
    auto account = [&](SeqId id) {
      absl::StatusOr<SequenceView> v = manager_->sequence(id);
      if (v.ok()) u.token_slots += hybrid_->model.min_bytes_per_sequence(v->num_computed_tokens);
    };
    for (SeqId id : running) account(id);
    for (const auto& [id, cached] : matched_) account(id);
    return u;
  }

  absl::StatusOr<int32_t> uncomputed(SeqId seq) const {
    absl::StatusOr<SequenceView> v = manager_->sequence(seq);
    if (!v.ok()) return v.status();
    return static_cast<int32_t>(v->tokens.size()) - v->num_computed_tokens;
  }

  // Gives back the prefix a waiting sequence matched (cached blocks stay cached).
  absl::Status release_match(SeqId seq) {
    matched_.erase(seq);
    return manager_->release_claim(seq);
  }

  // The prefix a waiting sequence claimed with match_prefix(), until it is admitted.
  struct Claim {
    int32_t cached_tokens = 0;  // device and host hits
    int32_t host_tokens = 0;    // of those, promoted from the host tier
  };

  std::optional<KvCacheManager> manager_;
  int32_t block_size_ = 16;
  int32_t max_chunk_tokens_ = 0;
  std::optional<HybridPools> hybrid_;
  std::vector<int64_t> page_bytes_;            // hybrid: per group
  absl::flat_hash_map<SeqId, Claim> matched_;  // waiting sequences holding a matched prefix
  int64_t query_tokens_ = 0;                   // prompt tokens of admitted prefills
  int64_t hit_tokens_ = 0;                     // of those, served from the prefix cache
  int64_t host_hit_tokens_ = 0;                // of those, promoted from the host tier
  mutable absl::flat_hash_set<BlockId> partial_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SimAllocator>> make_allocator(const AllocatorSetup& setup) {
  if (setup.budget_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV budget of ", setup.budget_tokens, " tokens must be > 0"));
  }
  switch (setup.config.kind) {
    case AllocatorKind::kContiguousMax:
    case AllocatorKind::kContiguousOracle:
      if (setup.hybrid) {
        return absl::InvalidArgumentError("hybrid pools need a paged allocator");
      }
      return make_contiguous_allocator(setup.budget_tokens, setup.max_model_len,
                                       setup.config.kind == AllocatorKind::kContiguousOracle);
    case AllocatorKind::kPaged:
    case AllocatorKind::kPagedPrefix: {
      absl::StatusOr<std::unique_ptr<PagedAllocator>> a = PagedAllocator::create(setup);
      if (!a.ok()) return a.status();
      return std::unique_ptr<SimAllocator>(std::move(*a));
    }
  }
  return absl::InvalidArgumentError("unknown allocator kind");
}

}  // namespace pagedkv::sim
