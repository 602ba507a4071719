// KvCacheManager: sequences, prefix matching, slot allocation with copy-on-write,
// preemption and swapping. Every public call validates first and mutates after, so a
// failed call leaves the manager exactly as it was.
#include "pagedkv/kv_cache_manager.h"

#include <algorithm>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache/pending_copies.h"
#include "cache/sequence.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "pool/hash_index.h"

namespace pagedkv {

using internal::HashIndex;
using internal::Sequence;

namespace {

// In int64: a lookahead near INT32_MAX must not wrap the block count.
int64_t div_ceil(int64_t a, int32_t b) { return (a + b - 1) / b; }

std::span<const TokenId> block_tokens(const Sequence& seq, int32_t index, int32_t block_size) {
  return std::span<const TokenId>(seq.tokens)
      .subspan(static_cast<size_t>(index) * block_size, block_size);
}

const char* state_name(SequenceState state) {
  switch (state) {
    case SequenceState::kWaiting:
      return "waiting";
    case SequenceState::kRunning:
      return "running";
    case SequenceState::kSwapped:
      return "swapped";
  }
  return "unknown";
}

// Lowest priority first, then latest arrival.
std::optional<Preemption> default_victim(std::span<const SequenceInfo> running, PreemptionMode mode,
                                         int32_t host_free_blocks, int32_t block_size) {
  const auto it = std::min_element(running.begin(), running.end(),
                                   [](const SequenceInfo& a, const SequenceInfo& b) {
                                     if (a.priority != b.priority) return a.priority < b.priority;
                                     return a.arrival > b.arrival;
                                   });
  if (it == running.end()) return std::nullopt;
  if (mode == PreemptionMode::kSwap &&
      div_ceil(it->num_computed_tokens, block_size) > host_free_blocks) {
    mode = PreemptionMode::kRecompute;
  }
  return Preemption{it->id, mode};
}

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
                                   .clock = options.clock});
  if (!device.ok()) return device.status();
  auto host = BlockPool::create({.num_blocks = options.num_host_blocks,
                                 .block_size = options.block_size,
                                 .enable_caching = options.enable_host_cache,
                                 .event_sink = options.event_sink,
                                 .medium = Medium::kHost,
                                 .clock = options.clock});
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
      block_write_step_(options_.num_blocks, 0),
      device_pending_(options_.num_blocks, 0),
      host_pending_(options_.num_host_blocks, 0) {
  if (options_.enable_host_cache) {
    device_pool_.log_evictions_ = true;
    device_pool_.hash_index_->keep_parent_hashes();  // announced with the demoted copies
    // Host blocks take the content keys of the device blocks they copy: keep the host
    // pool's own keys (blocks renewed for swapping) apart from the device's.
    host_pool_.hash_index_->start_content_keys_at(uint64_t{1} << 63);
  }
}

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
  if (options_.enable_host_cache) promote_host_hits(*s, max_blocks);
  const auto hit_blocks = static_cast<int32_t>(s->blocks.size());
  s->num_computed = hit_blocks * bs;
  s->num_offered_blocks = hit_blocks;
  // A hit on a block another sequence fills in this step holds K/V not written yet.
  for (int32_t i = 0; i < hit_blocks; ++i) {
    if (block_write_step_[s->blocks[i]] == step_) {
      mark_scheduled(*s, i * bs);
      break;
    }
  }
  counters_.prefix_hit_tokens += s->num_computed;
  return s->num_computed;
}

// Continues `seq`'s claimed device prefix into the host tier: the verified host hits that
// follow, as many as free device blocks allow, are promoted into new device blocks, which
// enter the device index with the host blocks' content keys (so cached children in either
// tier still verify after them). The host blocks leave the tier, except that a host block
// whose new device block held an evicted cached block takes that block's contents in
// exchange: a promotion then costs the tier no block, as in one LRU pool of both sizes.
void KvCacheManager::promote_host_hits(Sequence& seq, int32_t max_blocks) {
  const int32_t bs = options_.block_size;
  const auto first = static_cast<int32_t>(seq.blocks.size());
  const int32_t reserve = num_running_ > 0 ? options_.watermark_blocks : 0;
  const int32_t room = std::max(0, device_pool_.num_free_blocks() - reserve);
  const HashIndex& host_index = *host_pool_.hash_index_;
  uint64_t parent_key =
      first == 0 ? 0 : device_pool_.hash_index_->content_key(seq.blocks[first - 1]);
  scratch_host_.clear();
  for (int32_t i = first; i < max_blocks && i - first < room; ++i) {
    const BlockId hit = host_index.find(seq.block_hashes[i]);
    if (hit == kNoBlock ||
        !host_index.verify(hit, parent_key, block_tokens(seq, i, bs), seq.extra_keys)) {
      break;
    }
    scratch_host_.push_back(hit);
    parent_key = host_index.content_key(hit);
  }
  if (scratch_host_.empty()) return;
  // Held first, so that nothing this call evicts lands in them.
  for (const BlockId h : scratch_host_) host_pool_.touch_unchecked(h);
  const auto count = static_cast<int32_t>(scratch_host_.size());
  seq.blocks.resize(first + count);
  const std::span<BlockId> promoted = std::span(seq.blocks).subspan(first);
  device_pool_.allocate_unchecked(promoted);
  // The evicted blocks, in allocation order: a subsequence of `promoted`. Those not
  // exchanged are kept at the front of the list and demoted after the loop.
  std::vector<BlockPool::EvictedBlock>& evicted = device_pool_.evicted_;
  size_t next_evicted = 0;
  size_t kept = 0;
  for (int32_t j = 0; j < count; ++j) {
    const BlockId h = scratch_host_[j];
    const BlockId d = promoted[j];
    device_pool_.hash_index_->set_content_key(d, host_index.content_key(h));
    block_write_step_[d] = step_;
    host_pool_.uncache_unchecked(h);
    const BlockPool::EvictedBlock* e = nullptr;
    if (next_evicted < evicted.size() && evicted[next_evicted].block == d) {
      e = &evicted[next_evicted++];
    }
    // One batch of exchanges may run concurrently: a host block a pending copy of this step
    // writes (a demotion or exchange put this hit there) is promoted after that batch
    // instead, and the evicted block demoted into another host block.
    const bool written_this_step = host_pending_[h] > 0;
    if (e != nullptr && !written_this_step && !refresh_host_copy(*e)) {
      host_pool_.cache_copy_unchecked(h, device_pool_, *e);
      record_copy(pending_swaps_.exchange, {d, h, bs}, &device_pending_, &host_pending_);
      ++counters_.blocks_demoted;
    } else {
      if (e != nullptr && written_this_step) evicted[kept++] = *e;
      record_copy(pending_swaps_.promote, {h, d, bs}, &host_pending_, &device_pending_);
    }
    release_host_block(h);
  }
  evicted.resize(kept);
  demote_evicted();
  device_pool_.cache_full_blocks_unchecked(
      promoted, std::span<const BlockHash>(seq.block_hashes).subspan(first, count),
      first == 0 ? kNoBlock : seq.blocks[first - 1],
      first == 0 ? nullptr : &seq.block_hashes[first - 1],
      std::span<const TokenId>(seq.tokens)
          .subspan(static_cast<size_t>(first) * bs, static_cast<size_t>(count) * bs),
      seq.extra_keys);
  counters_.blocks_promoted += count;
  counters_.host_hit_tokens += int64_t{count} * bs;
}

// Device allocation with the host tier's side: cached blocks it evicts are demoted.
void KvCacheManager::allocate_device_blocks(std::span<BlockId> out) {
  PAGEDKV_CHECK(device_pool_.allocate(out).ok());
  if (!device_pool_.evicted_.empty()) demote_evicted();
}

// Copies each cached block the device pool just evicted into a host block of the tier,
// unless the tier holds its hash already (see refresh_host_copy()) or no host block is free
// or evictable (then it is dropped, as without a tier). The host block is held until the
// engine takes the copy.
void KvCacheManager::demote_evicted() {
  const std::vector<BlockPool::EvictedBlock>& evicted = device_pool_.evicted_;
  // Host blocks written this step are held until the step ends: with fewer free than
  // evicted, the least recently used evictions are the ones dropped.
  const auto dropped =
      static_cast<size_t>(std::max<int64_t>(0, std::ssize(evicted) - host_pool_.num_free_blocks()));
  for (size_t i = dropped; i < evicted.size(); ++i) {
    const BlockPool::EvictedBlock& e = evicted[i];
    if (refresh_host_copy(e) || host_pool_.num_free_blocks() == 0) continue;
    BlockId h = kNoBlock;
    host_pool_.allocate_unchecked({&h, 1});
    host_pool_.cache_copy_unchecked(h, device_pool_, e);
    record_copy(pending_swaps_.demote, {e.block, h, options_.block_size}, nullptr, &host_pending_);
    release_host_block(h);
    ++counters_.blocks_demoted;
  }
  device_pool_.evicted_.clear();
}

// Whether the host tier holds the hash of the evicted device block `e` already. A free
// host copy of the same contents then takes e's place in the tier's LRU order (and its
// retention), as a standby takes over in one pool; no copy is needed.
bool KvCacheManager::refresh_host_copy(const BlockPool::EvictedBlock& e) {
  const HashIndex& host_index = *host_pool_.hash_index_;
  const BlockId copy = host_index.find(e.hash);
  if (copy == kNoBlock) return false;
  const HashIndex& device_index = *device_pool_.hash_index_;
  if (host_pool_.ref_count_unchecked(copy) == 0 &&
      host_index.verify(copy, device_index.parent_key(e.block), device_index.tokens(e.block),
                        device_index.extra_keys(e.block))) {
    host_pool_.touch_unchecked(copy);
    host_pool_.copy_retention(copy, e);
    release_host_block(copy);
  }
  return true;
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
  if (copy_on_write && scheduled_this_step(seq) && seq.settled_tokens < seq.num_computed) {
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

  // Slots walk (block, offset) from the first new token; no division per token.
  slot_mapping_.resize(num_new_tokens);
  int32_t block = write_block;
  int32_t offset = partial;
  for (int64_t& slot : slot_mapping_) {
    slot = int64_t{seq.blocks[block]} * bs + offset;
    block_write_step_[seq.blocks[block]] = step_;
    if (++offset == bs) {
      offset = 0;
      ++block;
    }
  }
  if (num_new_tokens > 0) mark_scheduled(seq, seq.num_computed);
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
    record_copy(pending_copies_, {src, dst, valid_tokens}, &device_pending_, &device_pending_);
    const BlockId released[] = {src};
    device_pool_.free_unchecked(released);  // still held by the other sharers
    seq.blocks[write_block] = dst;
    ++counters_.cow_copies;
  }
  seq.blocks.insert(seq.blocks.end(), fresh, scratch_blocks_.end());
}

absl::StatusOr<std::span<const int64_t>> KvCacheManager::allocate_slots_or_preempt(
    SeqId seq, int32_t num_new_tokens, int32_t num_lookahead) {
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "allocate_slots_or_preempt"));
  while (true) {
    auto slots = allocate_slots_impl(*s, num_new_tokens, num_lookahead);
    if (slots.ok() || !absl::IsResourceExhausted(slots.status())) return slots;
    if (release_one_claim(seq)) continue;
    const std::optional<Preemption> choice = choose_victim(seq);
    if (!choice.has_value()) return slots.status();
    PAGEDKV_RETURN_IF_ERROR(preempt(choice->victim, choice->mode));
  }
}

// --- preemption ------------------------------------------------------------------------

bool KvCacheManager::release_one_claim(SeqId requester) {
  // Lowest priority, then latest arrival, among claims that would free a block.
  Sequence* chosen = nullptr;
  for (auto& [id, s] : sequences_) {
    if (id == requester || s->state != SequenceState::kWaiting) continue;
    const bool frees_a_block = std::any_of(s->blocks.begin(), s->blocks.end(), [&](BlockId b) {
      return device_pool_.ref_count_unchecked(b) == 1;
    });
    if (!frees_a_block) continue;
    if (chosen == nullptr || s->priority < chosen->priority ||
        (s->priority == chosen->priority && s->arrival > chosen->arrival)) {
      chosen = s.get();
    }
  }
  if (chosen == nullptr) return false;
  drop_claim(*chosen);
  if (options_.preemption_hooks != nullptr)
    options_.preemption_hooks->on_claim_released(chosen->id);
  return true;
}

std::optional<Preemption> KvCacheManager::choose_victim(SeqId requester) const {
  std::vector<SequenceInfo> running = running_sequences();
  std::erase_if(running, [&](const SequenceInfo& info) {
    return info.id == requester || scheduled_this_step(*find(info.id));
  });
  if (running.empty()) return std::nullopt;
  std::optional<Preemption> choice =
      options_.victim_policy ? options_.victim_policy(running, requester)
                             : default_victim(running, options_.preemption_mode,
                                              host_pool_.num_free_blocks(), options_.block_size);
  if (!choice.has_value() || choice->victim == requester) return std::nullopt;
  const Sequence* victim = find(choice->victim);
  if (victim == nullptr || victim->state != SequenceState::kRunning ||
      scheduled_this_step(*victim)) {
    return std::nullopt;
  }
  return choice;
}

absl::Status KvCacheManager::preempt(SeqId seq, PreemptionMode mode) {
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "preempt"));
  if (s->state != SequenceState::kRunning) {
    return absl::FailedPreconditionError(absl::StrCat("preempt(seq ", seq, "): sequence is ",
                                                      state_name(s->state), ", not running"));
  }
  if (scheduled_this_step(*s)) {
    return absl::FailedPreconditionError(
        absl::StrCat("preempt(seq ", seq,
                     "): sequence was scheduled in this step and its K/V "
                     "is not written yet; preempt it before scheduling it, or in a later step"));
  }
  const int32_t bs = options_.block_size;
  if (mode == PreemptionMode::kSwap) {
    const auto needed = static_cast<int32_t>(div_ceil(s->num_computed, bs));
    if (needed > host_pool_.num_free_blocks()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("preempt(seq ", seq, ", swap): need ", needed, " host blocks, ",
                       host_pool_.num_free_blocks(), " free of ", options_.num_host_blocks));
    }
    s->host_blocks.resize(needed);
    PAGEDKV_CHECK(host_pool_.allocate(s->host_blocks).ok());
    for (int32_t i = 0; i < needed; ++i) {
      const int32_t valid = std::min(bs, s->num_computed - i * bs);
      // The device source is released below on purpose: swap-out runs first in a step.
      record_copy(pending_swaps_.swap_out, {s->blocks[i], s->host_blocks[i], valid}, nullptr,
                  &host_pending_);
    }
    counters_.blocks_swapped_out += needed;
    ++counters_.preemptions_swap;
    release_device_blocks(*s);
    set_state(*s, SequenceState::kSwapped);
  } else {
    release_device_blocks(*s);
    s->num_computed = 0;
    s->kv_before_reset = false;  // recomputed from scratch
    set_state(*s, SequenceState::kWaiting);
    ++counters_.preemptions_recompute;
  }
  s->num_offered_blocks = 0;
  if (options_.preemption_hooks != nullptr) options_.preemption_hooks->on_preempt(seq, mode);
  return absl::OkStatus();
}

absl::Status KvCacheManager::swap_in(SeqId seq) {
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "swap_in"));
  if (s->state != SequenceState::kSwapped) {
    return absl::FailedPreconditionError(absl::StrCat("swap_in(seq ", seq, "): sequence is ",
                                                      state_name(s->state), ", not swapped"));
  }
  const auto needed = static_cast<int32_t>(s->host_blocks.size());
  if (needed > device_pool_.num_free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("swap_in(seq ", seq, "): need ", needed,
                                                     " blocks, ", device_pool_.num_free_blocks(),
                                                     " free of ", options_.num_blocks));
  }
  s->blocks.resize(needed);
  allocate_device_blocks(s->blocks);
  const int32_t bs = options_.block_size;
  for (int32_t i = 0; i < needed; ++i) {
    const int32_t valid = std::min(bs, s->num_computed - i * bs);
    record_copy(pending_swaps_.swap_in, {s->host_blocks[i], s->blocks[i], valid}, &host_pending_,
                &device_pending_);
    block_write_step_[s->blocks[i]] = step_;
  }
  counters_.blocks_swapped_in += needed;
  release_host_blocks(*s);
  set_state(*s, SequenceState::kRunning);
  mark_scheduled(*s, /*settled_tokens=*/0);  // nothing is on the device before swap-in runs
  offer_computed_blocks(*s);
  return absl::OkStatus();
}

// --- fork and free -----------------------------------------------------------------------

absl::Status KvCacheManager::fork(SeqId parent, SeqId child) {
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
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "free"));
  unshare_unwritten_blocks(*s);
  release_device_blocks(*s);
  release_host_blocks(*s);
  set_state(*s, SequenceState::kWaiting);  // leaves the running count
  sequences_.erase(seq);
  return absl::OkStatus();
}

absl::Status KvCacheManager::release_claim(SeqId seq) {
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "release_claim"));
  if (s->state != SequenceState::kWaiting) {
    return absl::FailedPreconditionError(absl::StrCat("release_claim(seq ", seq, "): sequence is ",
                                                      state_name(s->state),
                                                      "; only a waiting sequence holds a claim"));
  }
  drop_claim(*s);
  return absl::OkStatus();
}

void KvCacheManager::drop_claim(Sequence& seq) {
  counters_.claims_released += !seq.blocks.empty();
  unshare_unwritten_blocks(seq);
  release_device_blocks(seq);
  seq.num_computed = 0;
  seq.num_offered_blocks = 0;
  seq.kv_before_reset = false;
  seq.scheduled_step = 0;  // holds nothing this step still writes
}

void KvCacheManager::unshare_unwritten_blocks(Sequence& seq) {
  if (!scheduled_this_step(seq)) return;
  // Blocks filled in this step that it holds alone may never be written.
  for (int32_t i = seq.settled_tokens / options_.block_size; i < seq.num_offered_blocks; ++i) {
    if (device_pool_.ref_count_unchecked(seq.blocks[i]) == 1) {
      device_pool_.uncache_unchecked(seq.blocks[i]);
    }
  }
}

// --- pending copies ----------------------------------------------------------------------

void KvCacheManager::record_copy(std::vector<BlockCopy>& ops, BlockCopy op,
                                 std::vector<uint32_t>* src_marks,
                                 std::vector<uint32_t>* dst_marks) {
  ops.push_back(op);
  if (src_marks != nullptr) ++(*src_marks)[op.src];
  if (dst_marks != nullptr) ++(*dst_marks)[op.dst];
}

bool KvCacheManager::scheduled_this_step(const Sequence& seq) const {
  return seq.scheduled_step == step_;
}

void KvCacheManager::set_state(Sequence& seq, SequenceState state) {
  num_running_ += (state == SequenceState::kRunning) - (seq.state == SequenceState::kRunning);
  seq.state = state;
}

void KvCacheManager::mark_scheduled(Sequence& seq, int32_t settled_tokens) {
  if (seq.scheduled_step == step_) return;  // keep the tokens settled before this step
  seq.scheduled_step = step_;
  seq.settled_tokens = settled_tokens;
}

void KvCacheManager::release_device_blocks(Sequence& seq) {
  if (!seq.retention.empty()) [[unlikely]] {
    apply_retention(seq);
  }
  // Tail first, as one free: a prompt's later blocks are evicted before its shared
  // beginning, and its clean blocks are reused in the same order.
  BlockId last_clean = kNoBlock;
  for (auto it = seq.blocks.rbegin(); it != seq.blocks.rend(); ++it) {
    if (device_pending_[*it] > 0 && device_pool_.ref_count_unchecked(*it) == 1) {
      deferred_device_.push_back(*it);  // still named by a pending copy
    } else {
      device_pool_.release_unchecked(*it, last_clean);
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

void KvCacheManager::release_host_block(BlockId block) {
  if (host_pending_[block] > 0) {
    deferred_host_.push_back(block);  // a pending copy still reads or writes it
  } else {
    const BlockId released[] = {block};
    host_pool_.free_unchecked(released);
  }
}

void KvCacheManager::release_host_blocks(Sequence& seq) {
  BlockId last_clean = kNoBlock;
  for (auto it = seq.host_blocks.rbegin(); it != seq.host_blocks.rend(); ++it) {
    if (host_pending_[*it] > 0) {
      deferred_host_.push_back(*it);  // a pending swap still reads or writes it
    } else {
      host_pool_.release_unchecked(*it, last_clean);
    }
  }
  seq.host_blocks.clear();
}

void KvCacheManager::release_deferred() {
  auto release = [](std::vector<BlockId>& deferred, const std::vector<uint32_t>& pending,
                    BlockPool& pool) {
    std::erase_if(deferred, [&](BlockId b) {
      if (pending[b] > 0) return false;
      const BlockId released[] = {b};
      pool.free_unchecked(released);
      return true;
    });
  };
  release(deferred_device_, device_pending_, device_pool_);
  release(deferred_host_, host_pending_, host_pool_);
}

std::vector<BlockCopy> KvCacheManager::take_pending_copies() {
  internal::for_each_held_block(std::span<const BlockCopy>(pending_copies_),
                                [this](bool on_device, BlockId b) { release_hold(on_device, b); });
  std::vector<BlockCopy> taken = std::exchange(pending_copies_, {});
  release_deferred();
  ++step_;
  return taken;
}

SwapOps KvCacheManager::take_pending_swaps() {
  internal::for_each_held_block(pending_swaps_,
                                [this](bool on_device, BlockId b) { release_hold(on_device, b); });
  SwapOps taken = std::exchange(pending_swaps_, {});
  release_deferred();
  ++step_;
  return taken;
}

// Drops one hold of a block a taken copy named (see cache/pending_copies.h).
void KvCacheManager::release_hold(bool on_device, BlockId block) {
  --(on_device ? device_pending_ : host_pending_)[block];
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
  const BlockPool::Stats host = host_pool_.stats();
  s.cached_host_blocks = host.cached_blocks;
  s.host_evictions = host.evictions;
  return s;
}

}  // namespace pagedkv
