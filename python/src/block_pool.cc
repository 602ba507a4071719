// BlockPool: the thin binding of the ref-counted pool, for engines that manage their own
// sequences. Most engines use KvCacheManager.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "bindings.h"
#include "pagedkv/block_pool.h"

namespace pagedkv::python {
namespace {

using namespace nb::literals;

// A BlockPool with the Python objects its options point to.
class PyBlockPool {
 public:
  PyBlockPool(int32_t num_blocks, int32_t block_size, bool enable_caching, nb::object event_sink,
              Medium medium, nb::object clock, EvictionPolicy eviction_policy)
      : errors_(std::make_unique<CallbackErrors>()),
        sink_(event_sink.is_none()
                  ? nullptr
                  : std::make_unique<PythonEventSink>(std::move(event_sink), errors_.get())),
        clock_(std::make_unique<PythonClock>(std::move(clock), errors_.get())),
        pool_(value_or_raise(BlockPool::create({.num_blocks = num_blocks,
                                                .block_size = block_size,
                                                .enable_caching = enable_caching,
                                                .event_sink = sink_.get(),
                                                .medium = medium,
                                                .clock = clock_->function(),
                                                .eviction_policy = eviction_policy}))) {}

  const BlockPool& pool() const { return pool_; }
  PythonEventSink* sink() { return sink_.get(); }
  PythonClock& clock() { return *clock_; }

  // Runs a mutating call (not from one of its own callbacks), then re-raises what the event sink
  // raised meanwhile.
  template <typename Fn>
  auto mutate(Fn&& fn) {
    ReentryGuard guard(busy_, "BlockPool");
    if constexpr (std::is_void_v<decltype(fn(pool_))>) {
      fn(pool_);
      errors_->raise_pending();
    } else {
      auto result = fn(pool_);
      errors_->raise_pending();
      return result;
    }
  }

 private:
  std::unique_ptr<CallbackErrors> errors_;
  std::unique_ptr<PythonEventSink> sink_;
  std::unique_ptr<PythonClock> clock_;
  BlockPool pool_;
  bool busy_ = false;  // a mutating call is in progress
};

void bind_stats(nb::class_<PyBlockPool>& cls) {
  using Stats = BlockPool::Stats;
  nb::class_<Stats> stats(cls, "Stats");
  bind_counters(stats, "BlockPool.Stats", counter("num_blocks", &Stats::num_blocks),
                counter("used_blocks", &Stats::used_blocks, "ref count > 0"),
                counter("free_blocks", &Stats::free_blocks, "ref count 0 (clean + cached)"),
                counter("cached_free_blocks", &Stats::cached_free_blocks, "ref count 0 and hashed"),
                counter("cached_blocks", &Stats::cached_blocks, "hashed blocks, in use or free"),
                counter("evictions", &Stats::evictions),
                counter("recent_ghost_hits", &Stats::recent_ghost_hits,
                        "EvictionPolicy.ADAPTIVE: blocks cached while their hash was a ghost of "
                        "a block evicted once-used"),
                counter("frequent_ghost_hits", &Stats::frequent_ghost_hits,
                        "EvictionPolicy.ADAPTIVE: ... of a block evicted after reuse"));
}

// Garbage-collector support: an event sink or a clock may refer back to the pool.
int pool_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  PyBlockPool* pool = nb::inst_ptr<PyBlockPool>(self);
  if (pool->sink() != nullptr && pool->sink()->traverse(visit, arg) != 0) return -1;
  return pool->clock().traverse(visit, arg);
}

int pool_clear(PyObject* self) {
  if (!nb::inst_ready(self)) return 0;
  PyBlockPool* pool = nb::inst_ptr<PyBlockPool>(self);
  if (pool->sink() != nullptr) pool->sink()->clear();
  pool->clock().clear();
  return 0;
}

PyType_Slot pool_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(pool_traverse)},
                            {Py_tp_clear, reinterpret_cast<void*>(pool_clear)},
                            {0, nullptr}};

}  // namespace

void bind_block_pool(nb::module_& m) {
  nb::class_<PyBlockPool> cls(
      m, "BlockPool", nb::type_slots(pool_slots),
      "A fixed number of KV blocks with ref counts, a free queue that is also the eviction\n"
      "order (by retention priority, then LRU or the adaptive policy), and a verified hash\n"
      "index of full\n"
      "blocks (see block_pool.h).\n"
      "Pure bookkeeping; one thread owns it. Invalid block ids raise ValueError.");
  bind_stats(cls);
  cls.def(nb::init<int32_t, int32_t, bool, nb::object, Medium, nb::object, EvictionPolicy>(),
          nb::kw_only(), "num_blocks"_a, "block_size"_a = 16, "enable_caching"_a = true,
          "event_sink"_a = nb::none(), "medium"_a = Medium::kDevice, "clock"_a = nb::none(),
          "eviction_policy"_a = EvictionPolicy::kLru,
          "eviction_policy: the order cached free blocks of one retention priority are evicted\n"
          "in (EvictionPolicy.LRU or ADAPTIVE).\n"
          "event_sink: a KvEventBuffer or any object with on_event(event). medium: what the\n"
          "pool's events say it is. clock: callable() -> int milliseconds for retention\n"
          "durations (None: a steady clock); called by allocate() and free() while a block\n"
          "with a retention duration is free. Exceptions a sink or clock raises are re-raised\n"
          "when the call returns. Raises ValueError for a negative num_blocks or a\n"
          "non-positive block_size.")
      .def(
          "allocate",
          [](PyBlockPool& self, int32_t num_blocks) {
            if (num_blocks < 0) {
              raise_status(absl::InvalidArgumentError(
                  absl::StrCat("allocate(", num_blocks, "): negative block count")));
            }
            NumpyArray<BlockId> blocks = new_numpy_array<BlockId>(num_blocks);
            raise_if_error(self.mutate([&](BlockPool& p) {
              return p.allocate({blocks.data, blocks.size});
            }));
            return blocks;
          },
          "num_blocks"_a,
          "Takes blocks from the head of the free queue (ref count 1), evicting cached ones. "
          "All or nothing: ResourceExhausted changes nothing.")
      .def(
          "touch",
          [](PyBlockPool& self, BlockId block) {
            raise_if_error(self.mutate([&](BlockPool& p) { return p.touch(block); }));
          },
          "block"_a, "Adds a reference (a prefix hit); a free block leaves the free queue.")
      .def(
          "free",
          [](PyBlockPool& self, IntValues<BlockId> blocks) {
            const std::span<const BlockId> ids = blocks.checked("free", "blocks_in_eviction_order");
            raise_if_error(self.mutate([&](BlockPool& p) { return p.free(ids); }));
          },
          "blocks_in_eviction_order"_a,
          "Drops one reference per id, in order; blocks reaching 0 join the free queue: hashed "
          "ones at the tail, clean ones at the head. A double free raises FailedPrecondition "
          "and changes nothing.")
      .def(
          "find_cached",
          [](const PyBlockPool& self, const BlockHash& hash, BlockId parent,
             IntValues<TokenId> tokens, IntValues<uint64_t> extra_keys) {
            return value_or_raise(
                self.pool().find_cached(hash, parent, tokens.checked("find_cached", "tokens"),
                                        extra_keys.checked("find_cached", "extra_keys")));
          },
          "hash"_a, "parent"_a, "tokens"_a, "extra_keys"_a = std::vector<uint64_t>{},
          "The block indexed under hash if it verifiably holds tokens after parent, else -1. "
          "Takes no reference.")
      .def(
          "cache_full_block",
          [](PyBlockPool& self, BlockId block, const BlockHash& hash, BlockId parent,
             std::optional<BlockHash> parent_hash, IntValues<TokenId> tokens,
             IntValues<uint64_t> extra_keys) {
            const std::span<const TokenId> token_ids = tokens.checked("cache_full_block", "tokens");
            const std::span<const uint64_t> keys =
                extra_keys.checked("cache_full_block", "extra_keys");
            return value_or_raise(self.mutate([&](BlockPool& p) {
              return p.cache_full_block(block, hash, parent, parent_hash ? &*parent_hash : nullptr,
                                        token_ids, keys);
            }));
          },
          "block"_a, "hash"_a, "parent"_a, "parent_hash"_a.none(), "tokens"_a,
          "extra_keys"_a = std::vector<uint64_t>{},
          "Enters an in-use full block into the hash index (or keeps it as a standby of an "
          "identical indexed block); False when caching is off, the block is hashed already, "
          "another block with other contents holds the hash, or it holds K/V from before the "
          "last reset_prefix_cache(). Raises FailedPrecondition for a free block.")
      .def(
          "uncache",
          [](PyBlockPool& self, BlockId block) {
            raise_if_error(self.mutate([&](BlockPool& p) { return p.uncache(block); }));
          },
          "block"_a, "Takes the block out of the hash index (BlockRemoved); it keeps its refs.")
      .def(
          "set_retention",
          [](PyBlockPool& self, BlockId block, int32_t priority, int64_t duration_ms) {
            raise_if_error(self.mutate(
                [&](BlockPool& p) { return p.set_retention(block, priority, duration_ms); }));
          },
          "block"_a, "priority"_a, "duration_ms"_a = 0,
          "Gives the in-use block a retention priority (in [MIN_RETENTION_PRIORITY,\n"
          "MAX_RETENTION_PRIORITY]) for duration_ms after it is freed (0: no expiry), unless it\n"
          "holds a higher one; of equal priorities the longer duration wins. Raises ValueError\n"
          "for a bad id, priority or duration, FailedPrecondition for a free block.")
      .def(
          "reset_prefix_cache",
          [](PyBlockPool& self) { self.mutate([](BlockPool& p) { p.reset_prefix_cache(); }); },
          "Empties the hash index (AllBlocksCleared).")
      .def_prop_ro("num_blocks", [](const PyBlockPool& self) { return self.pool().num_blocks(); })
      .def_prop_ro("block_size", [](const PyBlockPool& self) { return self.pool().block_size(); })
      .def("num_free_blocks", [](const PyBlockPool& self) { return self.pool().num_free_blocks(); })
      .def(
          "ref_count",
          [](const PyBlockPool& self, BlockId block) {
            return value_or_raise(self.pool().ref_count(block));
          },
          "block"_a)
      .def(
          "is_cached",
          [](const PyBlockPool& self, BlockId block) {
            return value_or_raise(self.pool().is_cached(block));
          },
          "block"_a)
      .def(
          "cached_hash",
          [](const PyBlockPool& self, BlockId block) -> std::optional<BlockHash> {
            if (!value_or_raise(self.pool().is_cached(block))) return std::nullopt;
            return value_or_raise(self.pool().cached_hash(block));
          },
          "block"_a, "The block's hash, or None when it is not in the index.")
      .def(
          "retention_priority",
          [](const PyBlockPool& self, BlockId block) {
            return value_or_raise(self.pool().retention_priority(block));
          },
          "block"_a, "The retention priority the block's place in the free queue follows now.")
      .def("stats", [](const PyBlockPool& self) { return self.pool().stats(); })
      .def(
          "free_queue_order",
          [](const PyBlockPool& self) { return to_numpy<BlockId>(self.pool().free_queue_order()); },
          "Free queue from head (next allocated) to tail. O(num_free_blocks).")
      .def(
          "check_invariants",
          [](const PyBlockPool& self) { raise_if_error(self.pool().check_invariants()); },
          "Raises InternalError naming the first broken invariant.");
}

}  // namespace pagedkv::python
