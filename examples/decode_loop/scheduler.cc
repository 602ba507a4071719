// The example engine: scheduling on pagedkv::KvCacheManager, KV movement and the model
// (see scheduler.h for the order of one step).
#include "scheduler.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "draft.h"
#include "pagedkv/remote_namespace.h"
#include "xxhash.h"

namespace decode_loop {
namespace {

using pagedkv::PreemptionMode;
using Where = SequenceRecord::Where;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Adds the nanoseconds from its construction to its destruction to *total.
struct Stopwatch {
  int64_t* total;
  int64_t start = now_ns();
  ~Stopwatch() { *total += now_ns() - start; }
};

}  // namespace

MechanismSet faulted_mechanisms(Fault fault) {
  switch (fault) {
    case Fault::kNone:
      return {};
    case Fault::kSkipCopies:
      return {Mechanism::kCowCopy};
    case Fault::kSkipSwapIn:
    case Fault::kCorruptSwapIn:
      return {Mechanism::kSwapIn};
    case Fault::kSkipPromote:  // a state group's promotions restore host-tier checkpoints
      return {Mechanism::kPromote, Mechanism::kExchange, Mechanism::kStateHostRestore};
    case Fault::kSkipRestore:
      return {Mechanism::kStateRestore, Mechanism::kStateHostRestore};
    case Fault::kCorruptRemote:
      return {};  // the checksums turn the corrupt blocks into misses: nothing breaks
    case Fault::kKeepRejected:
      return {Mechanism::kRollback};
  }
  return {};
}

MechanismSet RunStats::exercised() const {
  MechanismSet set;
  for (size_t i = 0; i < kMechanisms.size(); ++i) {
    if (mechanism_sequences[i] > 0) set.add(kMechanisms[i]);
  }
  return set;
}

void Engine::Batch::clear(int32_t num_groups) {
  seqs.clear();
  tokens.clear();
  positions.clear();
  slots.resize(num_groups);
  for (std::vector<int64_t>& group : slots) group.clear();
  logit_index.clear();
  qo_indptr.assign(1, 0);
  logit_rows.clear();
  max_query_len = 0;
}

Engine::Engine(const Model& model, const EngineOptions& options)
    : model_(model), options_(options) {}

Engine::~Engine() = default;

absl::StatusOr<std::unique_ptr<Engine>> Engine::create(const Model& model,
                                                       const EngineOptions& options) {
  std::unique_ptr<Engine> engine(new Engine(model, options));
  engine->start_ns_ = now_ns();
  const CachePlan& plan = options.cache;
  absl::StatusOr<std::unique_ptr<KvStore>> store =
      KvStore::create(options.device, model, plan, options.kv_format);
  if (!store.ok()) return store.status();
  engine->store_ = *std::move(store);
  // Each layer group gets its own pools, from the plan that also sized the store: the
  // manager's group g is the plan's group g and the store's storage g.
  absl::StatusOr<pagedkv::KvCachePlan> kv_plan = plan.kv_plan();
  if (!kv_plan.ok()) return kv_plan.status();
  if (options.remote_store != nullptr) {
    absl::Status status = engine->create_remote_tier();
    if (!status.ok()) return status;
  }
  Engine* self = engine.get();
  absl::StatusOr<pagedkv::KvCacheManager::Options> manager_options = kv_plan->manager_options(
      {.enable_host_cache = options.enable_host_cache,
       .host_admission = options.host_admission,
       .eviction_policy = options.eviction_policy,
       .watermark_blocks = options.watermark_blocks,
       // The tier learns of computed blocks from the events, and forwards them.
       .event_sink = engine->remote_ != nullptr ? engine->remote_.get() : options.event_sink,
       .preemption_hooks = self,
       .victim_policy = [self](std::span<const pagedkv::SequenceInfo> running, SeqId requester) {
         return self->choose_victim(running, requester);
       }});
  if (!manager_options.ok()) return manager_options.status();
  absl::StatusOr<pagedkv::KvCacheManager> manager =
      pagedkv::KvCacheManager::create(*std::move(manager_options));
  if (!manager.ok()) return manager.status();
  engine->manager_ = std::make_unique<pagedkv::KvCacheManager>(*std::move(manager));
  engine->tables_.resize(plan.num_groups());
  engine->stats_.peak_group_blocks.assign(plan.num_groups(), 0);
  engine->prefill_.clear(plan.num_groups());
  engine->decode_.clear(plan.num_groups());
  return engine;
}

// The tier's namespace: the model (its preset and seed, which make the weights) and the
// cache's shape, so that only engines computing identical K/V share blocks.
absl::Status Engine::create_remote_tier() {
  const CachePlan& plan = options_.cache;
  if (plan.num_groups() != 1 || plan.groups[0].kind != pagedkv::AttentionKind::kFull) {
    return absl::FailedPreconditionError(
        "--remote needs a model with one full-attention layer group (--model llama or mla)");
  }
  const pagedkv::KvStorage& storage = store_->storage(0);
  pagedkv::RemoteTierOptions tier = options_.remote;
  tier.namespace_digest = pagedkv::remote_namespace_digest(pagedkv::remote_namespace_for(
      storage.spec(), options_.remote_model_id, storage.layout(), /*tp_rank=*/0, /*tp_size=*/1));
  tier.payload_bytes = storage.spec().bytes_per_block();
  tier.next_sink = options_.event_sink;
  absl::StatusOr<std::unique_ptr<pagedkv::RemoteTier>> created =
      pagedkv::RemoteTier::create(options_.remote_store, std::move(tier));
  if (!created.ok()) return created.status();
  remote_ = *std::move(created);
  return absl::OkStatus();
}

// --- preemption ----------------------------------------------------------------------------

PreemptionMode Engine::mode_for(SeqId victim) {
  // A swap copies the blocks the victim holds in every group to that group's host pool.
  bool swap_fits = true;
  for (int32_t g = 0; g < num_groups(); ++g) {
    absl::StatusOr<pagedkv::SequenceView> view = manager_->sequence(victim, g);
    if (!view.ok()) return PreemptionMode::kRecompute;
    const int32_t blocks = is_state_group(g)
                               ? static_cast<int32_t>(view->block_table.size())
                               : pagedkv::num_blocks_for_tokens(view->num_computed_tokens,
                                                                options_.cache.config.block_size) -
                                     view->first_held_block;
    swap_fits = swap_fits && blocks <= (*manager_->host_pool(g))->num_free_blocks();
  }
  switch (options_.preemption) {
    case PreemptionPolicy::kRecompute:
      return PreemptionMode::kRecompute;
    case PreemptionPolicy::kSwap:
      return swap_fits ? PreemptionMode::kSwap : PreemptionMode::kRecompute;
    case PreemptionPolicy::kMixed:
      break;
  }
  // A real engine would weigh recompute FLOPs against transfer bytes; the example alternates
  // so that one run shows both modes.
  return swap_fits && preemption_count_ % 2 == 0 ? PreemptionMode::kSwap
                                                 : PreemptionMode::kRecompute;
}

// Lowest priority, then latest arrival, among sequences not yet scheduled this step: a
// scheduled sequence already holds this step's slots and must not lose them.
std::optional<pagedkv::Preemption> Engine::choose_victim(
    std::span<const pagedkv::SequenceInfo> running, SeqId requester) {
  const pagedkv::SequenceInfo* victim = nullptr;
  for (const pagedkv::SequenceInfo& info : running) {
    if (info.id == requester || scheduled_.contains(info.id)) continue;
    if (victim == nullptr || info.priority < victim->priority ||
        (info.priority == victim->priority && info.arrival > victim->arrival)) {
      victim = &info;
    }
  }
  if (victim == nullptr) return std::nullopt;
  return pagedkv::Preemption{victim->id, mode_for(victim->id)};
}

// PreemptionHooks: the manager has released (recompute) or scheduled the copy-out (swap)
// of `victim`'s blocks; move it to the matching queue.
void Engine::on_preempt(SeqId victim, PreemptionMode mode) {
  SequenceRecord& rec = records_.at(victim);
  std::erase(running_, victim);
  preempted_this_step_ = true;
  ++preemption_count_;
  if (mode == PreemptionMode::kRecompute) {
    rec.where = Where::kWaiting;
    rec.decoding = false;         // its tokens are computed again from its first uncached block
    waiting_.push_front(victim);  // resumes first, with all its tokens to recompute
  } else {
    rec.where = Where::kSwapped;
    swapped_.push_back(victim);
  }
}

absl::Status Engine::preempt_self(SeqId seq) { return manager_->preempt(seq, mode_for(seq)); }

int32_t Engine::next_tokens(const SequenceRecord& rec, int32_t computed) const {
  const int32_t remaining = static_cast<int32_t>(rec.tokens.size()) - computed;
  return options_.prefill_chunk > 0 ? std::min(remaining, options_.prefill_chunk) : remaining;
}

void Engine::add_rows(Batch& batch, SeqId seq, int32_t first, int32_t n,
                      std::optional<size_t> batch_offset) {
  const SequenceRecord& rec = records_.at(seq);
  batch.seqs.push_back(seq);
  for (int32_t t = first; t < first + n; ++t) {
    batch.tokens.push_back(rec.tokens[t]);
    batch.positions.push_back(t);
  }
  for (int32_t g = 0; g < num_groups(); ++g) {
    // The call's last n slots: an admission's first ones may be remote loads.
    const std::span<const int64_t> slots =
        batch_offset.has_value() ? manager_->batch_slot_mapping(g)->subspan(*batch_offset, n)
                                 : manager_->slot_mapping(g)->last(static_cast<size_t>(n));
    batch.slots[g].insert(batch.slots[g].end(), slots.begin(), slots.end());
  }
  batch.qo_indptr.push_back(static_cast<int32_t>(batch.tokens.size()));
  batch.max_query_len = std::max(batch.max_query_len, n);
  const bool last = first + n == static_cast<int32_t>(rec.tokens.size());
  partial_prefills_ += last ? 0 : 1;
  batch.logit_index.push_back(last ? static_cast<int32_t>(batch.logit_rows.size()) : -1);
  if (last) batch.logit_rows.push_back(static_cast<int32_t>(batch.tokens.size()) - 1);
}

// --- scheduling ------------------------------------------------------------------------------

// Every running sequence in one batched call that preempts while blocks are short (the
// manager offers only sequences without slots this step as victims): a decoding one gets
// one slot, a prefilling one its next chunk. A sequence preempted by an earlier one of the
// batch fails there.
absl::Status Engine::schedule_running() {
  std::vector<SeqId> batch;
  for (const SeqId seq : running_) {
    absl::StatusOr<bool> drafted = schedule_draft(seq);
    if (!drafted.ok()) return drafted.status();
    if (!*drafted) batch.push_back(seq);
  }
  std::vector<int32_t> counts, firsts;
  for (const SeqId seq : batch) {
    absl::StatusOr<pagedkv::SequenceView> view = manager_->sequence(seq);
    if (!view.ok()) return view.status();
    firsts.push_back(view->num_computed_tokens);
    counts.push_back(next_tokens(records_.at(seq), view->num_computed_tokens));
  }
  absl::StatusOr<pagedkv::KvCacheManager::SlotBatch> slots =
      manager_->allocate_slots_batch(batch, counts, /*num_lookahead=*/0, /*preempt=*/true);
  if (!slots.ok()) return slots.status();
  size_t offset = 0;  // of sequence i's slots in the batch's
  for (size_t i = 0; i < batch.size(); offset += counts[i], ++i) {
    const SeqId seq = batch[i];
    SequenceRecord& rec = records_.at(seq);
    if (const absl::Status& status = slots->statuses[i]; !status.ok()) {
      if (rec.where != Where::kRunning) continue;  // preempted by another of the batch
      if (!absl::IsResourceExhausted(status)) return status;
      // Nobody left to preempt: this sequence yields its own blocks. A forked sample whose
      // state copy is still pending cannot (the manager counts it scheduled until this
      // step's copies run): it sits this step out.
      absl::Status yielded = preempt_self(seq);
      if (!yielded.ok() && !absl::IsFailedPrecondition(yielded)) return yielded;
      continue;
    }
    scheduled_.insert(seq);
    if (!rec.decoding && rec.num_generated() > 0) stats_.recompute_tokens += counts[i];
    add_rows(rec.decoding ? decode_ : prefill_, seq, firsts[i], counts[i], offset);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Engine::schedule_draft(SeqId seq) {
  SequenceRecord& rec = records_.at(seq);
  // Greedy decoding only: the target's own pick decides a draft's fate (sampled sequences
  // would need rejection sampling). A draft is never longer than what is left to generate.
  const int32_t left = rec.max_new_tokens - rec.num_generated();
  if (options_.speculative == 0 || !rec.decoding || rec.sampling.temperature != 0.0f ||
      rec.pending_forks > 0 || left < 2) {
    return false;
  }
  absl::StatusOr<pagedkv::SequenceView> view = manager_->sequence(seq);
  if (!view.ok()) return view.status();
  const int32_t computed = view->num_computed_tokens;
  if (computed + 1 != std::ssize(rec.tokens)) return false;
  const int32_t max_draft = std::min(options_.speculative, left - 1);
  const std::vector<TokenId> draft =
      options_.drafter ? options_.drafter(rec, max_draft) : propose_draft(rec.tokens, max_draft);
  if (draft.empty()) return false;
  absl::StatusOr<std::span<const int64_t>> slots = manager_->allocate_draft_slots(seq, 1, draft);
  if (absl::IsResourceExhausted(slots.status())) return false;  // decode as usual
  if (!slots.ok()) return slots.status();
  scheduled_.insert(seq);
  Batch& batch = verify_;
  batch.seqs.push_back(seq);
  batch.logit_index.push_back(static_cast<int32_t>(batch.logit_rows.size()));
  const auto rows = static_cast<int32_t>(draft.size()) + 1;
  for (int32_t j = 0; j < rows; ++j) {
    batch.tokens.push_back(j == 0 ? rec.tokens.back() : draft[j - 1]);
    batch.positions.push_back(computed + j);
    batch.logit_rows.push_back(static_cast<int32_t>(batch.tokens.size()) - 1);
  }
  for (int32_t g = 0; g < num_groups(); ++g) {
    const std::span<const int64_t> group_slots = *manager_->slot_mapping(g);
    batch.slots[g].insert(batch.slots[g].end(), group_slots.begin(), group_slots.end());
  }
  batch.qo_indptr.push_back(static_cast<int32_t>(batch.tokens.size()));
  batch.max_query_len = std::max(batch.max_query_len, rows);
  return true;
}

absl::Status Engine::schedule_swapped() {
  while (!swapped_.empty() && !preempted_this_step_) {
    const SeqId seq = swapped_.front();
    SequenceRecord& rec = records_.at(seq);
    absl::StatusOr<pagedkv::SequenceView> view = manager_->sequence(seq);
    if (!view.ok()) return view.status();
    const int32_t computed = view->num_computed_tokens;
    const int32_t n = next_tokens(rec, computed);
    // Room in every group for its blocks and those of its next tokens.
    const int32_t new_blocks =
        (n + options_.cache.config.block_size - 1) / options_.cache.config.block_size + 1;
    bool room = true;
    for (int32_t g = 0; g < num_groups() && room; ++g) {
      absl::StatusOr<pagedkv::SequenceView> group_view = manager_->sequence(seq, g);
      if (!group_view.ok()) return group_view.status();
      const auto needed = static_cast<int32_t>(group_view->host_blocks.size()) + new_blocks;
      room = needed <= (*manager_->device_pool(g))->num_free_blocks();
    }
    if (!room) break;
    absl::Status status = manager_->swap_in(seq);
    if (!status.ok()) return status;
    swapped_.pop_front();
    rec.where = Where::kRunning;
    running_.push_back(seq);
    scheduled_.insert(seq);
    absl::StatusOr<std::span<const int64_t>> slots = manager_->allocate_slots(seq, n);
    if (!slots.ok()) return slots.status();  // room was checked above
    if (!rec.decoding && rec.num_generated() > 0) stats_.recompute_tokens += n;
    add_rows(rec.decoding ? decode_ : prefill_, seq, computed, n);
  }
  return absl::OkStatus();
}

// The remote tier looks up the first waiting sequences ahead of their admission, so that
// their fetches overlap the steps before it.
absl::Status Engine::look_up_waiting() {
  constexpr size_t kLookahead = 16;
  for (size_t i = 0; i < std::min(kLookahead, waiting_.size()); ++i) {
    const SequenceRecord& rec = records_.at(waiting_[i]);
    absl::Status status = remote_->start_lookup(rec.seq, rec.tokens, {}, *manager_);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

// Admission is in order: the first waiting sequence waits for its lookup (as the wait
// policy says) and those behind it with it.
bool Engine::head_ready() const {
  return remote_ == nullptr || waiting_.empty() || remote_->ready(waiting_.front());
}

absl::Status Engine::schedule_waiting() {
  int32_t prefill_tokens = static_cast<int32_t>(prefill_.tokens.size());  // continued chunks
  while (!waiting_.empty() && swapped_.empty() && !preempted_this_step_ && partial_prefills_ == 0 &&
         static_cast<int32_t>(running_.size()) < options_.max_running) {
    if (remote_ != nullptr) {
      Stopwatch in_remote{&remote_ns_};
      absl::Status status = look_up_waiting();
      if (!status.ok()) return status;
      if (!head_ready()) break;
    }
    const SeqId seq = waiting_.front();
    SequenceRecord& rec = records_.at(seq);
    if (!rec.in_manager) {
      absl::Status status = manager_->add_sequence(seq, rec.tokens);
      if (!status.ok()) return status;
      rec.in_manager = true;
    }
    // With the host tier, the match continues into host blocks and promotes them.
    const int64_t host_hits_before = manager_->stats().host_hit_tokens;
    absl::StatusOr<int32_t> cached = manager_->match_prefix(seq);
    if (!cached.ok()) return cached.status();
    const int64_t host_hits = manager_->stats().host_hit_tokens - host_hits_before;
    // The remote tier's verified blocks continue the claim: allocated with the rest, their
    // payloads written after the step's copies (run_loads) instead of computed.
    const int32_t loadable = remote_ != nullptr ? remote_->loadable_tokens(seq, *cached) : 0;
    const auto len = static_cast<int32_t>(rec.tokens.size());
    const int32_t num_new = next_tokens(rec, *cached + loadable);
    absl::StatusOr<std::span<const int64_t>> slots =
        prefill_tokens > 0 && prefill_tokens + num_new > options_.max_prefill_tokens
            ? absl::ResourceExhaustedError("step's prefill token budget is spent")
            : manager_->allocate_slots(seq, loadable + num_new);
    if (slots.ok() && remote_ != nullptr) {
      absl::StatusOr<int32_t> loaded = remote_->load(seq, *cached, *slots);
      if (!loaded.ok()) return loaded.status();
      stats_.admit_remote_tokens += *loaded;
      if (*loaded > 0) rec.mechanisms.add(Mechanism::kRemote);
    }
    if (!slots.ok()) {
      if (!absl::IsResourceExhausted(slots.status())) return slots.status();
      // Not admitted this step: give back the claimed prefix so it stays evictable.
      absl::Status status = manager_->free(seq);
      if (!status.ok()) return status;
      rec.in_manager = false;
      break;
    }
    waiting_.pop_front();
    rec.where = Where::kRunning;
    rec.decoding = false;
    running_.push_back(seq);
    scheduled_.insert(seq);
    // Host hits are marked by their promote and exchange ops (record_mechanisms).
    if (*cached > host_hits) rec.mechanisms.add(Mechanism::kPrefixHit);
    // With state groups every hit ends where each holds a checkpoint, restored into the
    // sequence's new slot.
    if (*cached > 0 && has_state_groups()) rec.mechanisms.add(Mechanism::kStateRestore);
    stats_.admit_query_tokens += len;
    stats_.admit_hit_tokens += *cached;
    stats_.admit_host_hit_tokens += host_hits;
    if (rec.num_generated() > 0) {  // preempted by recompute, now recomputed
      rec.mechanisms.add(Mechanism::kRecompute);
      stats_.recompute_tokens += num_new;
    }
    prefill_tokens += num_new;
    add_rows(prefill_, seq, *cached + loadable, num_new);
  }
  return absl::OkStatus();
}

// --- execution -------------------------------------------------------------------------------

absl::Status Engine::execute_kv_ops() {
  pagedkv::StepOps ops = manager_->take_step_ops();
  record_mechanisms(ops);  // before a fault drops any: whom they were meant for
  if (options_.fault == Fault::kSkipCopies) ops.copy_on_write.clear();
  if (options_.fault == Fault::kSkipSwapIn) ops.swap_in.clear();
  if (options_.fault == Fault::kSkipPromote) {
    ops.promote.clear();
    ops.exchange.clear();
  }
  if (options_.fault == Fault::kSkipRestore) skip_restores(ops);
  step_saves_ = ops.save_state;
  saves_run_ = 0;
  stats_.swap_out_blocks_executed += static_cast<int64_t>(ops.swap_out.size());
  stats_.swap_in_blocks_executed += static_cast<int64_t>(ops.swap_in.size());
  stats_.cow_copies_executed += static_cast<int64_t>(ops.copy_on_write.size());
  stats_.demote_blocks_executed += static_cast<int64_t>(ops.demote.size());
  stats_.promote_blocks_executed += static_cast<int64_t>(ops.promote.size());
  stats_.exchange_blocks_executed += static_cast<int64_t>(ops.exchange.size());
  if (ops.empty()) return absl::OkStatus();
  absl::Status status = store_->execute(ops);
  if (status.ok() && options_.fault == Fault::kCorruptSwapIn) {
    status = corrupt_swap_ins(ops.swap_in);
  }
  return status;
}

// Marks each op's mechanism on the running sequences whose block tables hold the device
// block it fills, in the order the store runs them (a promotion may read a host block this
// step's demotion wrote).
void Engine::record_mechanisms(const pagedkv::StepOps& ops) {
  // block_key(group, device block) -> what filled it
  absl::flat_hash_map<int64_t, MechanismSet> filled;
  const auto host_hit = [&](Mechanism mechanism, const pagedkv::BlockCopy& op,
                            pagedkv::BlockId host_block) {
    MechanismSet set = {mechanism};
    if (demoted_host_blocks_.contains(block_key(op.group, host_block))) set.add(Mechanism::kDemote);
    return set;
  };
  for (const pagedkv::BlockCopy& op : ops.swap_out) {
    demoted_host_blocks_.erase(block_key(op.group, op.dst));
  }
  for (const pagedkv::BlockCopy& op : ops.demote) {
    demoted_host_blocks_.insert(block_key(op.group, op.dst));
  }
  for (const pagedkv::BlockCopy& op : ops.exchange) {  // reads host dst, then demotes into it
    filled[block_key(op.group, op.src)] |= host_hit(Mechanism::kExchange, op, op.dst);
    demoted_host_blocks_.insert(block_key(op.group, op.dst));
  }
  for (const pagedkv::BlockCopy& op : ops.copy_on_write) {
    filled[block_key(op.group, op.dst)].add(Mechanism::kCowCopy);
  }
  for (const pagedkv::BlockCopy& op : ops.swap_in) {
    filled[block_key(op.group, op.dst)].add(Mechanism::kSwapIn);
  }
  for (const pagedkv::BlockCopy& op : ops.promote) {  // a state group's: a restore
    const Mechanism m =
        is_state_group(op.group) ? Mechanism::kStateHostRestore : Mechanism::kPromote;
    filled[block_key(op.group, op.dst)] |= host_hit(m, op, op.src);
  }
  if (filled.empty()) return;
  for (const SeqId seq : running_) {
    MechanismSet& mechanisms = records_.at(seq).mechanisms;
    for (int32_t g = 0; g < num_groups(); ++g) {
      absl::StatusOr<pagedkv::SequenceView> view = manager_->sequence(seq, g);
      if (!view.ok()) continue;
      for (const pagedkv::BlockId block : view->block_table.subspan(view->first_held_block)) {
        if (const auto it = filled.find(block_key(g, block)); it != filled.end()) {
          mechanisms |= it->second;
        }
      }
    }
  }
}

bool Engine::waits_for_transfers() const {
  return imports_pending_ > 0 || manager_->stats().pinned_blocks > 0;
}

bool Engine::is_state_group(int32_t group) const {
  return options_.cache.groups[group].kind == pagedkv::AttentionKind::kState;
}

bool Engine::has_state_groups() const {
  for (int32_t g = 0; g < num_groups(); ++g) {
    if (is_state_group(g)) return true;
  }
  return false;
}

void Engine::skip_restores(pagedkv::StepOps& ops) {
  absl::flat_hash_set<int64_t> held;  // block_key of the running sequences' state slots
  for (const SeqId seq : running_) {
    for (int32_t g = 0; g < num_groups(); ++g) {
      absl::StatusOr<pagedkv::SequenceView> view = manager_->sequence(seq, g);
      if (!is_state_group(g) || !view.ok()) continue;
      for (const pagedkv::BlockId slot : view->block_table) held.insert(block_key(g, slot));
    }
  }
  std::erase_if(ops.copy_state, [&](const pagedkv::BlockCopy& op) {
    return !held.contains(block_key(op.group, op.src));
  });
  // A state group's promotions restore checkpoints of the host tier.
  std::erase_if(ops.promote,
                [&](const pagedkv::BlockCopy& op) { return is_state_group(op.group); });
}

absl::Status Engine::set_state_batch(const Batch& batch) {
  StateBatch state;
  state.seqs = batch.seqs;
  state.row_indptr = batch.qo_indptr;
  state.positions = batch.positions;
  state.slots.resize(num_groups());
  state.row_slots.resize(num_groups());
  for (int32_t g = 0; g < num_groups(); ++g) {
    if (!is_state_group(g)) continue;
    state.row_slots[g] = batch.slots[g];  // a draft's own slot, else -1
    state.slots[g].resize(batch.seqs.size());
    absl::Status status = manager_->write_state_slots(batch.seqs, g, state.slots[g]);
    if (!status.ok()) return status;
  }
  const absl::flat_hash_set<SeqId> in_batch(batch.seqs.begin(), batch.seqs.end());
  for (const pagedkv::StateSave& save : step_saves_) {
    if (in_batch.contains(save.seq)) state.saves.push_back(save);
  }
  saves_run_ += std::ssize(state.saves);
  return store_->set_state_batch(std::move(state));
}

// Fault::kCorruptSwapIn: every block a swap-in copy filled gets one flipped bit, as from
// a faulty transfer path. One bit per block rather than per sequence: in fp8, one flipped
// element stays within the format's range and can move the logits less than the bound.
absl::Status Engine::corrupt_swap_ins(std::span<const pagedkv::BlockCopy> swap_ins) {
  for (const pagedkv::BlockCopy& op : swap_ins) {
    if (is_state_group(op.group)) continue;
    // A block with no element below 1 (fp8's scales make most stored values larger; a
    // last block may hold a single token) stays as it is.
    absl::Status status = store_->flip_exponent_bit(op.group, op.dst);
    if (!status.ok() && !absl::IsNotFound(status)) return status;
  }
  return absl::OkStatus();
}

absl::Status Engine::run_batch(Batch& batch, bool prefill, bool verify) {
  if (batch.seqs.empty()) return absl::OkStatus();
  const int64_t start = now_ns();
  for (int32_t g = 0; g < num_groups(); ++g) {
    if (is_state_group(g)) continue;  // no K/V
    absl::Status status = manager_->build_block_tables(batch.seqs, &tables_[g], g);
    if (!status.ok()) return status;
  }
  absl::Status status = store_->set_batch(
      batch.slots, tables_,
      prefill ? std::span<const int32_t>(batch.qo_indptr) : std::span<const int32_t>(),
      batch.max_query_len);
  if (!status.ok()) return status;
  if (has_state_groups()) status = set_state_batch(batch);
  if (!status.ok()) return status;
  status = model_.forward(
      batch.tokens, batch.positions, [&](const AttentionIo& io) { return store_->attend(io); },
      [&](const ScanIo& io) { return store_->scan(io); }, batch.logit_rows, &logits_, &ws_);
  if (!status.ok()) return status;
  const double seconds = static_cast<double>(now_ns() - start) * 1e-9;
  if (prefill && !verify) {
    stats_.prefill_seconds += seconds;
    stats_.prefill_tokens += static_cast<int64_t>(batch.tokens.size());
  } else {
    stats_.decode_seconds += seconds;
    stats_.decode_tokens += static_cast<int64_t>(batch.tokens.size());
    ++stats_.decode_steps;
  }
  return verify ? commit_verified(batch) : commit(batch);
}

absl::Status Engine::commit(const Batch& batch) {
  const int32_t vocab = model_.config().vocab_size;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const SeqId seq = batch.seqs[i];
    if (batch.logit_index[i] < 0) continue;  // a prefill chunk: its prompt goes on next step
    records_.at(seq).decoding = true;
    const std::span<const float> logits(
        logits_.data() + static_cast<size_t>(batch.logit_index[i]) * vocab, vocab);
    // Parallel samples: fork after the prompt's prefill; every sample shares the prompt's
    // blocks and copies the partial last block on its first append (copy-on-write).
    std::vector<SeqId> family = {seq};
    const int32_t num_forks = records_.at(seq).pending_forks;
    // A copy (inserting children rehashes), taken only when there are children: a record
    // can hold its logits.
    const SequenceRecord parent = num_forks > 0 ? records_.at(seq) : SequenceRecord{};
    for (int32_t s = 1; s <= num_forks; ++s) {
      const SeqId child = seq_id(parent.request, s);
      absl::Status status = manager_->fork(seq, child);
      if (!status.ok() && !absl::IsResourceExhausted(status)) return status;
      SequenceRecord rec = parent;
      rec.seq = child;
      rec.sample = s;
      rec.sampling.sample = s;
      rec.pending_forks = 0;
      ++stats_.sequences;
      if (!status.ok()) {
        // No state slot for a copy of the parent's: the sample waits as a sequence of its
        // own over the same prompt, which the prefix cache then serves.
        rec.where = Where::kWaiting;
        rec.decoding = false;
        rec.in_manager = false;
        records_[child] = std::move(rec);
        waiting_.push_back(child);
        continue;
      }
      rec.mechanisms.add(Mechanism::kFork);  // and what reached the blocks it shares
      records_[child] = std::move(rec);
      running_.push_back(child);
      family.push_back(child);
    }
    records_.at(seq).pending_forks = 0;
    for (const SeqId member : family) {
      SequenceRecord& rec = records_.at(member);
      const TokenId token = pick_token(logits, rec.sampling, rec.num_generated());
      rec.tokens.push_back(token);
      if (options_.record_logits) rec.logits.insert(rec.logits.end(), logits.begin(), logits.end());
      ++stats_.generated_tokens;
      if (rec.num_generated() >= rec.max_new_tokens) {
        absl::Status status = finish(rec);
        if (!status.ok()) return status;
        continue;
      }
      if (options_.hand_off) {  // its prompt is computed: another engine decodes it
        to_export_.push_back(member);
        continue;
      }
      const TokenId appended[] = {token};
      absl::Status status = manager_->append_tokens(member, appended);
      if (!status.ok()) return status;
    }
  }
  return absl::OkStatus();
}

absl::Status Engine::commit_verified(const Batch& batch) {
  const int32_t vocab = model_.config().vocab_size;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const SeqId seq = batch.seqs[i];
    SequenceRecord& rec = records_.at(seq);
    const int32_t first_row = batch.qo_indptr[i];
    const int32_t num_draft = batch.qo_indptr[i + 1] - first_row - 1;
    auto logits_at = [&](int32_t j) {
      return std::span<const float>(
          logits_.data() + static_cast<size_t>(batch.logit_index[i] + j) * vocab, vocab);
    };
    // Row j's logits pick the token after draft j - 1: a draft is accepted while it is the
    // target's own pick.
    std::vector<TokenId> picks;
    int32_t accepted = 0;
    for (int32_t j = 0; j <= num_draft; ++j) {
      picks.push_back(pick_token(logits_at(j), rec.sampling, rec.num_generated() + j));
      if (j == accepted && j < num_draft && picks[j] == batch.tokens[first_row + j + 1]) {
        ++accepted;
      }
    }
    if (accepted < num_draft) rec.mechanisms.add(Mechanism::kRollback);
    if (options_.fault == Fault::kKeepRejected) accepted = num_draft;
    absl::Status status = manager_->accept_draft(seq, accepted);
    if (!status.ok()) return status;
    stats_.draft_tokens += num_draft;
    stats_.accepted_draft_tokens += accepted;
    ++stats_.speculative_steps;
    stats_.speculative_tokens += accepted + 1;
    // The kept drafts, then the target's pick after the last of them.
    for (int32_t j = 0; j <= accepted; ++j) {
      const TokenId token = j < accepted ? batch.tokens[first_row + j + 1] : picks[j];
      rec.tokens.push_back(token);
      if (options_.record_logits) {
        const std::span<const float> logits = logits_at(j);
        rec.logits.insert(rec.logits.end(), logits.begin(), logits.end());
      }
      ++stats_.generated_tokens;
    }
    if (rec.num_generated() >= rec.max_new_tokens) {
      status = finish(rec);
      if (!status.ok()) return status;
      continue;
    }
    const TokenId appended[] = {rec.tokens.back()};
    status = manager_->append_tokens(seq, appended);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

namespace {

uint64_t output_hash(const SequenceRecord& rec) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, &rec.request, sizeof(rec.request));
  XXH3_64bits_update(state, &rec.sample, sizeof(rec.sample));
  const std::span<const TokenId> generated = std::span(rec.tokens).subspan(rec.prompt_len);
  XXH3_64bits_update(state, generated.data(), generated.size_bytes());
  const uint64_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return hash;
}

}  // namespace

absl::Status Engine::finish(SequenceRecord& rec) {
  absl::Status status = manager_->free(rec.seq);
  if (!status.ok()) return status;
  rec.in_manager = false;
  rec.where = Where::kDone;
  std::erase(running_, rec.seq);
  stats_.output_digest += output_hash(rec);
  if (options_.on_finish) options_.on_finish(rec);
  std::vector<float>().swap(rec.logits);
  return absl::OkStatus();
}

absl::Status Engine::export_sampled() {
  if (to_export_.empty()) return absl::OkStatus();
  // A fork's state copy must have run before the transfer reads the sample's slot.
  absl::Status status = execute_kv_ops();
  if (!status.ok()) return status;
  for (const SeqId seq : std::exchange(to_export_, {})) {
    absl::StatusOr<pagedkv::KvExport> kv = manager_->export_sequence(seq);
    if (!kv.ok()) return kv.status();
    SequenceRecord& rec = records_.at(seq);
    rec.where = Where::kHandedOff;
    rec.in_manager = false;
    std::erase(running_, seq);
    handoffs_.push_back({.record = rec, .kv = *std::move(kv)});
    std::vector<float>().swap(rec.logits);  // they travel with the hand-off
  }
  return absl::OkStatus();
}

std::vector<SequenceRecord> Engine::take_unfinished() {
  std::vector<SequenceRecord> out;
  for (auto it = records_.begin(); it != records_.end();) {
    const Where where = it->second.where;
    if (where == Where::kDone || where == Where::kHandedOff) {
      ++it;
      continue;
    }
    SequenceRecord rec = std::move(it->second);
    rec.tokens.resize(rec.prompt_len);
    std::vector<float>().swap(rec.logits);
    rec.where = Where::kWaiting;
    rec.in_manager = false;
    rec.decoding = false;
    rec.mechanisms = {};
    out.push_back(std::move(rec));
    records_.erase(it++);
  }
  waiting_.clear();
  swapped_.clear();
  running_.clear();
  return out;
}

void Engine::resubmit(SequenceRecord rec) {
  const SeqId seq = rec.seq;
  rec.where = Where::kWaiting;
  rec.in_manager = false;
  rec.decoding = false;
  records_[seq] = std::move(rec);
  waiting_.push_back(seq);
  ++stats_.sequences;
}

absl::StatusOr<std::optional<pagedkv::KvImport>> Engine::begin_import(const Handoff& handoff) {
  const SeqId seq = handoff.record.seq;
  if (records_.contains(seq)) {
    return absl::AlreadyExistsError(absl::StrCat("import of sequence ", seq, ": it is here"));
  }
  // Sequences preempted here go first; an import holds its blocks until its transfer ends.
  if (!waiting_.empty() || !swapped_.empty() ||
      std::ssize(running_) + imports_pending_ >= options_.max_running) {
    return std::nullopt;
  }
  absl::Status status = manager_->add_sequence(seq, handoff.record.tokens);
  if (!status.ok()) return status;
  const auto num_tokens = static_cast<int32_t>(handoff.kv.tokens.size());
  absl::StatusOr<int32_t> cached = manager_->match_prefix(seq);
  if (cached.ok() && *cached >= num_tokens) {
    // This engine's cache holds the whole prompt: nothing to transfer, admitted as usual.
    status = manager_->free(seq);
    if (!status.ok()) return status;
    resubmit(handoff.record);
    return pagedkv::KvImport{
        .num_local_tokens = num_tokens, .num_tokens = num_tokens, .groups = {}};
  }
  absl::StatusOr<pagedkv::KvImport> import =
      cached.ok() ? manager_->import_slots(seq, num_tokens) : cached.status();
  if (!import.ok()) {
    status = manager_->free(seq);  // gives back the claim
    if (!status.ok()) return status;
    if (absl::IsResourceExhausted(import.status())) return std::nullopt;
    return import.status();
  }
  SequenceRecord rec = handoff.record;
  rec.where = Where::kImporting;
  rec.in_manager = true;
  rec.decoding = false;
  rec.mechanisms.add(Mechanism::kTransfer);
  if (import->num_local_tokens > 0) {
    rec.mechanisms.add(Mechanism::kPrefixHit);
    if (has_state_groups()) rec.mechanisms.add(Mechanism::kStateRestore);
  }
  records_[seq] = std::move(rec);
  ++imports_pending_;
  ++stats_.sequences;
  stats_.admit_query_tokens += num_tokens;
  stats_.admit_hit_tokens += import->num_local_tokens;
  status = execute_kv_ops();
  if (!status.ok()) return status;
  return std::optional<pagedkv::KvImport>(*std::move(import));
}

absl::StatusOr<int32_t> Engine::end_import(SeqId seq, std::span<const int32_t> verified_blocks) {
  absl::StatusOr<int32_t> computed = manager_->complete_import(seq, verified_blocks);
  if (!computed.ok()) return computed;
  --imports_pending_;
  SequenceRecord& rec = records_.at(seq);
  if (*computed == 0) {  // waiting, holding nothing: computed again from its first token
    rec.where = Where::kWaiting;
    waiting_.push_back(seq);
    return computed;
  }
  // Computes the rest of its tokens: the last one alone (decodes) or more (a prefill).
  rec.where = Where::kRunning;
  rec.decoding = *computed + 1 == std::ssize(rec.tokens);
  if (!rec.decoding) rec.mechanisms.add(Mechanism::kRecompute);
  running_.push_back(seq);
  return computed;
}

// Token slots holding real tokens versus slots of used blocks, shared blocks counted once,
// over every group's held blocks; and the peaks of blocks and bytes in use.
void Engine::record_utilization() {
  stats_.peak_running = std::max(stats_.peak_running, static_cast<int32_t>(running_.size()));
  stats_.peak_decoding =
      std::max(stats_.peak_decoding, static_cast<int32_t>(running_.size()) - partial_prefills_);
  const int32_t bs = options_.cache.config.block_size;
  int64_t used_slots = 0;
  int64_t used_bytes = 0;
  int64_t real = 0;
  absl::flat_hash_map<int64_t, int32_t> filled;  // block_key -> real tokens in it
  for (int32_t g = 0; g < num_groups(); ++g) {
    const pagedkv::KvCacheManager::GroupStats s = *manager_->group_stats(g);
    stats_.peak_group_blocks[g] = std::max(stats_.peak_group_blocks[g], s.used_blocks);
    used_bytes += int64_t{s.used_blocks} * options_.cache.groups[g].page_bytes();
    // A state slot holds no token slots.
    if (is_state_group(g)) continue;
    used_slots += int64_t{s.used_blocks} * bs;
    for (const SeqId seq : running_) {
      absl::StatusOr<pagedkv::SequenceView> view = manager_->sequence(seq, g);
      if (!view.ok()) continue;
      for (auto i = static_cast<size_t>(view->first_held_block); i < view->block_table.size();
           ++i) {
        const int32_t n =
            std::clamp(view->num_computed_tokens - static_cast<int32_t>(i) * bs, 0, bs);
        int32_t& f = filled[block_key(g, view->block_table[i])];
        f = std::max(f, n);
      }
    }
  }
  stats_.peak_used_blocks = stats_.peak_group_blocks[0];
  stats_.peak_used_bytes = std::max(stats_.peak_used_bytes, used_bytes);
  for (const auto& [block, n] : filled) real += n;
  stats_.real_slot_steps += static_cast<double>(real);
  stats_.used_slot_steps += static_cast<double>(used_slots);
}

absl::Status Engine::step() {
  absl::Status status = run_step();
  if (!status.ok()) return status;
  print_progress(false);
  if (options_.on_step) options_.on_step(manager_->stats());
  return status;
}

absl::Status Engine::run_step() {
  const int64_t step_start = now_ns();
  remote_ns_ = 0;
  if (remote_ != nullptr) {
    Stopwatch in_remote{&remote_ns_};
    remote_->poll();
  }
  preempted_this_step_ = false;
  partial_prefills_ = 0;
  scheduled_.clear();
  prefill_.clear(num_groups());
  decode_.clear(num_groups());
  verify_.clear(num_groups());
  absl::Status status = schedule_running();
  if (status.ok()) status = schedule_swapped();
  if (status.ok()) status = schedule_waiting();
  if (!status.ok()) return status;
  record_utilization();
  // Nothing runs until the first waiting sequence's lookup lands, or until the blocks that
  // imports or exports hold come free (their transfers end): not a step.
  const bool idle = prefill_.seqs.empty() && decode_.seqs.empty() && verify_.seqs.empty();
  if (idle && (!head_ready() || waits_for_transfers())) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    return absl::OkStatus();
  }
  if (idle) {
    return absl::InternalError(
        absl::StrCat("step ", stats_.steps, ": nothing could be scheduled (", waiting_.size(),
                     " waiting, ", swapped_.size(), " swapped, ", manager_->stats().free_blocks,
                     " free blocks): the KV budget is too small for the longest sequence"));
  }
  status = execute_kv_ops();
  if (status.ok() && remote_ != nullptr) {
    Stopwatch in_remote{&remote_ns_};
    status = remote_->run_loads([this](pagedkv::BlockId b, std::span<const std::byte> in) {
      return store_->storage(0).write_block(b, in);
    });
  }
  // Batches run in allocation order: an admission may have matched a block that a decode
  // step of this same step filled, so those K/V must be written first.
  if (status.ok()) status = run_batch(decode_, /*prefill=*/false);
  if (status.ok()) status = run_batch(verify_, /*prefill=*/true, /*verify=*/true);
  if (status.ok()) status = run_batch(prefill_, /*prefill=*/true);
  if (status.ok() && remote_ != nullptr) {
    Stopwatch in_remote{&remote_ns_};
    status =
        remote_->write_computed(*manager_, [this](pagedkv::BlockId b, std::span<std::byte> out) {
          return store_->storage(0).read_block(b, out);
        });
  }
  if (status.ok() && saves_run_ != std::ssize(step_saves_)) {
    return absl::InternalError(absl::StrCat("step ", stats_.steps, ": ",
                                            std::ssize(step_saves_) - saves_run_,
                                            " state saves of sequences the step did not compute"));
  }
  if (status.ok()) status = export_sampled();
  ++stats_.steps;
  stats_.max_step_seconds =
      std::max(stats_.max_step_seconds, static_cast<double>(now_ns() - step_start) * 1e-9);
  stats_.max_remote_seconds =
      std::max(stats_.max_remote_seconds, static_cast<double>(remote_ns_) * 1e-9);
  return status;
}

void Engine::print_progress(bool final) {
  if (!options_.progress) return;
  const int64_t now = now_ns();
  if (!final && now - last_progress_ns_ < 100'000'000) return;
  last_progress_ns_ = now;
  int64_t done = 0;
  for (const auto& [seq, rec] : records_) done += rec.where == Where::kDone ? 1 : 0;
  std::fprintf(stderr,
               "\r\033[Kstep %lld | running %zu waiting %zu swapped %zu | sequences done %lld/%lld "
               "| generated %lld tokens",
               static_cast<long long>(stats_.steps), running_.size(), waiting_.size(),
               swapped_.size(), static_cast<long long>(done),
               static_cast<long long>(stats_.sequences),
               static_cast<long long>(stats_.generated_tokens));
  if (final) std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
}

absl::Status Engine::submit(const std::vector<Request>& requests) {
  for (const Request& r : requests) {
    if (r.num_samples < 1 || r.num_samples > 64) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", r.id, ": num_samples ", r.num_samples, " must be in [1, 64]"));
    }
    SequenceRecord rec;
    rec.seq = seq_id(r.id, 0);
    rec.request = r.id;
    rec.tokens = r.prompt;
    rec.prompt_len = static_cast<int32_t>(r.prompt.size());
    rec.max_new_tokens = r.max_new_tokens;
    rec.pending_forks = r.num_samples - 1;
    rec.sampling = {.temperature = r.temperature, .seed = options_.seed, .request = r.id};
    waiting_.push_back(rec.seq);
    records_[rec.seq] = std::move(rec);
    stats_.prompt_tokens += static_cast<int64_t>(r.prompt.size());
  }
  stats_.sequences += static_cast<int64_t>(requests.size());
  return absl::OkStatus();
}

absl::Status Engine::run(const std::vector<Request>& requests) {
  absl::Status status = submit(requests);
  while (status.ok() && busy()) status = step();
  if (!status.ok()) {
    print_progress(true);
    return status;
  }
  return finish_run();
}

absl::Status Engine::finish_run() {
  print_progress(true);
  // Drain: ops recorded by the last frees.
  absl::Status status = execute_kv_ops();
  if (!status.ok()) return status;
  stats_.wall_seconds = static_cast<double>(now_ns() - start_ns_) * 1e-9;
  stats_.manager = manager_->stats();
  for (int32_t g = 0; g < num_groups(); ++g)
    stats_.manager_groups.push_back(*manager_->group_stats(g));
  if (options_.on_step) options_.on_step(stats_.manager);
  absl::flat_hash_map<int64_t, bool> complete;
  for (const auto& [seq, rec] : records_) {
    auto [it, inserted] = complete.try_emplace(rec.request, true);
    it->second = it->second && rec.where == Where::kDone;
    for (size_t i = 0; i < kMechanisms.size(); ++i) {
      stats_.mechanism_sequences[i] += rec.mechanisms.contains(kMechanisms[i]) ? 1 : 0;
    }
  }
  stats_.requests = std::ssize(complete);
  for (const auto& [request, ok] : complete) stats_.requests_completed += ok ? 1 : 0;
  return manager_->check_invariants();
}

}  // namespace decode_loop
