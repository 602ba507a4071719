// KvCacheManager: sequences, prefix matching, slot allocation with copy-on-write, forks,
// releases and the step (preemption and swapping: preemption.cc). Every public call validates first
// and mutates after, so a failed call leaves the manager exactly as it was.
#include "pagedkv/kv_cache_manager.h"

#include <algorithm>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache/host_tier.h"
#include "cache/sequence.h"
#include "cache/step_ledger.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace pagedkv {

using internal::block_tokens;
using internal::Hold;
using internal::Sequence;
using internal::state_name;

namespace {

// In int64: a lookahead near INT32_MAX must not wrap the block count.
int64_t div_ceil(int64_t a, int32_t b) { return (a + b - 1) / b; }

}  // namespace

// --- construct -------------------------------------------------------------------------

absl::StatusOr<KvCacheManager> KvCacheManager::create(Options options) {
  if (options.num_blocks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheManager: num_blocks ", options.num_blocks, " must be > 0"));
  }
  if (options.num_host_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheManager: num_host_blocks ", options.num_host_blocks, " must be >= 0"));
  }
  if (options.max_model_len <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheManager: max_model_len ", options.max_model_len, " must be > 0"));
  }
  if (options.watermark_blocks < 0 || options.watermark_blocks >= options.num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheManager: watermark_blocks ", options.watermark_blocks,
                     " must be in [0, num_blocks ", options.num_blocks, ")"));
  }
  if (options.hash_fn == nullptr) {
    return absl::InvalidArgumentError("KvCacheManager: hash_fn must not be null");
  }
  if (options.enable_host_cache &&
      (!options.enable_prefix_caching || options.num_host_blocks == 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheManager: enable_host_cache needs enable_prefix_caching (",
                     options.enable_prefix_caching ? "true" : "false",
                     ") and num_host_blocks > 0 (", options.num_host_blocks, ")"));
  }
  auto device = BlockPool::create({.num_blocks = options.num_blocks,
                                   .block_size = options.block_size,
                                   .enable_caching = options.enable_prefix_caching,
                                   .event_sink = options.event_sink,
                                   .clock = options.clock,
                                   .log_evictions = options.enable_host_cache});
  if (!device.ok()) return device.status();
  auto host = BlockPool::create({.num_blocks = options.num_host_blocks,
                                 .block_size = options.block_size,
                                 .enable_caching = options.enable_host_cache,
                                 .event_sink = options.event_sink,
                                 .medium = Medium::kHost,
                                 .clock = options.clock,
                                 // Host blocks take the content keys of the device blocks
                                 // they copy: the host's own keys (blocks renewed for
                                 // swapping) are drawn apart from the device's.
                                 .first_content_key = uint64_t{1} << 63});
  if (!host.ok()) return host.status();
  const int32_t num_blocks = options.num_blocks;
  try {
    return KvCacheManager(std::move(options), *std::move(device), *std::move(host));
  } catch (const std::bad_alloc&) {  // no exception leaves the library
    return absl::ResourceExhaustedError(absl::StrCat(
        "KvCacheManager: cannot allocate the host bookkeeping for ", num_blocks, " blocks"));
  }
}

KvCacheManager::KvCacheManager(Options options, BlockPool device_pool, BlockPool host_pool)
    : options_(std::move(options)),
      device_pool_(std::move(device_pool)),
      host_pool_(std::move(host_pool)),
      ledger_(
          std::make_unique<internal::StepLedger>(options_.num_blocks, options_.num_host_blocks)),
      host_tier_(options_.enable_host_cache ? std::make_unique<internal::HostTier>() : nullptr) {}

KvCacheManager::KvCacheManager(KvCacheManager&&) noexcept = default;
KvCacheManager& KvCacheManager::operator=(KvCacheManager&&) noexcept = default;
KvCacheManager::~KvCacheManager() = default;

// --- sequences ---------------------------------------------------------------------------

Sequence* KvCacheManager::find(SeqId seq) const {
  const auto it = sequences_.find(seq);
  return it == sequences_.end() ? nullptr : it->second.get();
}

absl::StatusOr<Sequence*> KvCacheManager::find_or_error(SeqId seq, const char* caller) const {
  Sequence* s = find(seq);
  if (s == nullptr) return absl::NotFoundError(absl::StrCat(caller, ": unknown sequence ", seq));
  return s;
}

absl::Status KvCacheManager::add_sequence(SeqId seq, std::span<const TokenId> prompt,
                                          SequenceOptions options) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  if (find(seq) != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat("add_sequence: sequence ", seq, " exists"));
  }
  if (prompt.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("add_sequence(seq ", seq, "): empty prompt"));
  }
  if (static_cast<int64_t>(prompt.size()) > options_.max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat("add_sequence(seq ", seq, "): prompt of ",
                                                   prompt.size(), " tokens exceeds max_model_len ",
                                                   options_.max_model_len));
  }
  for (const RetentionRange& r : options.retention) {
    if (r.begin < 0 || r.end < r.begin || r.priority < kMinRetentionPriority ||
        r.priority > kMaxRetentionPriority || r.duration_ms < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "add_sequence(seq ", seq, "): retention range [", r.begin, ", ", r.end, ") priority ",
          r.priority, " duration_ms ", r.duration_ms, ": need 0 <= begin <= end, priority in [",
          kMinRetentionPriority, ", ", kMaxRetentionPriority, "], duration_ms >= 0"));
    }
  }
  // The watermark does not count: a sequence alone in the pool may use every block.
  const int64_t prompt_blocks = div_ceil(static_cast<int64_t>(prompt.size()), options_.block_size);
  if (prompt_blocks > options_.num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("add_sequence(seq ", seq, "): prompt of ", prompt.size(), " tokens needs ",
                     prompt_blocks, " blocks of ", options_.block_size, " tokens; the pool has ",
                     options_.num_blocks, ". Raise num_blocks or shorten the prompt"));
  }
  auto s = std::make_unique<Sequence>();
  s->id = seq;
  s->priority = options.priority;
  s->arrival = next_arrival_++;
  s->tokens.assign(prompt.begin(), prompt.end());
  s->extra_keys.assign(options.extra_keys.begin(), options.extra_keys.end());
  s->retention = std::move(options.retention);
  sequences_.emplace(seq, std::move(s));
  return absl::OkStatus();
}

absl::Status KvCacheManager::append_tokens(SeqId seq, std::span<const TokenId> tokens) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  Sequence* s = find(seq);  // hot: one lookup, no StatusOr on the way
  if (s == nullptr) [[unlikely]]
    return find_or_error(seq, "append_tokens").status();
  if (static_cast<int64_t>(s->tokens.size()) + static_cast<int64_t>(tokens.size()) >
      options_.max_model_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("append_tokens(seq ", seq, "): ", s->tokens.size(), " + ", tokens.size(),
                     " tokens exceeds max_model_len ", options_.max_model_len));
  }
  // push_back, not a range insert: a decode step appends one token, and a range insert
  // of one element costs a memmove call.
  for (const TokenId t : tokens) s->tokens.push_back(t);
  return absl::OkStatus();
}

// --- prefix cache ----------------------------------------------------------------------

void KvCacheManager::hash_full_blocks(Sequence& seq, int32_t num_full_blocks) {
  const int32_t bs = options_.block_size;
  PAGEDKV_DCHECK(static_cast<int64_t>(num_full_blocks) * bs <=
                 static_cast<int64_t>(seq.tokens.size()));
  for (auto i = static_cast<int32_t>(seq.block_hashes.size()); i < num_full_blocks; ++i) {
    const BlockHash* parent = i == 0 ? nullptr : &seq.block_hashes[i - 1];
    seq.block_hashes.push_back(options_.hash_fn(parent, block_tokens(seq, i, bs), seq.extra_keys));
  }
}

absl::StatusOr<int32_t> KvCacheManager::match_prefix(SeqId seq) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "match_prefix"));
  if (s->state != SequenceState::kWaiting || !s->blocks.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "match_prefix(seq ", seq, "): sequence is ", state_name(s->state), " with ",
        s->blocks.size(), " blocks; only a waiting sequence without blocks can match"));
  }
  const auto len = static_cast<int32_t>(s->tokens.size());
  counters_.prefix_query_tokens += len;
  if (!options_.enable_prefix_caching) return 0;

  // NOTE: never match the last token; its logits must be computed.
  const int32_t bs = options_.block_size;
  const int32_t max_blocks = (len - 1) / bs;
  hash_full_blocks(*s, max_blocks);
  BlockId parent = kNoBlock;
  for (int32_t i = 0; i < max_blocks; ++i) {
    const BlockId hit = device_pool_.find_cached_unchecked(s->block_hashes[i], parent,
                                                           block_tokens(*s, i, bs), s->extra_keys);
    if (hit == kNoBlock) break;
    s->blocks.push_back(hit);
    parent = hit;
  }
  for (const BlockId b : s->blocks) device_pool_.touch_unchecked(b);
  if (host_tier_ != nullptr) {
    const int32_t reserve = num_running_ > 0 ? options_.watermark_blocks : 0;
    const int32_t room = std::max(0, device_pool_.num_free_blocks() - reserve);
    host_tier_->promote_hits(*s, max_blocks, room, {device_pool_, host_pool_, *ledger_});
  }
  const auto hit_blocks = static_cast<int32_t>(s->blocks.size());
  s->num_computed = hit_blocks * bs;
  s->num_offered_blocks = hit_blocks;
  // A hit on a block another sequence fills in this step holds K/V not written yet.
  for (int32_t i = 0; i < hit_blocks; ++i) {
    if (ledger_->written(s->blocks[i])) {
      ledger_->mark_scheduled(*s, i * bs);
      break;
    }
  }
  counters_.prefix_hit_tokens += s->num_computed;
  return s->num_computed;
}

// Device allocation with the host tier's side: cached blocks it evicts are demoted.
void KvCacheManager::allocate_device_blocks(std::span<BlockId> out) {
  device_pool_.allocate_unchecked(out);
  if (host_tier_ != nullptr) host_tier_->demote_evicted({device_pool_, host_pool_, *ledger_});
}

void KvCacheManager::offer_computed_blocks(Sequence& seq) {
  const int32_t full = seq.num_computed / options_.block_size;
  // K/V computed before a reset_prefix_cache() is never shared after it, nor is anything
  // computed after it in the same sequence.
  if (!options_.enable_prefix_caching || seq.kv_before_reset) {
    seq.num_offered_blocks = full;
    return;
  }
  if (seq.num_offered_blocks >= full) return;
  hash_full_blocks(seq, full);
  const int32_t first = seq.num_offered_blocks;
  const auto count = static_cast<size_t>(full - first);
  const auto tokens =
      std::span<const TokenId>(seq.tokens)
          .subspan(static_cast<size_t>(first) * options_.block_size, count * options_.block_size);
  device_pool_.cache_full_blocks_unchecked(
      std::span<const BlockId>(seq.blocks).subspan(first, count),
      std::span<const BlockHash>(seq.block_hashes).subspan(first, count),
      first == 0 ? kNoBlock : seq.blocks[first - 1],
      first == 0 ? nullptr : &seq.block_hashes[first - 1], tokens, seq.extra_keys);
  seq.num_offered_blocks = full;
}

void KvCacheManager::reset_prefix_cache() {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  device_pool_.reset_prefix_cache();
  host_pool_.reset_prefix_cache(/*emit_event=*/false);  // one AllBlocksCleared for both
  for (auto& [id, s] : sequences_) {
    if (s->num_computed > 0 || !s->blocks.empty()) s->kv_before_reset = true;
  }
}

// --- slots -----------------------------------------------------------------------------

absl::StatusOr<std::span<const int64_t>> KvCacheManager::allocate_slots(SeqId seq,
                                                                        int32_t num_new_tokens,
                                                                        int32_t num_lookahead) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  Sequence* s = find(seq);  // hot: one lookup, no StatusOr on the way
  if (s == nullptr) [[unlikely]]
    return find_or_error(seq, "allocate_slots").status();
  return allocate_slots_impl(*s, num_new_tokens, num_lookahead);
}

absl::StatusOr<std::span<const int64_t>> KvCacheManager::allocate_slots_impl(
    Sequence& seq, int32_t num_new_tokens, int32_t num_lookahead) {
  const int32_t bs = options_.block_size;
  if (num_new_tokens < 0 || num_lookahead < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("allocate_slots(seq ", seq.id, "): num_new_tokens ", num_new_tokens,
                     " and num_lookahead ", num_lookahead, " must be >= 0"));
  }
  if (seq.state == SequenceState::kSwapped) {
    return absl::FailedPreconditionError(
        absl::StrCat("allocate_slots(seq ", seq.id, "): sequence is swapped; swap_in() first"));
  }
  const int64_t new_total = int64_t{seq.num_computed} + num_new_tokens;
  if (new_total > static_cast<int64_t>(seq.tokens.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("allocate_slots(seq ", seq.id, "): ", seq.num_computed, " computed + ",
                     num_new_tokens, " new tokens exceeds the sequence's ", seq.tokens.size(),
                     " tokens; append_tokens() first"));
  }
  const int64_t total_blocks = div_ceil(new_total + num_lookahead, bs);
  if (total_blocks > options_.num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("allocate_slots(seq ", seq.id, "): ", new_total + num_lookahead,
                     " slots need ", total_blocks, " blocks; the pool has ", options_.num_blocks));
  }
  // Copy-on-write: the partially filled last block is written by this call and shared.
  const int32_t write_block = seq.num_computed / bs;
  const int32_t partial = seq.num_computed - write_block * bs;
  const bool copy_on_write = num_new_tokens > 0 && partial != 0 &&
                             device_pool_.ref_count_unchecked(seq.blocks[write_block]) > 1;
  if (copy_on_write && ledger_->scheduled(seq) && seq.settled_tokens < seq.num_computed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "allocate_slots(seq ", seq.id, "): copy-on-write of block ", seq.blocks[write_block],
        " would copy tokens whose K/V this step has not written yet; append after the step"));
  }
  const int32_t new_blocks =
      static_cast<int32_t>(std::max<int64_t>(0, total_blocks - std::ssize(seq.blocks))) +
      (copy_on_write ? 1 : 0);
  // The watermark keeps headroom for running sequences to grow: an admission leaves it
  // free while another sequence runs, and may use every block when none does.
  const bool admission = seq.state == SequenceState::kWaiting;
  const int32_t reserve = admission && num_running_ > 0 ? options_.watermark_blocks : 0;
  if (new_blocks + reserve > device_pool_.num_free_blocks()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("allocate_slots(seq ", seq.id, "): need ", new_blocks, " blocks",
                     reserve > 0 ? absl::StrCat(" + watermark ", reserve) : "", ", ",
                     device_pool_.num_free_blocks(), " free of ", options_.num_blocks));
  }

  // Validated; from here on nothing fails. A decode step inside its last block skips this.
  if (new_blocks > 0) allocate_new_blocks(seq, new_blocks, copy_on_write, write_block, partial);

  // The blocks the new tokens' K/V goes into, once each; then the slots walk (block,
  // offset) from the first new token, with no division per token.
  if (num_new_tokens > 0) {
    const int32_t last_block = static_cast<int32_t>((new_total - 1) / bs);
    for (int32_t i = write_block; i <= last_block; ++i) ledger_->mark_written(seq.blocks[i]);
  }
  slot_mapping_.resize(num_new_tokens);
  int32_t block = write_block;
  int32_t offset = partial;
  for (int64_t& slot : slot_mapping_) {
    slot = int64_t{seq.blocks[block]} * bs + offset;
    if (++offset == bs) {
      offset = 0;
      ++block;
    }
  }
  if (num_new_tokens > 0) ledger_->mark_scheduled(seq, seq.num_computed);
  seq.num_computed = static_cast<int32_t>(new_total);
  set_state(seq, SequenceState::kRunning);
  if (seq.num_offered_blocks < seq.num_computed / bs) offer_computed_blocks(seq);
  return std::span<const int64_t>(slot_mapping_);
}

void KvCacheManager::allocate_new_blocks(Sequence& seq, int32_t new_blocks, bool copy_on_write,
                                         int32_t write_block, int32_t valid_tokens) {
  scratch_blocks_.resize(new_blocks);
  allocate_device_blocks(scratch_blocks_);
  auto fresh = scratch_blocks_.begin();
  if (copy_on_write) {
    const BlockId src = seq.blocks[write_block];
    const BlockId dst = *fresh++;
    ledger_->record(internal::kCopyOnWrite, {src, dst, valid_tokens});
    const BlockId released[] = {src};
    device_pool_.free_unchecked(released);  // still held by the other sharers
    seq.blocks[write_block] = dst;
    ++counters_.cow_copies;
  }
  seq.blocks.insert(seq.blocks.end(), fresh, scratch_blocks_.end());
}

// --- fork and free -----------------------------------------------------------------------

absl::Status KvCacheManager::fork(SeqId parent, SeqId child) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * p, find_or_error(parent, "fork"));
  if (find(child) != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat("fork(parent ", parent, "): child sequence ", child, " exists"));
  }
  if (p->state == SequenceState::kSwapped) {
    return absl::FailedPreconditionError(
        absl::StrCat("fork(parent ", parent, "): parent is swapped; swap_in() first"));
  }
  auto c = std::make_unique<Sequence>(*p);
  c->id = child;
  c->arrival = next_arrival_++;
  // Only blocks holding computed tokens are shared; the parent keeps its lookahead blocks.
  c->blocks.resize(div_ceil(p->num_computed, options_.block_size));
  c->num_offered_blocks = std::min(c->num_offered_blocks, static_cast<int32_t>(c->blocks.size()));
  for (const BlockId b : c->blocks) device_pool_.touch_unchecked(b);
  num_running_ += c->state == SequenceState::kRunning;
  sequences_.emplace(child, std::move(c));
  return absl::OkStatus();
}

absl::Status KvCacheManager::free(SeqId seq) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "free"));
  unshare_unwritten_blocks(*s);
  release_device_blocks(*s);
  release_host_blocks(*s);
  set_state(*s, SequenceState::kWaiting);  // leaves the running count
  sequences_.erase(seq);
  return absl::OkStatus();
}

void KvCacheManager::unshare_unwritten_blocks(Sequence& seq) {
  if (!ledger_->scheduled(seq)) return;
  // Blocks that this step's K/V writes fill and it holds alone may never be written. A
  // block a swap-in or promotion fills stays cached: its copy runs with the step's ops.
  for (int32_t i = seq.settled_tokens / options_.block_size; i < seq.num_offered_blocks; ++i) {
    const BlockId b = seq.blocks[i];
    if (device_pool_.ref_count_unchecked(b) == 1 && !ledger_->filled_by_copy(b)) {
      device_pool_.uncache_unchecked(b);
    }
  }
}

// --- releases and the step ---------------------------------------------------------------

void KvCacheManager::set_state(Sequence& seq, SequenceState state) {
  num_running_ += (state == SequenceState::kRunning) - (seq.state == SequenceState::kRunning);
  seq.state = state;
}

void KvCacheManager::release_device_blocks(Sequence& seq) {
  if (!seq.retention.empty()) [[unlikely]] {
    apply_retention(seq);
  }
  // Tail first, as one free: a prompt's later blocks are evicted before its shared
  // beginning, and its clean blocks are reused in the same order.
  if (!ledger_->holds_any_device()) [[likely]] {
    device_pool_.free_tail_first_unchecked(seq.blocks);
  } else {
    BlockId last_clean = kNoBlock;
    for (auto it = seq.blocks.rbegin(); it != seq.blocks.rend(); ++it) {
      ledger_->release(device_pool_, Hold::kDevice, *it, last_clean);
    }
  }
  seq.blocks.clear();
}

// Gives each of `seq`'s blocks the retention of the last range holding its first token.
void KvCacheManager::apply_retention(const Sequence& seq) {
  const int32_t bs = options_.block_size;
  for (size_t i = 0; i < seq.blocks.size(); ++i) {
    const int64_t first_token = static_cast<int64_t>(i) * bs;
    for (auto r = seq.retention.rbegin(); r != seq.retention.rend(); ++r) {
      if (first_token >= r->begin && first_token < r->end) {
        device_pool_.set_retention_unchecked(seq.blocks[i], r->priority, r->duration_ms);
        break;
      }
    }
  }
}

void KvCacheManager::release_host_blocks(Sequence& seq) {
  BlockId last_clean = kNoBlock;
  for (auto it = seq.host_blocks.rbegin(); it != seq.host_blocks.rend(); ++it) {
    ledger_->release(host_pool_, Hold::kHost, *it, last_clean);
  }
  seq.host_blocks.clear();
}

StepOps KvCacheManager::take_step_ops() {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  return ledger_->take(device_pool_, host_pool_);
}

// --- lookups -----------------------------------------------------------------------------

bool KvCacheManager::contains(SeqId seq) const { return find(seq) != nullptr; }

absl::StatusOr<SequenceView> KvCacheManager::sequence(SeqId seq) const {
  PAGEDKV_ASSIGN_OR_RETURN(const Sequence* s, find_or_error(seq, "sequence"));
  return SequenceView{s->id,           s->state,  s->priority, s->arrival,
                      s->num_computed, s->tokens, s->blocks,   s->host_blocks};
}

int32_t KvCacheManager::num_sequences() const { return static_cast<int32_t>(sequences_.size()); }

std::vector<SequenceInfo> KvCacheManager::running_sequences() const {
  std::vector<SequenceInfo> running;
  for (const auto& [id, s] : sequences_) {
    if (s->state != SequenceState::kRunning) continue;
    running.push_back({id, s->priority, s->arrival, static_cast<int32_t>(s->blocks.size()),
                       static_cast<int32_t>(s->tokens.size()), s->num_computed});
  }
  std::sort(running.begin(), running.end(),
            [](const SequenceInfo& a, const SequenceInfo& b) { return a.arrival < b.arrival; });
  return running;
}

KvCacheManager::Stats KvCacheManager::stats() const {
  const BlockPool::Stats device = device_pool_.stats();
  Stats s = counters_;
  s.num_blocks = device.num_blocks;
  s.used_blocks = device.used_blocks;
  s.free_blocks = device.free_blocks;
  s.cached_free_blocks = device.cached_free_blocks;
  s.num_host_blocks = host_pool_.num_blocks();
  s.used_host_blocks = host_pool_.num_blocks() - host_pool_.num_free_blocks();
  s.evictions = device.evictions;
  if (host_tier_ != nullptr) {
    const internal::HostTier::Counters& tier = host_tier_->counters();
    s.host_hit_tokens = tier.host_hit_tokens;
    s.blocks_demoted = tier.blocks_demoted;
    s.blocks_promoted = tier.blocks_promoted;
  }
  const BlockPool::Stats host = host_pool_.stats();
  s.cached_host_blocks = host.cached_blocks;
  s.host_evictions = host.evictions;
  return s;
}

}  // namespace pagedkv
