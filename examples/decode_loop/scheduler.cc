// The example engine: scheduling on pagedkv::KvCacheManager, KV movement and the model
// (see scheduler.h for the order of one step).
#include "scheduler.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace decode_loop {
namespace {

using pagedkv::PreemptionMode;
using Where = SequenceRecord::Where;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

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
    case Fault::kSkipPromote:
      return {Mechanism::kPromote, Mechanism::kExchange};
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

void Engine::Batch::clear() {
  seqs.clear();
  tokens.clear();
  positions.clear();
  slots.clear();
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
  const ModelConfig& c = model.config();
  const pagedkv::KvCacheSpec spec{.num_layers = c.num_layers,
                                  .num_kv_heads = c.num_kv_heads,
                                  .head_dim = c.head_dim,
                                  .dtype = options.kv_format.cache_dtype,
                                  .block_size = options.block_size};
  absl::StatusOr<std::unique_ptr<KvStore>> store = KvStore::create(
      options.device, spec, options.kv_format, options.num_blocks, options.num_host_blocks);
  if (!store.ok()) return store.status();
  engine->store_ = *std::move(store);
  Engine* self = engine.get();
  absl::StatusOr<pagedkv::KvCacheManager> manager = pagedkv::KvCacheManager::create(
      {.num_blocks = options.num_blocks,
       .block_size = options.block_size,
       .num_host_blocks = options.num_host_blocks,
       .enable_host_cache = options.enable_host_cache,
       .watermark_blocks = options.watermark_blocks,
       .event_sink = options.event_sink,
       .preemption_hooks = self,
       .victim_policy = [self](std::span<const pagedkv::SequenceInfo> running, SeqId requester) {
         return self->choose_victim(running, requester);
       }});
  if (!manager.ok()) return manager.status();
  engine->manager_ = std::make_unique<pagedkv::KvCacheManager>(*std::move(manager));
  return engine;
}

// --- preemption ----------------------------------------------------------------------------

PreemptionMode Engine::mode_for(int32_t num_computed_tokens) {
  const int32_t blocks = pagedkv::num_blocks_for_tokens(num_computed_tokens, options_.block_size);
  const bool swap_fits = blocks <= manager_->host_pool().num_free_blocks();
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
  return pagedkv::Preemption{victim->id, mode_for(victim->num_computed_tokens)};
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
    waiting_.push_front(victim);  // resumes first, with all its tokens to recompute
  } else {
    rec.where = Where::kSwapped;
    swapped_.push_back(victim);
  }
}

absl::Status Engine::preempt_self(SeqId seq) {
  absl::StatusOr<pagedkv::SequenceView> view = manager_->sequence(seq);
  if (!view.ok()) return view.status();
  return manager_->preempt(seq, mode_for(view->num_computed_tokens));
}

// --- scheduling ------------------------------------------------------------------------------

// One decode token for every running sequence, in one batched call that preempts while
// blocks are short (the manager offers only sequences without slots this step as victims);
// a sequence preempted by an earlier one of the batch fails there.
absl::Status Engine::schedule_running() {
  const std::vector<SeqId> batch = running_;
  const int32_t one_token[] = {1};
  absl::StatusOr<pagedkv::KvCacheManager::SlotBatch> slots =
      manager_->allocate_slots_batch(batch, one_token, /*num_lookahead=*/0, /*preempt=*/true);
  if (!slots.ok()) return slots.status();
  for (size_t i = 0; i < batch.size(); ++i) {
    const SeqId seq = batch[i];
    SequenceRecord& rec = records_.at(seq);
    if (const absl::Status& status = slots->statuses[i]; !status.ok()) {
      if (rec.where != Where::kRunning) continue;  // preempted by another of the batch
      if (!absl::IsResourceExhausted(status)) return status;
      // Nobody left to preempt: this sequence yields its own blocks.
      if (absl::Status yielded = preempt_self(seq); !yielded.ok()) return yielded;
      continue;
    }
    scheduled_.insert(seq);
    const auto pos = static_cast<int32_t>(rec.tokens.size()) - 1;
    decode_.seqs.push_back(seq);
    decode_.tokens.push_back(rec.tokens[pos]);
    decode_.positions.push_back(pos);
    decode_.slots.push_back(slots->slots[i]);  // one slot per sequence
    decode_.logit_rows.push_back(static_cast<int32_t>(decode_.logit_rows.size()));
  }
  return absl::OkStatus();
}

absl::Status Engine::schedule_swapped() {
  while (!swapped_.empty() && !preempted_this_step_) {
    const SeqId seq = swapped_.front();
    absl::StatusOr<pagedkv::SequenceView> view = manager_->sequence(seq);
    if (!view.ok()) return view.status();
    const auto needed = static_cast<int32_t>(view->host_blocks.size()) + 1;
    if (needed > manager_->device_pool().num_free_blocks()) break;
    absl::Status status = manager_->swap_in(seq);
    if (!status.ok()) return status;
    swapped_.pop_front();
    SequenceRecord& rec = records_.at(seq);
    rec.where = Where::kRunning;
    running_.push_back(seq);
    scheduled_.insert(seq);
    absl::StatusOr<std::span<const int64_t>> slots = manager_->allocate_slots(seq, 1);
    if (!slots.ok()) return slots.status();  // room was checked above
    const auto pos = static_cast<int32_t>(rec.tokens.size()) - 1;
    decode_.seqs.push_back(seq);
    decode_.tokens.push_back(rec.tokens[pos]);
    decode_.positions.push_back(pos);
    decode_.slots.push_back((*slots)[0]);
    decode_.logit_rows.push_back(static_cast<int32_t>(decode_.logit_rows.size()));
  }
  return absl::OkStatus();
}

absl::Status Engine::schedule_waiting() {
  int32_t prefill_tokens = 0;
  while (!waiting_.empty() && swapped_.empty() && !preempted_this_step_ &&
         static_cast<int32_t>(running_.size()) < options_.max_running) {
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
    const auto len = static_cast<int32_t>(rec.tokens.size());
    const int32_t num_new = len - *cached;
    absl::StatusOr<std::span<const int64_t>> slots =
        prefill_tokens > 0 && prefill_tokens + num_new > options_.max_prefill_tokens
            ? absl::ResourceExhaustedError("step's prefill token budget is spent")
            : manager_->allocate_slots(seq, num_new);
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
    running_.push_back(seq);
    scheduled_.insert(seq);
    // Host hits are marked by their promote and exchange ops (record_mechanisms).
    if (*cached > host_hits) rec.mechanisms.add(Mechanism::kPrefixHit);
    stats_.admit_query_tokens += len;
    stats_.admit_hit_tokens += *cached;
    stats_.admit_host_hit_tokens += host_hits;
    if (rec.num_generated() > 0) {  // preempted by recompute, now recomputed
      rec.mechanisms.add(Mechanism::kRecompute);
      stats_.recompute_tokens += num_new;
    }
    prefill_tokens += num_new;
    prefill_.seqs.push_back(seq);
    prefill_.slots.insert(prefill_.slots.end(), slots->begin(), slots->end());
    for (int32_t t = *cached; t < len; ++t) {
      prefill_.tokens.push_back(rec.tokens[t]);
      prefill_.positions.push_back(t);
    }
    prefill_.qo_indptr.push_back(static_cast<int32_t>(prefill_.tokens.size()));
    prefill_.logit_rows.push_back(static_cast<int32_t>(prefill_.tokens.size()) - 1);
    prefill_.max_query_len = std::max(prefill_.max_query_len, num_new);
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
  absl::flat_hash_map<pagedkv::BlockId, MechanismSet> filled;  // device block -> what filled it
  const auto host_hit = [&](Mechanism mechanism, pagedkv::BlockId host_block) {
    MechanismSet set = {mechanism};
    if (demoted_host_blocks_.contains(host_block)) set.add(Mechanism::kDemote);
    return set;
  };
  for (const pagedkv::BlockCopy& op : ops.swap_out) demoted_host_blocks_.erase(op.dst);
  for (const pagedkv::BlockCopy& op : ops.demote) demoted_host_blocks_.insert(op.dst);
  for (const pagedkv::BlockCopy& op : ops.exchange) {  // reads host dst, then demotes into it
    filled[op.src] |= host_hit(Mechanism::kExchange, op.dst);
    demoted_host_blocks_.insert(op.dst);
  }
  for (const pagedkv::BlockCopy& op : ops.copy_on_write) filled[op.dst].add(Mechanism::kCowCopy);
  for (const pagedkv::BlockCopy& op : ops.swap_in) filled[op.dst].add(Mechanism::kSwapIn);
  for (const pagedkv::BlockCopy& op : ops.promote) {
    filled[op.dst] |= host_hit(Mechanism::kPromote, op.src);
  }
  if (filled.empty()) return;
  for (const SeqId seq : running_) {
    absl::StatusOr<pagedkv::SequenceView> view = manager_->sequence(seq);
    if (!view.ok()) continue;
    MechanismSet& mechanisms = records_.at(seq).mechanisms;
    for (const pagedkv::BlockId block : view->block_table) {
      if (const auto it = filled.find(block); it != filled.end()) mechanisms |= it->second;
    }
  }
}

// Fault::kCorruptSwapIn: every block a swap-in copy filled gets one flipped bit, as from
// a faulty transfer path. One bit per block rather than per sequence: in fp8, one flipped
// element stays within the format's range and can move the logits less than the bound.
absl::Status Engine::corrupt_swap_ins(std::span<const pagedkv::BlockCopy> swap_ins) {
  for (const pagedkv::BlockCopy& op : swap_ins) {
    // A block with no element below 1 (fp8's scales make most stored values larger; a
    // last block may hold a single token) stays as it is.
    absl::Status status = store_->flip_exponent_bit(op.dst);
    if (!status.ok() && !absl::IsNotFound(status)) return status;
  }
  return absl::OkStatus();
}

absl::Status Engine::run_batch(Batch& batch, bool prefill) {
  if (batch.seqs.empty()) return absl::OkStatus();
  const int64_t start = now_ns();
  absl::Status status = manager_->build_block_tables(batch.seqs, &tables_);
  if (!status.ok()) return status;
  status = store_->set_batch(
      batch.slots, tables_,
      prefill ? std::span<const int32_t>(batch.qo_indptr) : std::span<const int32_t>(),
      batch.max_query_len);
  if (!status.ok()) return status;
  const int32_t num_q_heads = model_.config().num_q_heads;
  status = model_.forward(
      batch.tokens, batch.positions,
      [&](const AttentionIo& io) { return store_->attend(io, num_q_heads); }, batch.logit_rows,
      &logits_, &ws_);
  if (!status.ok()) return status;
  const double seconds = static_cast<double>(now_ns() - start) * 1e-9;
  if (prefill) {
    stats_.prefill_seconds += seconds;
    stats_.prefill_tokens += static_cast<int64_t>(batch.tokens.size());
  } else {
    stats_.decode_seconds += seconds;
    stats_.decode_tokens += static_cast<int64_t>(batch.tokens.size());
  }
  return commit(batch);
}

absl::Status Engine::commit(const Batch& batch) {
  const int32_t vocab = model_.config().vocab_size;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const SeqId seq = batch.seqs[i];
    const std::span<const float> logits(logits_.data() + i * vocab, vocab);
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
      if (!status.ok()) return status;
      SequenceRecord rec = parent;
      rec.seq = child;
      rec.sample = s;
      rec.sampling.sample = s;
      rec.pending_forks = 0;
      rec.mechanisms.add(Mechanism::kFork);  // and what reached the blocks it shares
      records_[child] = std::move(rec);
      running_.push_back(child);
      family.push_back(child);
      ++stats_.sequences;
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
      const TokenId appended[] = {token};
      absl::Status status = manager_->append_tokens(member, appended);
      if (!status.ok()) return status;
    }
  }
  return absl::OkStatus();
}

absl::Status Engine::finish(SequenceRecord& rec) {
  absl::Status status = manager_->free(rec.seq);
  if (!status.ok()) return status;
  rec.in_manager = false;
  rec.where = Where::kDone;
  std::erase(running_, rec.seq);
  if (options_.on_finish) options_.on_finish(rec);
  std::vector<float>().swap(rec.logits);
  return absl::OkStatus();
}

// Token slots holding real tokens versus slots of used blocks, shared blocks counted once.
void Engine::record_utilization() {
  const pagedkv::KvCacheManager::Stats s = manager_->stats();
  stats_.peak_used_blocks = std::max(stats_.peak_used_blocks, s.used_blocks);
  stats_.peak_running = std::max(stats_.peak_running, static_cast<int32_t>(running_.size()));
  absl::flat_hash_map<pagedkv::BlockId, int32_t> filled;
  const int32_t bs = options_.block_size;
  for (const SeqId seq : running_) {
    absl::StatusOr<pagedkv::SequenceView> view = manager_->sequence(seq);
    if (!view.ok()) continue;
    for (size_t i = 0; i < view->block_table.size(); ++i) {
      const int32_t n = std::clamp(view->num_computed_tokens - static_cast<int32_t>(i) * bs, 0, bs);
      int32_t& f = filled[view->block_table[i]];
      f = std::max(f, n);
    }
  }
  int64_t real = 0;
  for (const auto& [block, n] : filled) real += n;
  stats_.real_slot_steps += static_cast<double>(real);
  stats_.used_slot_steps += static_cast<double>(s.used_blocks) * bs;
}

absl::Status Engine::step() {
  preempted_this_step_ = false;
  scheduled_.clear();
  prefill_.clear();
  decode_.clear();
  absl::Status status = schedule_running();
  if (status.ok()) status = schedule_swapped();
  if (status.ok()) status = schedule_waiting();
  if (!status.ok()) return status;
  record_utilization();
  if (prefill_.seqs.empty() && decode_.seqs.empty()) {
    return absl::InternalError(
        absl::StrCat("step ", stats_.steps, ": nothing could be scheduled (", waiting_.size(),
                     " waiting, ", swapped_.size(), " swapped, ", manager_->stats().free_blocks,
                     " free blocks): the KV budget is too small for the longest sequence"));
  }
  status = execute_kv_ops();
  // Batches run in allocation order: an admission may have matched a block that a decode
  // step of this same step filled, so those K/V must be written first.
  if (status.ok()) status = run_batch(decode_, /*prefill=*/false);
  if (status.ok()) status = run_batch(prefill_, /*prefill=*/true);
  ++stats_.steps;
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

absl::Status Engine::run(const std::vector<Request>& requests) {
  const int64_t start = now_ns();
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
  stats_.requests = static_cast<int64_t>(requests.size());
  stats_.sequences = static_cast<int64_t>(requests.size());
  while (!running_.empty() || !waiting_.empty() || !swapped_.empty()) {
    absl::Status status = step();
    if (!status.ok()) {
      print_progress(true);
      return status;
    }
    print_progress(false);
    if (options_.on_step) options_.on_step(manager_->stats());
  }
  print_progress(true);
  // Drain: ops recorded by the last frees.
  absl::Status status = execute_kv_ops();
  if (!status.ok()) return status;
  stats_.wall_seconds = static_cast<double>(now_ns() - start) * 1e-9;
  stats_.manager = manager_->stats();
  if (options_.on_step) options_.on_step(stats_.manager);
  absl::flat_hash_map<int64_t, bool> complete;
  for (const auto& [seq, rec] : records_) {
    auto [it, inserted] = complete.try_emplace(rec.request, true);
    it->second = it->second && rec.where == Where::kDone;
    for (size_t i = 0; i < kMechanisms.size(); ++i) {
      stats_.mechanism_sequences[i] += rec.mechanisms.contains(kMechanisms[i]) ? 1 : 0;
    }
  }
  for (const auto& [request, ok] : complete) stats_.requests_completed += ok ? 1 : 0;
  return manager_->check_invariants();
}

}  // namespace decode_loop
