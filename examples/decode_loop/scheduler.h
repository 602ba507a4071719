// File: examples/decode_loop/scheduler.h
//
// The engine of the example: a scheduler that drives pagedkv::KvCacheManager, a KV store
// that holds the bytes, and the model. One call to step() is one engine iteration:
//
//   schedule   1. running sequences: reserve one slot each (allocate_slots_or_preempt), or
//                 a prefilling one its next prompt chunk (--prefill-chunk); when the pool
//                 is short, the victim policy preempts a sequence that is not yet scheduled
//                 this step (recompute or swap), or the requester itself
//              2. swapped sequences: swap_in() when nothing was preempted this step
//              3. waiting sequences (new, or preempted by recompute): add_sequence,
//                 match_prefix (device hits, then host-tier hits it promotes),
//                 allocate_slots for the uncached part (its first chunk when chunked)
//   move KV    take_step_ops(), executed by the KV store before any write, in StepOps'
//              order: swap_out, demote and exchange, copy-on-write copies, swap_in and
//              promote; each op marks its mechanism on the sequences whose blocks it fills
//              (mechanism.h)
//   compute    prefill batch: write_kv + paged_extend_attention per layer
//              decode batch:  write_kv + paged_decode_attention per layer, batched tables
//              (each layer in its layer group's pools, with that group's slots and tables:
//              slot_mapping(group), build_block_tables(..., group); cache_plan.h)
//              state layers:  the scan in each sequence's state slot
//              (write_state_slots(..., group)), running the step's state saves on the way
//   commit     pick tokens (greedy or keyed sampling), fork samples after a prompt's
//              prefill (copy-on-write on their first append), append_tokens, free when done
//
// Disaggregated (disaggregation.h): a prefill engine (EngineOptions::hand_off) exports each
// sequence once it sampled its first token (take_handoffs()); a decode engine admits it
// with the K/V another engine computed (begin_import(), then end_import() once the
// transfer ended) and decodes it from there.
#ifndef PAGEDKV_EXAMPLES_DECODE_LOOP_SCHEDULER_H_
#define PAGEDKV_EXAMPLES_DECODE_LOOP_SCHEDULER_H_

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache_plan.h"
#include "kv_format.h"
#include "kv_store.h"
#include "mechanism.h"
#include "model.h"
#include "pagedkv/block_table.h"
#include "pagedkv/device.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/kv_handoff.h"
#include "pagedkv/remote_kv_store.h"
#include "pagedkv/remote_tier.h"
#include "sampling.h"
#include "workload.h"

namespace decode_loop {

using pagedkv::SeqId;

enum class PreemptionPolicy {
  kRecompute,  // always recompute
  kSwap,       // swap when the host pool has room, else recompute
  kMixed,      // alternate swap and recompute, so one run exercises both
};

// Deliberate bugs for testing the verifier: each corrupts the KV that some sequences
// read, and --verify must report it.
enum class Fault {
  kNone,
  kSkipCopies,     // copy-on-write copies are not run
  kSkipSwapIn,     // swap-in copies are not run
  kCorruptSwapIn,  // one bit flips in every block a swap-in copy fills
  kSkipPromote,    // host-tier promotion copies (promote and exchange) are not run
  kSkipRestore,    // copies restoring a state checkpoint into a sequence's slot are not run
  // A payload byte of every block fetched from the remote tier is flipped (main.cc wraps
  // the store): the checksums must make them misses, so verification still passes.
  kCorruptRemote,
  // --speculative: every draft is kept, those the target model rejected too, with their K/V.
  kKeepRejected,
};

// The mechanisms whose K/V `fault` breaks: a run with the fault must verify a sequence
// that went through each of them (that one exercised).
MechanismSet faulted_mechanisms(Fault fault);

struct SequenceRecord;

// Up to the given number of draft tokens after a sequence's (--speculative).
using Drafter = std::function<std::vector<TokenId>(const SequenceRecord&, int32_t)>;

struct EngineOptions {
  pagedkv::Device device = pagedkv::Device::kCpu;
  KvFormat kv_format;  // cache dtype and fp8 scales
  // The layer groups, their block size and their pools (device blocks from --kv-budget-mb;
  // host blocks, shared by swapping and the host tier, from --swap-space-mb and
  // --host-cache-mb): the manager and the store both take them from here (kv_plan()).
  CachePlan cache;
  // The prefix cache's host tier (KvCacheManager::Options::enable_host_cache).
  bool enable_host_cache = false;
  pagedkv::HostAdmission host_admission = pagedkv::HostAdmission::kAll;
  pagedkv::EvictionPolicy eviction_policy = pagedkv::EvictionPolicy::kLru;
  int32_t watermark_blocks = 1;  // of group 0; the manager scales it to the others
  PreemptionPolicy preemption = PreemptionPolicy::kMixed;
  int32_t max_running = 256;          // sequences decoding at once
  int32_t max_prefill_tokens = 2048;  // new prompt tokens per step
  // Prompt tokens a sequence computes per step (0: its whole prompt in one step). A
  // windowed layer group holds a prefill's blocks until the next step releases those
  // behind the window, so chunks keep its pool to window + chunk tokens per sequence. One
  // sequence at a time prefills in chunks (vLLM's max_num_partial_prefills default): a
  // waiting one is admitted only when no other is partway through its prompt.
  int32_t prefill_chunk = 0;
  // Speculative decoding (draft.h): a greedy sequence that decodes proposes up to this many
  // draft tokens; one step verifies them (KvCacheManager::allocate_draft_slots(), then
  // accept_draft() keeps the accepted ones). 0: off.
  int32_t speculative = 0;
  // Proposes up to the given number of drafts after a sequence's tokens; empty: prompt
  // lookup (propose_draft()).
  Drafter drafter;
  uint64_t seed = 1;
  bool progress = false;  // status line on stderr
  Fault fault = Fault::kNone;
  // Keep, for each running sequence, the logits each of its tokens was sampled from
  // (SequenceRecord::logits), for verification. Off: no copy, no memory.
  bool record_logits = false;
  // Called once per finished sequence, before its record's logits are released: a
  // verifier moves out the logits of the sequences it keeps.
  std::function<void(SequenceRecord&)> on_finish;
  pagedkv::KvEventSink* event_sink = nullptr;  // the manager's KV events; optional, not owned
  // The prefix cache's remote tier (pagedkv::RemoteTier) over this store, when set (not
  // owned); `remote` holds its policies (the engine fills in the namespace, from
  // remote_model_id and the cache's shape, the payload size and the event sink). Needs a
  // model with one full-attention layer group.
  pagedkv::RemoteKvStore* remote_store = nullptr;
  std::string remote_model_id;
  pagedkv::RemoteTierOptions remote;
  // Called with the manager's stats after every step (e.g. to export metrics); optional.
  std::function<void(const pagedkv::KvCacheManager::Stats&)> on_step = nullptr;
  // The prefill engine of a disaggregated pair: a sequence that sampled its first token
  // and has more to generate is exported (KvCacheManager::export_sequence()) at the end of
  // the step instead of decoding, and waits in take_handoffs().
  bool hand_off = false;
};

// One sequence: a request's sample.
struct SequenceRecord {
  // kHandedOff: exported to another engine (EngineOptions::hand_off); kImporting: admitted
  // with K/V that a transfer is filling (Engine::begin_import()).
  enum class Where { kWaiting, kRunning, kSwapped, kDone, kHandedOff, kImporting };
  SeqId seq = 0;
  int64_t request = 0;
  int32_t sample = 0;
  std::vector<TokenId> tokens;  // prompt, then generated tokens
  int32_t prompt_len = 0;
  int32_t max_new_tokens = 0;
  int32_t pending_forks = 0;  // samples to fork from this one after its prompt's prefill
  SamplingParams sampling;
  Where where = Where::kWaiting;
  bool in_manager = false;
  // Its tokens (prompt, and after a recompute preemption the generated ones) are
  // computed: it decodes one token a step. False while its prefill runs in chunks.
  bool decoding = false;
  MechanismSet mechanisms;  // what reached its K/V besides its own writes (mechanism.h)
  // [num_generated, vocab_size]: the logits token i was sampled from (record_logits only).
  std::vector<float> logits;

  int32_t num_generated() const { return static_cast<int32_t>(tokens.size()) - prompt_len; }
};

struct RunStats {
  int64_t steps = 0;
  int64_t requests = 0;
  int64_t requests_completed = 0;
  int64_t sequences = 0;
  int64_t prompt_tokens = 0;     // of the workload (per request)
  int64_t prefill_tokens = 0;    // computed by prefill, including recomputation
  int64_t recompute_tokens = 0;  // of those, tokens recomputed after preemption
  int64_t generated_tokens = 0;  // committed tokens, all samples
  int64_t decode_tokens = 0;     // tokens processed by decode steps
  int64_t decode_steps = 0;      // steps that ran a decode batch
  // decode_tokens / decode_steps: the sequences a step decodes on average, the
  // concurrency the budget sustains (peaks include sequences preempted soon after).
  double mean_decode_batch() const {
    return decode_steps > 0 ? static_cast<double>(decode_tokens) / decode_steps : 0.0;
  }
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;
  double wall_seconds = 0.0;
  double max_step_seconds = 0.0;      // the longest step
  double max_remote_seconds = 0.0;    // the most a step spent in the remote tier's calls
  int64_t admit_query_tokens = 0;     // tokens looked up at successful admissions
  int64_t admit_hit_tokens = 0;       // of those, found in the prefix cache
  int64_t admit_host_hit_tokens = 0;  // of those, found in the host tier (promoted)
  int64_t admit_remote_tokens = 0;    // loaded from the remote tier (not counted as hits)
  int32_t peak_running = 0;
  // Peak running sequences whose prompt is computed by the end of the step (not partway
  // through a chunked prefill): the batch the budget sustains.
  int32_t peak_decoding = 0;
  int32_t peak_used_blocks = 0;            // group 0's
  std::vector<int32_t> peak_group_blocks;  // per layer group
  int64_t peak_used_bytes = 0;             // device blocks in use x page bytes, all groups
  double real_slot_steps = 0.0;            // sum over steps of token slots holding real tokens
  double used_slot_steps = 0.0;            // sum over steps of slots of used blocks
  int64_t swap_out_blocks_executed = 0;
  int64_t swap_in_blocks_executed = 0;
  int64_t cow_copies_executed = 0;
  int64_t demote_blocks_executed = 0;
  int64_t promote_blocks_executed = 0;
  int64_t exchange_blocks_executed = 0;  // a promotion and a demotion in one copy
  // --speculative: drafts verified, of those accepted, and the sequence-steps that verified
  // drafts with the tokens they committed (accepted drafts and the target's own token).
  int64_t draft_tokens = 0;
  int64_t accepted_draft_tokens = 0;
  int64_t speculative_steps = 0;
  int64_t speculative_tokens = 0;
  // The sum over finished sequences of XXH3-64 of (request, sample, generated tokens):
  // equal for runs that generate the same tokens, whatever their schedules.
  uint64_t output_digest = 0;
  // Per mechanism, in kMechanisms order: sequences whose K/V went through it.
  std::array<int64_t, kMechanisms.size()> mechanism_sequences{};
  pagedkv::KvCacheManager::Stats manager;                           // at the end
  std::vector<pagedkv::KvCacheManager::GroupStats> manager_groups;  // at the end, per group

  MechanismSet exercised() const;  // the mechanisms some sequence went through
};

// A sequence a prefill engine handed off: its record (the prompt and the first token, with
// that token's logits when recorded) and the K/V its export pins.
struct Handoff {
  SequenceRecord record;
  pagedkv::KvExport kv;
};

class Engine : private pagedkv::PreemptionHooks {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> create(const Model& model,
                                                        const EngineOptions& options);
  ~Engine() override;

  // Queues every request, then steps until all are done: submit(), step() while busy(),
  // finish_run().
  absl::Status run(const std::vector<Request>& requests);

  // Queues the requests. InvalidArgument for a request of samples outside [1, 64].
  absl::Status submit(const std::vector<Request>& requests);
  // Queues a sequence as a new request would be (its tokens all computed here).
  void resubmit(SequenceRecord rec);
  // One engine iteration (see the top of this file).
  absl::Status step();
  // Whether a sequence is waiting, running or swapped.
  bool busy() const { return !running_.empty() || !waiting_.empty() || !swapped_.empty(); }
  // Runs the last frees' ops, fills in the end-of-run stats and checks the manager's
  // invariants.
  absl::Status finish_run();

  // EngineOptions::hand_off: the sequences exported since the last call; each export stays
  // pinned until release_export().
  std::vector<Handoff> take_handoffs() { return std::exchange(handoffs_, {}); }
  absl::Status release_export(SeqId seq) { return manager_->release_export(seq); }
  // The records of the sequences not yet handed off or done, taken out of this engine (a
  // prefill engine that goes away hands them to another), reset to their prompts.
  std::vector<SequenceRecord> take_unfinished();

  // The decode side of a hand-off: admits `handoff`'s sequence past this engine's own
  // prefix hit with the rest of its first handoff.kv.tokens.size() tokens to be filled
  // by a transfer, and runs the step's ops (so that no copy touches those blocks later).
  // Returns the entries to fill (none, and no groups, when this engine's cache holds the
  // whole prompt: the sequence then waits as a new one would), or nullopt when it cannot
  // be admitted now: no room in the pools, max_running reached, or sequences preempted
  // here wait first (nothing changes; try again after a step).
  absl::StatusOr<std::optional<pagedkv::KvImport>> begin_import(const Handoff& handoff);
  // Ends `seq`'s import once its transfer ended and the verified blocks' bytes are in the
  // store: the longest prefix the verified leading entries of each group serve counts as
  // computed (KvCacheManager::complete_import()), the sequence computes the rest. Returns
  // that prefix's tokens.
  absl::StatusOr<int32_t> end_import(SeqId seq, std::span<const int32_t> verified_blocks);

  KvStore& store() { return *store_; }

  const RunStats& stats() const { return stats_; }
  const absl::flat_hash_map<SeqId, SequenceRecord>& sequences() const { return records_; }
  const EngineOptions& options() const { return options_; }
  const pagedkv::KvCacheManager& manager() const { return *manager_; }
  const pagedkv::RemoteTier* remote() const { return remote_.get(); }

 private:
  Engine(const Model& model, const EngineOptions& options);

  // One new-token batch of a forward pass.
  struct Batch {
    std::vector<SeqId> seqs;
    std::vector<TokenId> tokens;
    std::vector<int32_t> positions;
    std::vector<std::vector<int64_t>> slots;  // per layer group, a slot per token
    std::vector<int32_t> qo_indptr;           // prefill: [seqs + 1]
    std::vector<int32_t> logit_rows;
    // Per sequence: its row of the logits, or -1 for a prefill chunk that does not end
    // the sequence's tokens (nothing to sample yet); a verify batch's sequences have a row
    // for every token, from that one.
    std::vector<int32_t> logit_index;
    int32_t max_query_len = 0;
    void clear(int32_t num_groups);
  };

  absl::Status run_step();  // step() without the progress line and on_step
  absl::Status schedule_running();
  absl::Status schedule_swapped();
  absl::Status schedule_waiting();
  // Starts remote lookups for the first waiting sequences; whether the first may be
  // admitted (its lookup done, or the wait policy lets it go).
  absl::Status look_up_waiting();
  bool head_ready() const;
  // Whether imports or exports hold blocks until their transfers end.
  bool waits_for_transfers() const;
  absl::Status execute_kv_ops();
  absl::Status create_remote_tier();
  void record_mechanisms(const pagedkv::StepOps& ops);
  absl::Status corrupt_swap_ins(std::span<const pagedkv::BlockCopy> swap_ins);
  // The tokens `rec` computes in its next step, from its `computed` ones: one to decode,
  // or its prompt's next chunk.
  int32_t next_tokens(const SequenceRecord& rec, int32_t computed) const;
  // Appends `seq`'s `n` new tokens from position `first`, with the slots of every group
  // from the last allocate_slots() call, or from the last allocate_slots_batch() call at
  // `batch_offset`; the last token gets a logit row if it is the sequence's last.
  void add_rows(Batch& batch, SeqId seq, int32_t first, int32_t n,
                std::optional<size_t> batch_offset = std::nullopt);
  // --speculative: `seq`'s drafts, if it may speculate and prompt lookup proposes any, with
  // slots from allocate_draft_slots() into verify_ (a logit row per token). False when it
  // decodes as usual instead (no draft, or no room for one).
  absl::StatusOr<bool> schedule_draft(SeqId seq);
  // The target model's verdict on each sequence's drafts: the accepted ones and the
  // target's own next token are committed, the rest rolled back (accept_draft()).
  absl::Status commit_verified(const Batch& batch);
  absl::Status finish(SequenceRecord& rec);
  // EngineOptions::hand_off: exports the sequences this step's commits picked (to_export_).
  absl::Status export_sampled();
  // `verify`: a verify_ batch, committed by commit_verified().
  absl::Status run_batch(Batch& batch, bool prefill, bool verify = false);
  // The state slots and this step's saves of `batch`'s sequences, for the store's scan.
  absl::Status set_state_batch(const Batch& batch);
  // Fault::kSkipRestore: drops the copy_state ops that restore a checkpoint (those whose
  // source no running sequence holds; a fork's source is its parent's slot).
  void skip_restores(pagedkv::StepOps& ops);
  bool is_state_group(int32_t group) const;
  bool has_state_groups() const;
  absl::Status commit(const Batch& batch);
  absl::Status preempt_self(SeqId seq);
  void record_utilization();
  void print_progress(bool final);

  // Victim policy and hooks.
  std::optional<pagedkv::Preemption> choose_victim(std::span<const pagedkv::SequenceInfo> running,
                                                   SeqId requester);
  pagedkv::PreemptionMode mode_for(SeqId victim);
  void on_preempt(SeqId victim, pagedkv::PreemptionMode mode) override;

  static SeqId seq_id(int64_t request, int32_t sample) { return request * 64 + sample; }
  // A block of one group's pool: ids of different groups name different blocks.
  static int64_t block_key(int32_t group, pagedkv::BlockId block) {
    return (int64_t{group} << 32) | static_cast<uint32_t>(block);
  }
  int32_t num_groups() const { return options_.cache.num_groups(); }

  const Model& model_;
  EngineOptions options_;
  std::unique_ptr<pagedkv::RemoteTier> remote_;  // before the manager, which sends it events
  std::unique_ptr<pagedkv::KvCacheManager> manager_;
  std::unique_ptr<KvStore> store_;
  absl::flat_hash_map<SeqId, SequenceRecord> records_;
  std::deque<SeqId> waiting_;
  std::deque<SeqId> swapped_;
  std::vector<SeqId> running_;  // in admission order
  // Host blocks whose K/V a demotion wrote (Mechanism::kDemote when one is promoted), as
  // block_key(group, block).
  absl::flat_hash_set<int64_t> demoted_host_blocks_;
  absl::flat_hash_set<SeqId> scheduled_;
  bool preempted_this_step_ = false;
  int32_t partial_prefills_ = 0;  // sequences this step leaves partway through their prompt
  int64_t preemption_count_ = 0;
  int64_t remote_ns_ = 0;         // this step's time in the remote tier's calls
  std::vector<SeqId> to_export_;  // hand_off: sampled their first token this step
  std::vector<Handoff> handoffs_;
  int32_t imports_pending_ = 0;  // begun, not ended
  int64_t start_ns_ = 0;         // of create()
  Batch prefill_;
  Batch decode_;
  Batch verify_;  // --speculative: sequences whose drafts this step verifies
  std::vector<pagedkv::BlockTables> tables_;  // per layer group
  std::vector<float> logits_;
  std::vector<pagedkv::StateSave> step_saves_;  // this step's, until its batches ran
  int64_t saves_run_ = 0;                       // of step_saves_, handed to a batch
  Workspace ws_;
  RunStats stats_;
  int64_t last_progress_ns_ = 0;
};

}  // namespace decode_loop

#endif  // PAGEDKV_EXAMPLES_DECODE_LOOP_SCHEDULER_H_
