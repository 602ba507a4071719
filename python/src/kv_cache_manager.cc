// KvCacheManager: the per-sequence calls with the C++ names, the batched step calls for
// Python schedulers, block tables as NumPy views, and preemption hooks, victim policies,
// event sinks and clocks written in Python.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "bindings.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/kv_handoff.h"
#include "pagedkv/prefix_hit.h"

namespace pagedkv::python {
namespace {

using namespace nb::literals;

// --- callbacks --------------------------------------------------------------------------

// The choice a victim policy returned: None (give up), a Preemption, or an int victim id
// (preempted in `default_mode`; a NumPy integer counts). Anything else, a bool included,
// raises TypeError, and so does an int outside SeqId's range (int64).
std::optional<Preemption> victim_of(nb::handle result, PreemptionMode default_mode) {
  constexpr const char* kExpected = "expected a Preemption, an int sequence id or None";
  if (result.is_none()) return std::nullopt;
  Preemption preemption;
  if (nb::try_cast(result, preemption)) return preemption;
  static_assert(std::is_same_v<SeqId, int64_t>);
  const SeqId victim = int64_from_callback(result, "victim policy", "sequence id", kExpected);
  return Preemption{victim, default_mode};
}

// What the manager calls back: the Python preemption hooks, victim policy, event sink and
// clock.
class ManagerCallbacks : public PreemptionHooks {
 public:
  ManagerCallbacks(nb::object event_sink, nb::object hooks, nb::object policy, nb::object clock,
                   PreemptionMode default_mode)
      : sink_(event_sink.is_none()
                  ? nullptr
                  : std::make_unique<PythonEventSink>(std::move(event_sink), &errors_)),
        clock_(std::move(clock), &errors_),
        hooks_(std::move(hooks)),
        policy_(std::move(policy)),
        default_mode_(default_mode) {}

  KvEventSink* sink() { return sink_.get(); }
  PythonClock& clock() { return clock_; }
  bool has_policy() const { return !policy_.is_none(); }
  CallbackErrors& errors() { return errors_; }

  void on_preempt(SeqId victim, PreemptionMode mode) override {
    if (hooks_.is_none()) return;
    errors_.guard([&] { hooks_.attr("on_preempt")(victim, mode); });
  }

  // Optional in the Python hooks object: older hooks only have on_preempt().
  void on_claim_released(SeqId seq) override {
    if (hooks_.is_none() || !nb::hasattr(hooks_, "on_claim_released")) return;
    errors_.guard([&] { hooks_.attr("on_claim_released")(seq); });
  }

  // The VictimPolicy: policy(running: list[SequenceInfo], requester) returns a Preemption,
  // a victim id (preempted in the manager's preemption_mode) or None to give up. A policy
  // that raises gives up; the exception is re-raised when the manager call returns.
  std::optional<Preemption> choose_victim(std::span<const SequenceInfo> running, SeqId requester) {
    std::optional<Preemption> choice;
    if (policy_.is_none()) return choice;  // cleared by the garbage collector
    errors_.guard([&] {
      nb::list candidates;
      for (const SequenceInfo& info : running) candidates.append(nb::cast(info));
      choice = victim_of(policy_(candidates, requester), default_mode_);
    });
    return choice;
  }

  // Garbage-collector support of the owning Python object: hooks, policies, sinks and
  // clocks often refer back to the manager.
  int traverse(visitproc visit, void* arg) const {
    if (sink_ != nullptr && sink_->traverse(visit, arg) != 0) return -1;
    if (clock_.traverse(visit, arg) != 0) return -1;
    Py_VISIT(hooks_.ptr());
    Py_VISIT(policy_.ptr());
    return 0;
  }
  void clear() {
    if (sink_ != nullptr) sink_->clear();
    clock_.clear();
    hooks_ = nb::none();
    policy_ = nb::none();
  }

 private:
  CallbackErrors errors_;
  std::unique_ptr<PythonEventSink> sink_;
  PythonClock clock_;
  nb::object hooks_;
  nb::object policy_;
  PreemptionMode default_mode_;
};

// --- block tables -----------------------------------------------------------------------

// pagedkv.BlockTables: a batch's padded and CSR tables. Its arrays are NumPy views of the
// buffers (no copy), and each view keeps the buffers it shows alive: a rebuild into the same
// object reuses the buffers only when no view of them is left, so a view never changes or
// dangles; it shows the batch it was taken from.
struct PyBlockTables {
  std::shared_ptr<BlockTables> tables = std::make_shared<BlockTables>();

  // The buffers to build the next batch into.
  BlockTables* prepare_rebuild() {
    if (tables.use_count() > 1) tables = std::make_shared<BlockTables>();
    return tables.get();
  }

  nb::ndarray<nb::numpy, int32_t> view(std::vector<int32_t>& buffer,
                                       std::initializer_list<size_t> shape) const {
    auto* keep = new std::shared_ptr<BlockTables>(tables);
    nb::capsule owner(
        keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<BlockTables>*>(p); });
    return nb::ndarray<nb::numpy, int32_t>(buffer.data(), shape, owner);
  }
};

void bind_block_tables(nb::module_& m) {
  nb::class_<PyBlockTables>(
      m, "BlockTables",
      "Block tables of a batch (KvCacheManager.build_block_tables), padded and CSR.\n"
      "The arrays are NumPy views (no copy). A view stays valid and unchanged for as long\n"
      "as it is referenced: rebuilding into this object reuses its buffers only when no\n"
      "view of them is left, so hold views for one step only to keep rebuilds allocation-free.")
      .def(nb::init<>())
      .def_prop_ro("num_seqs", [](const PyBlockTables& t) { return t.tables->num_seqs; })
      .def_prop_ro("max_blocks", [](const PyBlockTables& t) { return t.tables->max_blocks; })
      .def_prop_ro("block_size", [](const PyBlockTables& t) { return t.tables->block_size; })
      .def_prop_ro(
          "block_table",
          [](PyBlockTables& t) {
            BlockTables& b = *t.tables;
            return t.view(b.block_table,
                          {static_cast<size_t>(b.num_seqs), static_cast<size_t>(b.max_blocks)});
          },
          nb::rv_policy::automatic,
          "[num_seqs, max_blocks] int32, padded with 0 beyond each sequence's blocks")
      .def_prop_ro(
          "context_lens",
          [](PyBlockTables& t) {
            return t.view(t.tables->context_lens, {static_cast<size_t>(t.tables->num_seqs)});
          },
          nb::rv_policy::automatic, "[num_seqs] int32: computed tokens of each sequence")
      .def_prop_ro(
          "indptr",
          [](PyBlockTables& t) { return t.view(t.tables->indptr, {t.tables->indptr.size()}); },
          nb::rv_policy::automatic, "CSR [num_seqs + 1] int32")
      .def_prop_ro(
          "indices",
          [](PyBlockTables& t) { return t.view(t.tables->indices, {t.tables->indices.size()}); },
          nb::rv_policy::automatic,
          "CSR [indptr[-1]] int32: the blocks of sequence i are indices[indptr[i]:indptr[i+1]]")
      .def_prop_ro(
          "last_page_len",
          [](PyBlockTables& t) {
            return t.view(t.tables->last_page_len, {t.tables->last_page_len.size()});
          },
          nb::rv_policy::automatic,
          "CSR [num_seqs] int32: valid tokens in each last block (0: empty sequence)");
}

// --- the manager ------------------------------------------------------------------------

// A sequence as sequence() returns it: copies of its token ids and tables, since the
// manager's own spans move on the next mutating call.
struct PySequenceView {
  SeqId id;
  SequenceState state;
  int32_t priority;
  int64_t arrival;
  int32_t num_computed_tokens;
  NumpyArray<TokenId> tokens;
  NumpyArray<BlockId> block_table;
  NumpyArray<BlockId> host_blocks;
  int32_t first_held_block;
  int32_t group;
};

// Per-sequence results of a batched call.
struct BatchStatus {
  NumpyArray<int32_t> status;  // [num_seqs] StatusCode values
  nb::dict errors;             // seq id -> the exception the per-sequence call would raise
};
struct SlotBatch : BatchStatus {
  NumpyArray<int64_t> slots;  // slot mapping, all sequences' new tokens concatenated
  nb::list group_slots;       // per layer group, laid out as slots (group 0's is slots)
};

class PyKvCacheManager {
 public:
  PyKvCacheManager(KvCacheManager::Options options, nb::object event_sink, nb::object hooks,
                   nb::object policy, nb::object clock)
      : callbacks_(std::make_unique<ManagerCallbacks>(std::move(event_sink), std::move(hooks),
                                                      std::move(policy), std::move(clock),
                                                      options.preemption_mode)),
        manager_(value_or_raise(KvCacheManager::create(with_callbacks(std::move(options))))) {}

  const KvCacheManager& get() const { return manager_; }
  ManagerCallbacks& callbacks() { return *callbacks_; }

  // Runs a mutating call (not from one of its own callbacks), then re-raises what a Python callback
  // raised meanwhile.
  template <typename Fn>
  auto mutate(Fn&& fn) {
    ReentryGuard guard(busy_, "KvCacheManager");
    if constexpr (std::is_void_v<decltype(fn(manager_))>) {
      fn(manager_);
      callbacks_->errors().raise_pending();
    } else {
      auto result = fn(manager_);
      callbacks_->errors().raise_pending();
      return result;
    }
  }

  SlotBatch allocate_slots_batch(const IntValues<SeqId>& seqs,
                                 const IntValues<int32_t, true>& num_new_tokens,
                                 int32_t num_lookahead, bool preempt,
                                 std::optional<Array1D<int64_t>> out);
  BatchStatus append_tokens_batch(const IntValues<SeqId>& seqs, const IntValues<TokenId>& tokens,
                                  std::optional<IntValues<int32_t>> indptr);

 private:
  KvCacheManager::Options with_callbacks(KvCacheManager::Options options) {
    ManagerCallbacks* callbacks = callbacks_.get();
    options.event_sink = callbacks->sink();
    options.preemption_hooks = callbacks;
    options.clock = callbacks->clock().function();
    if (callbacks->has_policy()) {
      options.victim_policy = [callbacks](std::span<const SequenceInfo> running, SeqId requester) {
        return callbacks->choose_victim(running, requester);
      };
    }
    return options;
  }

  std::unique_ptr<ManagerCallbacks> callbacks_;
  KvCacheManager manager_;
  bool busy_ = false;  // a mutating call is in progress
};

// Per-sequence results as Python sees them: a StatusCode per sequence and, for each failed
// one, the exception its per-sequence call would raise.
BatchStatus batch_status(std::span<const SeqId> seqs, std::span<const absl::Status> statuses) {
  BatchStatus result{new_numpy_array<int32_t>(seqs.size()), nb::dict()};
  for (size_t i = 0; i < seqs.size(); ++i) {
    result.status.data[i] = static_cast<int32_t>(statuses[i].code());
    if (!statuses[i].ok()) result.errors[nb::int_(seqs[i])] = exception_for(statuses[i]);
  }
  return result;
}

NumpyArray<int64_t> slots_array(absl::StatusOr<std::span<const int64_t>> slots) {
  return to_numpy(value_or_raise(std::move(slots)));
}

SlotBatch PyKvCacheManager::allocate_slots_batch(const IntValues<SeqId>& seqs,
                                                 const IntValues<int32_t, true>& num_new_tokens,
                                                 int32_t num_lookahead, bool preempt,
                                                 std::optional<Array1D<int64_t>> out) {
  const std::span<const SeqId> ids = seqs.checked("allocate_slots_batch", "seqs");
  const std::span<const int32_t> counts =
      num_new_tokens.checked("allocate_slots_batch", "num_new_tokens");
  // Python gives "one count for all" as an int: a one-entry sequence is one count per
  // sequence, and the C++ call would take it for all.
  if (!num_new_tokens.scalar && counts.size() == 1 && ids.size() != 1) {
    raise_status(absl::InvalidArgumentError(
        absl::StrCat("allocate_slots_batch: 1 num_new_tokens for ", ids.size(),
                     " sequences; give one per sequence or one int for all")));
  }
  // out is checked before the call, so that a call refused for it changes nothing.
  if (out.has_value() && (counts.size() == 1 || counts.size() == ids.size())) {
    int64_t needed = 0;
    for (size_t i = 0; i < ids.size(); ++i) needed += std::max(num_new_tokens.at(i), 0);
    if (static_cast<int64_t>(out->shape(0)) < needed) {
      raise_status(absl::InvalidArgumentError(absl::StrCat(
          "allocate_slots_batch: out holds ", out->shape(0), " slots, the batch needs ", needed)));
    }
  }
  const KvCacheManager::SlotBatch result = value_or_raise(mutate([&](KvCacheManager& m) {
    return m.allocate_slots_batch(ids, counts, num_lookahead, preempt);
  }));
  SlotBatch batch{batch_status(ids, result.statuses), {}, nb::list()};
  if (out.has_value()) {
    std::copy(result.slots.begin(), result.slots.end(), out->data());
    batch.slots = {nb::cast(*out), out->data(), out->shape(0)};
  } else {
    batch.slots = to_numpy(result.slots);
  }
  const KvCacheManager& m = get();
  batch.group_slots.append(batch.slots.array);
  for (int32_t g = 1; g < m.num_groups(); ++g) {
    batch.group_slots.append(slots_array(m.batch_slot_mapping(g)).array);
  }
  return batch;
}

BatchStatus PyKvCacheManager::append_tokens_batch(const IntValues<SeqId>& seqs,
                                                  const IntValues<TokenId>& tokens,
                                                  std::optional<IntValues<int32_t>> indptr) {
  const std::span<const SeqId> ids = seqs.checked("append_tokens_batch", "seqs");
  const std::span<const TokenId> token_ids = tokens.checked("append_tokens_batch", "tokens");
  const std::span<const int32_t> offsets = indptr.has_value()
                                               ? indptr->checked("append_tokens_batch", "indptr")
                                               : std::span<const int32_t>();
  // The C++ call reads an empty indptr as none (one token each); a given one is refused.
  if (indptr.has_value() && indptr->size() == 0) {
    raise_status(absl::InvalidArgumentError(
        absl::StrCat("append_tokens_batch: 0 indptr entries for ", ids.size(), " sequences")));
  }
  const std::span<const absl::Status> statuses = value_or_raise(
      mutate([&](KvCacheManager& m) { return m.append_tokens_batch(ids, token_ids, offsets); }));
  return batch_status(ids, statuses);
}

// --- binding ----------------------------------------------------------------------------

void bind_value_types(nb::class_<PyKvCacheManager>& cls, nb::module_& m) {
  nb::class_<SequenceInfo>(m, "SequenceInfo", "What a victim policy sees of each candidate.")
      .def_ro("id", &SequenceInfo::id)
      .def_ro("priority", &SequenceInfo::priority, "larger runs first; lowest preempted first")
      .def_ro("arrival", &SequenceInfo::arrival, "order of add_sequence()/fork() calls")
      .def_ro("num_blocks", &SequenceInfo::num_blocks, "device blocks held")
      .def_ro("num_tokens", &SequenceInfo::num_tokens)
      .def_ro("num_computed_tokens", &SequenceInfo::num_computed_tokens)
      .def("__repr__", [](const SequenceInfo& s) {
        return absl::StrCat("SequenceInfo(id=", s.id, ", priority=", s.priority,
                            ", arrival=", s.arrival, ", num_blocks=", s.num_blocks,
                            ", num_tokens=", s.num_tokens, ")");
      });
  nb::class_<Preemption>(m, "Preemption", "A victim policy's choice.")
      .def(
          "__init__",
          [](Preemption* self, SeqId victim, PreemptionMode mode) {
            new (self) Preemption{victim, mode};
          },
          "victim"_a, "mode"_a = PreemptionMode::kRecompute)
      .def_rw("victim", &Preemption::victim)
      .def_rw("mode", &Preemption::mode);
  nb::class_<PySequenceView>(m, "SequenceView",
                             "One sequence, as sequence() returns it (copies of its arrays).")
      .def_ro("id", &PySequenceView::id)
      .def_ro("state", &PySequenceView::state)
      .def_ro("priority", &PySequenceView::priority)
      .def_ro("arrival", &PySequenceView::arrival)
      .def_ro("num_computed_tokens", &PySequenceView::num_computed_tokens)
      .def_ro("tokens", &PySequenceView::tokens, "int32 prompt and generated tokens")
      .def_ro("block_table", &PySequenceView::block_table, "int32 device blocks (running)")
      .def_ro("host_blocks", &PySequenceView::host_blocks,
              "int32 host blocks (swapped): entries first_held_block.. of the table")
      .def_ro("first_held_block", &PySequenceView::first_held_block,
              "a windowed group's first held entry: the entries before it are released "
              "(NO_BLOCK, -1, in block_table), no future token attends to them; 0 for a full "
              "group")
      .def_ro("group", &PySequenceView::group, "the layer group of these tables");
  nb::class_<PrefixHit::Group>(m, "PrefixHitGroup", "One layer group's part of a PrefixHit.")
      .def_ro("blocks", &PrefixHit::Group::blocks,
              "the device block a claim would share at each entry of the full-block hit "
              "(NO_BLOCK where it promotes a host-tier hit, or before a window); a state "
              "group: the checkpoint it restores")
      .def_ro("num_free_hits", &PrefixHit::Group::num_free_hits,
              "blocks the claim takes out of the free queue as they are (ref count 0 -> 1)")
      .def_ro("num_new_blocks", &PrefixHit::Group::num_new_blocks,
              "free blocks the claim allocates (promotions, a partial block's copy, a state "
              "slot)")
      .def_prop_ro("blocks_taken", &PrefixHit::Group::blocks_taken,
                   "num_free_hits + num_new_blocks: free blocks the group has fewer after the "
                   "claim")
      .def("__repr__", [](const PrefixHit::Group& g) {
        return absl::StrCat("PrefixHitGroup(blocks=", g.blocks.size(),
                            ", num_free_hits=", g.num_free_hits,
                            ", num_new_blocks=", g.num_new_blocks, ")");
      });
  nb::class_<PrefixHit>(m, "PrefixHit", "What peek_prefix() reports: a hit not claimed.")
      .def_ro("num_tokens", &PrefixHit::num_tokens, "tokens match_prefix() would claim now")
      .def_ro("num_partial_tokens", &PrefixHit::num_partial_tokens,
              "of those, reused from part of a cached block (partial-block reuse)")
      .def_ro("groups", &PrefixHit::groups, "one PrefixHitGroup per layer group")
      .def("__repr__", [](const PrefixHit& h) {
        return absl::StrCat("PrefixHit(num_tokens=", h.num_tokens,
                            ", num_partial_tokens=", h.num_partial_tokens,
                            ", groups=", h.groups.size(), ")");
      });
  nb::class_<BatchStatus>(m, "BatchStatus", "Per-sequence results of a batched call.")
      .def_ro("status", &BatchStatus::status,
              "int32 [num_seqs]: StatusCode of each sequence's call (0: OK)")
      .def_ro("errors", &BatchStatus::errors,
              "seq id -> the exception the per-sequence call would have raised")
      .def_prop_ro(
          "ok", [](const BatchStatus& b) { return b.errors.size() == 0; },
          "True when every sequence's call succeeded");
  nb::class_<SlotBatch, BatchStatus>(m, "SlotBatch", "Result of allocate_slots_batch().")
      .def_ro("slots", &SlotBatch::slots,
              "int64 slot mapping of all new tokens, sequence after sequence; -1 for the "
              "tokens of a sequence whose call failed (write_kv skips them)")
      .def_ro("group_slots", &SlotBatch::group_slots,
              "list of int64 arrays, one per layer group, laid out as slots: each group's K/V "
              "goes into its own pool (group_slots[0] is slots)");

  using Stats = KvCacheManager::Stats;
  nb::class_<Stats> stats(cls, "Stats", "Counters; see KvCacheManager::Stats.");
  bind_counters(stats, "KvCacheManager.Stats", counter("num_blocks", &Stats::num_blocks),
                counter("used_blocks", &Stats::used_blocks),
                counter("free_blocks", &Stats::free_blocks),
                counter("cached_free_blocks", &Stats::cached_free_blocks),
                counter("num_host_blocks", &Stats::num_host_blocks),
                counter("used_host_blocks", &Stats::used_host_blocks),
                counter("prefix_query_tokens", &Stats::prefix_query_tokens),
                counter("prefix_hit_tokens", &Stats::prefix_hit_tokens),
                counter("partial_hit_tokens", &Stats::partial_hit_tokens,
                        "of prefix_hit_tokens, reused from part of a cached block"),
                counter("evictions", &Stats::evictions), counter("cow_copies", &Stats::cow_copies),
                counter("preemptions_recompute", &Stats::preemptions_recompute),
                counter("preemptions_swap", &Stats::preemptions_swap),
                counter("blocks_swapped_out", &Stats::blocks_swapped_out),
                counter("blocks_swapped_in", &Stats::blocks_swapped_in),
                counter("claims_released", &Stats::claims_released,
                        "claimed prefixes given back (release_claim, or to make room)"),
                counter("cached_host_blocks", &Stats::cached_host_blocks,
                        "host blocks holding a cached block's K/V (the host tier)"),
                counter("host_hit_tokens", &Stats::host_hit_tokens,
                        "of prefix_hit_tokens, found in the host tier"),
                counter("blocks_demoted", &Stats::blocks_demoted),
                counter("blocks_promoted", &Stats::blocks_promoted),
                counter("host_evictions", &Stats::host_evictions,
                        "host-tier blocks dropped to reuse their host block"),
                counter("blocks_not_admitted", &Stats::blocks_not_admitted,
                        "evicted blocks HostAdmission.REUSED dropped (no evidence of reuse)"),
                counter("ghost_hits", &Stats::ghost_hits,
                        "blocks computed while their hash was a ghost (HostAdmission.REUSED)"),
                counter("recent_ghost_hits", &Stats::recent_ghost_hits,
                        "EvictionPolicy.ADAPTIVE: blocks cached while their hash was a ghost "
                        "of a block evicted once-used"),
                counter("frequent_ghost_hits", &Stats::frequent_ghost_hits,
                        "EvictionPolicy.ADAPTIVE: ... of a block evicted after reuse"),
                counter("draft_tokens", &Stats::draft_tokens,
                        "draft tokens given slots (allocate_draft_slots)"),
                counter("accepted_draft_tokens", &Stats::accepted_draft_tokens,
                        "of those judged by accept_draft, the accepted ones"),
                counter("exported_sequences", &Stats::exported_sequences),
                counter("pinned_blocks", &Stats::pinned_blocks,
                        "blocks of every group still pinned by exports"),
                counter("imported_tokens", &Stats::imported_tokens,
                        "imported tokens complete_import counted as computed"),
                counter("discarded_import_tokens", &Stats::discarded_import_tokens,
                        "imported tokens complete_import released (recomputed)"));

  using GroupStats = KvCacheManager::GroupStats;
  nb::class_<GroupStats> group_stats(
      cls, "GroupStats", "One layer group's pools and cache traffic (group_stats(group)).");
  bind_counters(group_stats, "KvCacheManager.GroupStats",
                counter("num_blocks", &GroupStats::num_blocks),
                counter("used_blocks", &GroupStats::used_blocks),
                counter("free_blocks", &GroupStats::free_blocks),
                counter("cached_free_blocks", &GroupStats::cached_free_blocks),
                counter("num_host_blocks", &GroupStats::num_host_blocks),
                counter("used_host_blocks", &GroupStats::used_host_blocks),
                counter("cached_host_blocks", &GroupStats::cached_host_blocks),
                counter("evictions", &GroupStats::evictions),
                counter("host_evictions", &GroupStats::host_evictions),
                counter("hit_blocks", &GroupStats::hit_blocks,
                        "blocks prefix hits claimed from the group's cache"),
                counter("released_blocks", &GroupStats::released_blocks,
                        "windowed: blocks released behind the window"),
                counter("blocks_demoted", &GroupStats::blocks_demoted),
                counter("blocks_promoted", &GroupStats::blocks_promoted),
                counter("blocks_not_admitted", &GroupStats::blocks_not_admitted),
                counter("ghost_hits", &GroupStats::ghost_hits),
                counter("checkpoints_saved", &GroupStats::checkpoints_saved),
                counter("checkpoints_restored", &GroupStats::checkpoints_restored));

  using Options = KvCacheManager::Options;
  nb::class_<Options>(cls, "Options", "The options the manager was created with.")
      .def_ro("block_size", &Options::block_size)
      .def_ro("enable_host_cache", &Options::enable_host_cache)
      .def_ro("host_admission", &Options::host_admission)
      .def_ro("eviction_policy", &Options::eviction_policy)
      .def_ro("max_model_len", &Options::max_model_len)
      .def_ro("watermark_blocks", &Options::watermark_blocks)
      .def_ro("enable_prefix_caching", &Options::enable_prefix_caching)
      .def_ro("enable_partial_block_reuse", &Options::enable_partial_block_reuse)
      .def_ro("window_eviction_classes", &Options::window_eviction_classes)
      .def_ro("shared_block_pool", &Options::shared_block_pool)
      .def_ro("preemption_mode", &Options::preemption_mode)
      .def_ro("layer_groups", &Options::layer_groups, "the layer groups and their pools");
}

void bind_sequence_calls(nb::class_<PyKvCacheManager>& cls) {
  using M = PyKvCacheManager;
  cls.def(
         "add_sequence",
         [](M& self, SeqId seq, IntValues<TokenId> prompt, int32_t priority,
            IntValues<uint64_t> extra_keys, std::vector<RetentionRange> retention) {
           const std::span<const TokenId> tokens = prompt.checked("add_sequence", "prompt");
           const std::span<const uint64_t> keys = extra_keys.checked("add_sequence", "extra_keys");
           raise_if_error(self.mutate([&](KvCacheManager& m) {
             return m.add_sequence(seq, tokens,
                                   {.priority = priority,
                                    .extra_keys = std::vector<uint64_t>(keys.begin(), keys.end()),
                                    .retention = std::move(retention)});
           }));
         },
         "seq"_a, "prompt"_a, nb::kw_only(), "priority"_a = 0,
         "extra_keys"_a = std::vector<uint64_t>{}, "retention"_a = std::vector<RetentionRange>{},
         "Registers a waiting sequence holding prompt (>= 1 token). extra_keys (cache salt,\n"
         "adapter id) are hashed into every block. retention: RetentionRanges for its blocks\n"
         "once freed (a later range overrides an earlier one where they overlap). Raises\n"
         "AlreadyExists, ValueError (also for a range with begin < 0, end < begin, a priority\n"
         "outside [MIN_RETENTION_PRIORITY, MAX_RETENTION_PRIORITY] or a negative duration).")
      .def(
          "append_tokens",
          [](M& self, SeqId seq, IntValues<TokenId> tokens) {
            const std::span<const TokenId> token_ids = tokens.checked("append_tokens", "tokens");
            raise_if_error(
                self.mutate([&](KvCacheManager& m) { return m.append_tokens(seq, token_ids); }));
          },
          "seq"_a, "tokens"_a,
          "Appends generated tokens (before allocate_slots() reserves their KV). Raises "
          "KeyError, ValueError beyond max_model_len.")
      .def(
          "match_prefix",
          [](M& self, SeqId seq) {
            return value_or_raise(
                self.mutate([&](KvCacheManager& m) { return m.match_prefix(seq); }));
          },
          "seq"_a,
          "Claims the longest verified cached prefix of a waiting sequence (full blocks, at\n"
          "most len - 1 tokens); returns its length in tokens. With the host tier the prefix\n"
          "continues into host hits, each promoted into a new device block (StepOps.promote).")
      .def(
          "peek_prefix",
          [](M& self, SeqId seq) {
            return value_or_raise(
                self.mutate([&](KvCacheManager& m) { return m.peek_prefix(seq); }));
          },
          "seq"_a,
          "The hit match_prefix() would claim now, without claiming it: a PrefixHit (its\n"
          "tokens; per group the blocks it would hold and the free blocks it would take).\n"
          "Takes no reference, leaves the eviction order and the counters as they are.\n"
          "Raises KeyError, FailedPrecondition unless the sequence waits without blocks.")
      .def(
          "allocate_slots",
          [](M& self, SeqId seq, int32_t num_new_tokens, int32_t num_lookahead) {
            return slots_array(self.mutate([&](KvCacheManager& m) {
              return m.allocate_slots(seq, num_new_tokens, num_lookahead);
            }));
          },
          "seq"_a, "num_new_tokens"_a, "num_lookahead"_a = 0,
          "Reserves slots for the next num_new_tokens tokens and returns their slot mapping "
          "(a new int64 array). Raises ResourceExhausted (nothing changed), "
          "FailedPrecondition, KeyError, ValueError.")
      .def(
          "allocate_slots_or_preempt",
          [](M& self, SeqId seq, int32_t num_new_tokens, int32_t num_lookahead) {
            return slots_array(self.mutate([&](KvCacheManager& m) {
              return m.allocate_slots_or_preempt(seq, num_new_tokens, num_lookahead);
            }));
          },
          "seq"_a, "num_new_tokens"_a, "num_lookahead"_a = 0,
          "allocate_slots(), preempting victims of the victim policy while blocks are short.")
      .def(
          "preempt",
          [](M& self, SeqId seq, PreemptionMode mode) {
            raise_if_error(self.mutate([&](KvCacheManager& m) { return m.preempt(seq, mode); }));
          },
          "seq"_a, "mode"_a, "Preempts a running sequence (calls the preemption hooks).")
      .def(
          "swap_in",
          [](M& self, SeqId seq) {
            raise_if_error(self.mutate([&](KvCacheManager& m) { return m.swap_in(seq); }));
          },
          "seq"_a, "Moves a swapped sequence back to device blocks (swap-in copies).")
      .def(
          "fork",
          [](M& self, SeqId parent, SeqId child) {
            raise_if_error(self.mutate([&](KvCacheManager& m) { return m.fork(parent, child); }));
          },
          "parent"_a, "child"_a,
          "Creates child sharing parent's computed blocks; copy-on-write on the next append.")
      .def(
          "free",
          [](M& self, SeqId seq) {
            raise_if_error(self.mutate([&](KvCacheManager& m) { return m.free(seq); }));
          },
          "seq"_a, "Releases a sequence in any state; its hashed blocks stay cached.")
      .def(
          "release_claim",
          [](M& self, SeqId seq) {
            raise_if_error(self.mutate([&](KvCacheManager& m) { return m.release_claim(seq); }));
          },
          "seq"_a,
          "Gives back the cached prefix a waiting sequence claimed with match_prefix(); its "
          "computed count returns to 0 (call match_prefix() again before admitting it). "
          "Raises FailedPrecondition unless the sequence is waiting.")
      .def(
          "take_step_ops",
          [](M& self) { return self.mutate([](KvCacheManager& m) { return m.take_step_ops(); }); },
          "Ends the step: every copy recorded since the last call, as a StepOps. Take it every\n"
          "step and run its lists in order (KvStorage.run_step_ops) before the step's K/V\n"
          "writes; sequences scheduled before it count as computed from then on.")
      .def(
          "reset_prefix_cache",
          [](M& self) { self.mutate([](KvCacheManager& m) { m.reset_prefix_cache(); }); },
          "Empties the prefix index: nothing computed before is shared after.");
}

// Speculative decoding and hand-offs between engines (pagedkv/kv_handoff.h).
void bind_draft_and_handoff_calls(nb::class_<PyKvCacheManager>& cls, nb::module_& m) {
  using M = PyKvCacheManager;
  nb::class_<KvHandoffGroup>(m, "KvHandoffGroup",
                             "One layer group's entries of a hand-off: entry first_entry + i of "
                             "the sequence's table is blocks[i].")
      .def_ro("first_entry", &KvHandoffGroup::first_entry)
      .def_ro("blocks", &KvHandoffGroup::blocks);
  nb::class_<KvExport>(m, "KvExport", "What export_sequence() pinned for the transfer.")
      .def_ro("seq", &KvExport::seq)
      .def_ro("tokens", &KvExport::tokens, "the tokens whose K/V the blocks hold")
      .def_ro("block_hashes", &KvExport::block_hashes, "chained hashes of the full blocks")
      .def_ro("groups", &KvExport::groups, "per layer group, the entries it held");
  nb::class_<KvImport>(m, "KvImport", "The entries import_slots() asks a transfer to fill.")
      .def_ro("num_local_tokens", &KvImport::num_local_tokens,
              "tokens the local prefix cache held (not transferred)")
      .def_ro("num_tokens", &KvImport::num_tokens)
      .def_ro("groups", &KvImport::groups, "per layer group, the entries to fill");
  cls.def(
         "allocate_draft_slots",
         [](M& self, SeqId seq, int32_t num_new_tokens, IntValues<TokenId> draft) {
           const std::span<const TokenId> tokens = draft.checked("allocate_draft_slots", "draft");
           return slots_array(self.mutate([&](KvCacheManager& m) {
             return m.allocate_draft_slots(seq, num_new_tokens, tokens);
           }));
         },
         "seq"_a, "num_new_tokens"_a, "draft"_a,
         "Speculative decoding: slots for the sequence's next num_new_tokens tokens and the\n"
         "draft tokens after them (an int64 array of both). The drafts count as computed for\n"
         "the step but are never cached before accept_draft() keeps them. Raises\n"
         "ResourceExhausted (nothing changed), FailedPrecondition, KeyError, ValueError.")
      .def(
          "accept_draft",
          [](M& self, SeqId seq, int32_t num_accepted) {
            raise_if_error(
                self.mutate([&](KvCacheManager& m) { return m.accept_draft(seq, num_accepted); }));
          },
          "seq"_a, "num_accepted"_a,
          "After the step that wrote the drafts: keeps the first num_accepted, rolls the rest\n"
          "back (their blocks released, never cached).")
      .def(
          "export_sequence",
          [](M& self, SeqId seq) {
            return value_or_raise(
                self.mutate([&](KvCacheManager& m) { return m.export_sequence(seq); }));
          },
          "seq"_a,
          "The sender of a hand-off: ends a running sequence whose step ended, keeping its\n"
          "blocks pinned until release_export(seq); returns a KvExport.")
      .def(
          "release_export",
          [](M& self, SeqId seq) {
            raise_if_error(self.mutate([&](KvCacheManager& m) { return m.release_export(seq); }));
          },
          "seq"_a, "Unpins an export's blocks once the transfer is over.")
      .def(
          "import_slots",
          [](M& self, SeqId seq, int32_t num_tokens) {
            return value_or_raise(
                self.mutate([&](KvCacheManager& m) { return m.import_slots(seq, num_tokens); }));
          },
          "seq"_a, "num_tokens"_a,
          "The receiver: admits a waiting sequence (after match_prefix) with its first\n"
          "num_tokens tokens filled by a transfer into the returned KvImport's blocks,\n"
          "pending until complete_import(). Start the transfer after take_step_ops().")
      .def(
          "complete_import",
          [](M& self, SeqId seq, IntValues<int32_t> verified_blocks) {
            const std::span<const int32_t> verified =
                verified_blocks.checked("complete_import", "verified_blocks");
            return value_or_raise(
                self.mutate([&](KvCacheManager& m) { return m.complete_import(seq, verified); }));
          },
          "seq"_a, "verified_blocks"_a,
          "Ends an import: verified_blocks[g] leading entries of group g arrived intact.\n"
          "Returns the tokens that count as computed; the rest is recomputed.");
}

void bind_batch_calls(nb::class_<PyKvCacheManager>& cls) {
  using M = PyKvCacheManager;
  cls.def("allocate_slots_batch", &M::allocate_slots_batch, "seqs"_a, "num_new_tokens"_a,
          "num_lookahead"_a = 0, nb::kw_only(), "preempt"_a = false,
          "out"_a.noconvert() = nb::none(),
          "allocate_slots() (or allocate_slots_or_preempt() with preempt=True) for every\n"
          "sequence of seqs, in order, in one call. num_new_tokens: one count per sequence, or\n"
          "one int for all (1 for a decode step). Returns a SlotBatch: the slot mappings\n"
          "concatenated (into out when given), a StatusCode per sequence and the exceptions of\n"
          "the failed ones. A sequence preempted by an earlier entry of the batch fails with\n"
          "FAILED_PRECONDITION instead of being re-admitted.")
      .def("append_tokens_batch", &M::append_tokens_batch, "seqs"_a, "tokens"_a,
           "indptr"_a = nb::none(),
           "append_tokens() for every sequence: one token each, or tokens[indptr[i]:indptr[i+1]]\n"
           "for sequence i. Returns a BatchStatus.")
      .def(
          "build_block_tables",
          [](M& self, IntValues<SeqId> seqs, PyBlockTables* out, int32_t group) {
            nb::object result = out != nullptr ? nb::find(out) : nb::cast(PyBlockTables{});
            PyBlockTables* tables = nb::cast<PyBlockTables*>(result);
            raise_if_error(self.get().build_block_tables(seqs.checked("build_block_tables", "seqs"),
                                                         tables->prepare_rebuild(), group));
            return nb::typed<nb::object, PyBlockTables>(result);
          },
          "seqs"_a, "out"_a.none() = nb::none(), nb::kw_only(), "group"_a = 0,
          "Block tables (padded and CSR) of running sequences in layer group `group`, context\n"
          "length = computed tokens; a windowed group's released entries hold PADDING_BLOCK\n"
          "(0: the kernels start reading at the window, so they never read them). With out,\n"
          "reuses its buffers when none of its views is alive.")
      .def(
          "write_state_slots",
          [](const M& self, IntValues<SeqId> seqs, int32_t group) {
            const std::span<const SeqId> ids = seqs.checked("write_state_slots", "seqs");
            std::vector<int32_t> slots(ids.size());
            raise_if_error(self.get().write_state_slots(ids, group, slots));
            return slots;
          },
          "seqs"_a, "group"_a,
          "The state slot of each running sequence in state group `group` (a list of int): where\n"
          "a state-space kernel reads and updates its state.")
      .def(
          "write_block_tables",
          [](const M& self, IntValues<SeqId> seqs,
             nb::ndarray<int32_t, nb::ndim<2>, nb::device::cpu, nb::c_contig> block_table,
             Array1D<int32_t> context_lens, int32_t group) {
            raise_if_error(
                self.get().write_block_tables(seqs.checked("write_block_tables", "seqs"),
                                              static_cast<int32_t>(block_table.shape(1)),
                                              {block_table.data(), block_table.size()},
                                              {context_lens.data(), context_lens.shape(0)}, group));
          },
          "seqs"_a, "block_table"_a.noconvert(), "context_lens"_a.noconvert(), nb::kw_only(),
          "group"_a = 0,
          "Writes the padded table of layer group `group` into caller arrays: block_table\n"
          "int32 [>= len(seqs), max_blocks] (C-contiguous), context_lens int32 [>= len(seqs)].")
      .def(
          "write_csr_block_tables",
          [](const M& self, IntValues<SeqId> seqs, Array1D<int32_t> indptr,
             Array1D<int32_t> indices, Array1D<int32_t> last_page_len, int32_t group) {
            raise_if_error(self.get().write_csr_block_tables(
                seqs.checked("write_csr_block_tables", "seqs"), {indptr.data(), indptr.shape(0)},
                {indices.data(), indices.shape(0)}, {last_page_len.data(), last_page_len.shape(0)},
                group));
          },
          "seqs"_a, "indptr"_a.noconvert(), "indices"_a.noconvert(), "last_page_len"_a.noconvert(),
          nb::kw_only(), "group"_a = 0,
          "Writes the CSR tables of layer group `group` into caller arrays (int32).")
      .def(
          "slot_mapping",
          [](const M& self, int32_t group) { return slots_array(self.get().slot_mapping(group)); },
          "group"_a,
          "The slots of layer group `group` from the last allocate_slots() (or\n"
          "allocate_slots_or_preempt()) call that succeeded, a new int64 array: each group's\n"
          "K/V goes into its own pool; group 0's is what the call returned.")
      .def(
          "batch_slot_mapping",
          [](const M& self, int32_t group) {
            return slots_array(self.get().batch_slot_mapping(group));
          },
          "group"_a,
          "The slots of layer group `group` from the last allocate_slots_batch() call, laid\n"
          "out as its SlotBatch.slots (a new int64 array; SlotBatch.group_slots has them all).");
}

void bind_lookups(nb::class_<PyKvCacheManager>& cls) {
  using M = PyKvCacheManager;
  cls.def(
         "contains", [](const M& self, SeqId seq) { return self.get().contains(seq); }, "seq"_a)
      .def("__contains__", [](const M& self, SeqId seq) { return self.get().contains(seq); })
      .def(
          "sequence",
          [](const M& self, SeqId seq, int32_t group) {
            const SequenceView v = value_or_raise(self.get().sequence(seq, group));
            auto copy = [](std::span<const int32_t> s) { return to_numpy(s); };
            return PySequenceView{v.id,
                                  v.state,
                                  v.priority,
                                  v.arrival,
                                  v.num_computed_tokens,
                                  copy(v.tokens),
                                  copy(v.block_table),
                                  copy(v.host_blocks),
                                  v.first_held_block,
                                  group};
          },
          "seq"_a, "group"_a = 0,
          "A snapshot of one sequence and its tables in layer group `group`. Raises KeyError,\n"
          "ValueError for a group out of range.")
      .def("num_sequences", [](const M& self) { return self.get().num_sequences(); })
      .def("__len__", [](const M& self) { return self.get().num_sequences(); })
      .def(
          "running_sequences", [](const M& self) { return self.get().running_sequences(); },
          "Running sequences, in arrival order.")
      .def(
          "stats", [](const M& self) { return self.get().stats(); },
          "Counters; pool figures are layer group 0's (group_stats() has every group's).")
      .def(
          "num_groups", [](const M& self) { return self.get().num_groups(); },
          "Layer groups: 1 for a manager created without layer_groups.")
      .def(
          "layer_group",
          [](const M& self, int32_t group) {
            return value_or_raise(self.get().layer_group(group));
          },
          "group"_a, "Layer group `group` (a LayerGroup) with its pools' sizes.")
      .def(
          "group_stats",
          [](const M& self, int32_t group) {
            return value_or_raise(self.get().group_stats(group));
          },
          "group"_a,
          "One layer group's pools and cache traffic: blocks, evictions, blocks claimed by\n"
          "prefix hits, blocks released behind a window, demotions and promotions.")
      .def_prop_ro("options", [](const M& self) { return self.get().options(); })
      .def(
          "check_invariants", [](const M& self) { raise_if_error(self.get().check_invariants()); },
          "Raises InternalError naming the first broken invariant.");
}

int manager_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  return nb::inst_ptr<PyKvCacheManager>(self)->callbacks().traverse(visit, arg);
}

int manager_clear(PyObject* self) {
  if (nb::inst_ready(self)) nb::inst_ptr<PyKvCacheManager>(self)->callbacks().clear();
  return 0;
}

PyType_Slot manager_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(manager_traverse)},
                               {Py_tp_clear, reinterpret_cast<void*>(manager_clear)},
                               {0, nullptr}};

}  // namespace

void bind_kv_cache_manager(nb::module_& m) {
  bind_block_tables(m);
  nb::class_<PyKvCacheManager> cls(
      m, "KvCacheManager", nb::type_slots(manager_slots),
      "The per-sequence view of the KV cache a serving engine's scheduler drives (see\n"
      "kv_cache_manager.h and docs/python.md). One thread owns it. Errors raise: KeyError\n"
      "(unknown sequence), ValueError, AlreadyExists, ResourceExhausted, FailedPrecondition.");
  bind_value_types(cls, m);
  cls.def(
      "__init__",
      [](PyKvCacheManager* self, std::vector<LayerGroup> layer_groups, int32_t block_size,
         bool enable_host_cache, int32_t max_model_len, int32_t watermark_blocks,
         bool enable_prefix_caching, PreemptionMode preemption_mode, nb::object event_sink,
         nb::object preemption_hooks, nb::object victim_policy, nb::object clock,
         bool enable_partial_block_reuse, int32_t state_checkpoint_interval_blocks,
         HostAdmission host_admission, EvictionPolicy eviction_policy, bool shared_block_pool,
         bool window_eviction_classes) {
        KvCacheManager::Options options;
        options.block_size = block_size;
        options.enable_host_cache = enable_host_cache;
        options.max_model_len = max_model_len;
        options.watermark_blocks = watermark_blocks;
        options.enable_prefix_caching = enable_prefix_caching;
        options.preemption_mode = preemption_mode;
        options.layer_groups = std::move(layer_groups);
        options.enable_partial_block_reuse = enable_partial_block_reuse;
        options.state_checkpoint_interval_blocks = state_checkpoint_interval_blocks;
        options.host_admission = host_admission;
        options.eviction_policy = eviction_policy;
        options.shared_block_pool = shared_block_pool;
        options.window_eviction_classes = window_eviction_classes;
        new (self)
            PyKvCacheManager(std::move(options), std::move(event_sink), std::move(preemption_hooks),
                             std::move(victim_policy), std::move(clock));
      },
      nb::kw_only(), "layer_groups"_a, "block_size"_a = 16, "enable_host_cache"_a = false,
      "max_model_len"_a = 1 << 20, "watermark_blocks"_a = 0, "enable_prefix_caching"_a = true,
      "preemption_mode"_a = PreemptionMode::kRecompute, "event_sink"_a = nb::none(),
      "preemption_hooks"_a = nb::none(), "victim_policy"_a = nb::none(), "clock"_a = nb::none(),
      "enable_partial_block_reuse"_a = false, "state_checkpoint_interval_blocks"_a = 0,
      "host_admission"_a = HostAdmission::kAll, "eviction_policy"_a = EvictionPolicy::kLru,
      "shared_block_pool"_a = false, "window_eviction_classes"_a = true,
      "layer_groups: the LayerGroups (full, sliding window, chunked local, state), each with\n"
      "device and host pools of its own sizes: full_attention(num_blocks, num_host_blocks)\n"
      "for a model of full-attention layers, KvCachePlan.layer_groups or\n"
      "KvCacheConfig.split_budget().groups for the others. A windowed or state group with\n"
      "prefix caching needs a full group beside it. A STATE group's pool holds state slots\n"
      "and checkpoints\n"
      "(docs/allocator.md, \"State groups\"); the first group must be an attention group.\n"
      "state_checkpoint_interval_blocks: state groups also save a checkpoint every this many\n"
      "blocks (0: only at prompt ends and branch points).\n"
      "enable_partial_block_reuse: match_prefix() also reuses the first tokens of a cached\n"
      "block that continues the prompt past its full-block hit (a copy-on-write copy).\n"
      "enable_host_cache: the host tier of the prefix cache: an evicted cached device block is\n"
      "demoted to a host block (StepOps.demote), and match_prefix() continues into host hits\n"
      "(StepOps.promote). Needs enable_prefix_caching and host blocks in every group\n"
      "(LayerGroup.num_host_blocks, shared by swapped sequences and the tier: swap first, the\n"
      "tier caches in the rest).\n"
      "host_admission: HostAdmission.ALL demotes every evicted cached block; REUSED only those\n"
      "hit, or computed again while their hash was a ghost (docs/results.md).\n"
      "eviction_policy: EvictionPolicy.LRU or ADAPTIVE, the order the full groups' device\n"
      "pools evict cached free blocks in within a retention priority (docs/results.md).\n"
      "shared_block_pool: one device pool for all (attention) groups, of equal num_blocks:\n"
      "one id space and LRU order, the fit of a step summed over groups (vLLM's hybrid\n"
      "layout; docs/allocator.md, \"One pool for all groups\").\n"
      "window_eviction_classes: False evicts released windowed blocks in plain LRU order.\n"
      "event_sink: a KvEventBuffer or any object with on_event(event).\n"
      "preemption_hooks: any object with on_preempt(victim, mode), and optionally\n"
      "on_claim_released(seq) (allocate_slots_or_preempt gave a waiting sequence's claim back).\n"
      "victim_policy: callable(running: list[SequenceInfo], requester) -> Preemption | int |\n"
      "None (None gives up).\n"
      "clock: callable() -> int milliseconds for retention durations (None: a steady clock).\n"
      "Exceptions these raise are re-raised when the manager call that triggered them\n"
      "returns (its effects stay). Raises ValueError for invalid options.");
  bind_sequence_calls(cls);
  bind_batch_calls(cls);
  bind_draft_and_handoff_calls(cls, m);
  bind_lookups(cls);
}

}  // namespace pagedkv::python
