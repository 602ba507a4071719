// Enums, value types (BlockHash, BlockCopy, StepOps, RetentionRange), KV events and their
// sinks, clocks, hashing, and device queries.
#include <nanobind/operators.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>

#include <cstdio>
#include <limits>
#include <string>
#include <variant>

#include "absl/strings/str_cat.h"
#include "bindings.h"
#include "pagedkv/block_hash.h"
#include "pagedkv/block_table.h"
#include "pagedkv/device.h"
#include "pagedkv/dtype.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/kv_cache_view.h"
#include "pagedkv/layer_group.h"
#include "pagedkv/retention.h"
#include "pagedkv/step_ops.h"
#include "pagedkv/types.h"

namespace pagedkv::python {

using namespace nb::literals;

// --- event sinks ------------------------------------------------------------------------

PythonEventSink::PythonEventSink(nb::object sink, CallbackErrors* errors)
    : sink_(std::move(sink)), errors_(errors) {
  KvEventBuffer* buffer = nullptr;
  if (nb::try_cast(sink_, buffer)) native_ = buffer;
}

void PythonEventSink::on_event(const KvEvent& event) {
  if (native_ != nullptr) {
    native_->on_event(event);
    return;
  }
  if (sink_.is_none()) return;
  errors_->guard([&] { sink_.attr("on_event")(event_to_python(event)); });
}

int PythonEventSink::traverse(visitproc visit, void* arg) const {
  Py_VISIT(sink_.ptr());
  return 0;
}

void PythonEventSink::clear() {
  native_ = nullptr;
  sink_ = nb::none();
}

// --- clocks -----------------------------------------------------------------------------

PythonClock::PythonClock(nb::object clock, CallbackErrors* errors)
    : clock_(std::move(clock)), errors_(errors) {}

int64_t PythonClock::now_ms() {
  if (clock_.is_none()) return last_ms_;
  errors_->guard([&] {
    last_ms_ = int64_from_callback(clock_(), "clock", "int64", "expected an int of milliseconds");
  });
  return last_ms_;
}

int64_t int64_from_callback(nb::handle result, const char* callback, const char* range_name,
                            const char* expected) {
  if (PyBool_Check(result.ptr()) || !PyIndex_Check(result.ptr())) {
    PyErr_Format(PyExc_TypeError, "%s returned %s; %s", callback, Py_TYPE(result.ptr())->tp_name,
                 expected);
    throw nb::python_error();
  }
  nb::object number = nb::steal(PyNumber_Index(result.ptr()));
  if (!number.is_valid()) throw nb::python_error();
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(number.ptr(), &overflow);
  if (value == -1 && PyErr_Occurred()) throw nb::python_error();
  if (overflow != 0) {
    PyErr_Format(PyExc_TypeError, "%s returned %S, outside the %s range [%lld, %lld]; %s", callback,
                 number.ptr(), range_name,
                 static_cast<long long>(std::numeric_limits<int64_t>::min()),
                 static_cast<long long>(std::numeric_limits<int64_t>::max()), expected);
    throw nb::python_error();
  }
  return value;
}

std::function<int64_t()> PythonClock::function() {
  if (clock_.is_none()) return nullptr;
  return [this] { return now_ms(); };
}

int PythonClock::traverse(visitproc visit, void* arg) const {
  Py_VISIT(clock_.ptr());
  return 0;
}

void PythonClock::clear() { clock_ = nb::none(); }

nb::object event_to_python(const KvEvent& event) {
  return std::visit([](const auto& e) { return nb::cast(e, nb::rv_policy::copy); }, event);
}

namespace {

std::string hash_repr(const BlockHash& hash) {
  char text[64];
  std::snprintf(text, sizeof(text), "BlockHash(0x%016llx%016llx)",
                static_cast<unsigned long long>(hash.hi), static_cast<unsigned long long>(hash.lo));
  return text;
}

// An AttentionKind as Python names it.
std::string kind_repr(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::kFull:
      return "AttentionKind.FULL";
    case AttentionKind::kSlidingWindow:
      return "AttentionKind.SLIDING_WINDOW";
    case AttentionKind::kChunkedLocal:
      return "AttentionKind.CHUNKED_LOCAL";
    case AttentionKind::kState:
      return "AttentionKind.STATE";
  }
  return "AttentionKind(" + std::to_string(static_cast<int>(kind)) + ")";
}

void bind_enums(nb::module_& m) {
  nb::enum_<DType>(m, "DType", "Element type of queries, outputs and the KV cache.")
      .value("FLOAT32", DType::kFloat32)
      .value("FLOAT16", DType::kFloat16)
      .value("BFLOAT16", DType::kBFloat16)
      .value("FLOAT8_E4M3", DType::kFloat8E4M3, "KV cache only, with per-tensor fp32 scales");
  nb::enum_<Device>(m, "Device", "Where storage lives and kernels run.")
      .value("CPU", Device::kCpu)
      .value("CUDA", Device::kCuda);
  nb::enum_<KvLayout>(m, "KvLayout", "Layout of one layer's K (or V) pool.")
      .value("HND", KvLayout::kHND, "[num_blocks, num_kv_heads, block_size, head_dim]")
      .value("NHD", KvLayout::kNHD, "[num_blocks, block_size, num_kv_heads, head_dim]");
  nb::enum_<PreemptionMode>(m, "PreemptionMode")
      .value("RECOMPUTE", PreemptionMode::kRecompute,
             "blocks freed (hashed ones stay cached); the tokens are recomputed later")
      .value("SWAP", PreemptionMode::kSwap,
             "blocks copied to the host pool, copied back by swap_in()");
  nb::enum_<HostAdmission>(m, "HostAdmission",
                           "Which cached device blocks eviction demotes into the host tier.")
      .value("ALL", HostAdmission::kAll, "every one")
      .value("REUSED", HostAdmission::kReused,
             "only blocks hit, or computed again while their hash was a ghost (a recently "
             "dropped hash); the rest are dropped");
  nb::enum_<EvictionPolicy>(m, "EvictionPolicy",
                            "Which cached free block of the lowest retention priority is "
                            "evicted first (retention.h).")
      .value("LRU", EvictionPolicy::kLru, "the least recently used")
      .value("ADAPTIVE", EvictionPolicy::kAdaptive,
             "ARC over cached blocks: recency against frequency, steered by ghost lists of "
             "recently evicted hashes; never a parent before its cached children");
  nb::enum_<Medium>(m, "Medium", "Where cached blocks live, as KV events report it.")
      .value("DEVICE", Medium::kDevice, "device memory (\"GPU\" on the wire)")
      .value("HOST", Medium::kHost, "the host tier of the prefix cache (\"CPU\")");
  nb::enum_<AttentionKind>(m, "AttentionKind",
                           "Which tokens a layer group's layers attend to (layer_group.h).")
      .value("FULL", AttentionKind::kFull, "every earlier token and itself")
      .value("SLIDING_WINDOW", AttentionKind::kSlidingWindow,
             "the last `window` tokens: [p - window + 1, p] (Mistral, Gemma 2/3, gpt-oss)")
      .value("CHUNKED_LOCAL", AttentionKind::kChunkedLocal,
             "the tokens of its window-aligned chunk: [p - p % window, p] (Llama 4)")
      .value("STATE", AttentionKind::kState,
             "no attention: one recurrent state per sequence (Mamba2, Gated DeltaNet)");
  nb::enum_<SequenceState>(m, "SequenceState")
      .value("WAITING", SequenceState::kWaiting, "holds no blocks: new, or preempted by recompute")
      .value("RUNNING", SequenceState::kRunning, "holds device blocks")
      .value("SWAPPED", SequenceState::kSwapped, "holds host blocks only");
  nb::enum_<absl::StatusCode>(m, "StatusCode", nb::is_arithmetic(),
                              "absl::StatusCode values, as the batched calls report them.")
      .value("OK", absl::StatusCode::kOk)
      .value("INVALID_ARGUMENT", absl::StatusCode::kInvalidArgument)
      .value("NOT_FOUND", absl::StatusCode::kNotFound)
      .value("ALREADY_EXISTS", absl::StatusCode::kAlreadyExists)
      .value("RESOURCE_EXHAUSTED", absl::StatusCode::kResourceExhausted)
      .value("FAILED_PRECONDITION", absl::StatusCode::kFailedPrecondition)
      .value("OUT_OF_RANGE", absl::StatusCode::kOutOfRange)
      .value("UNIMPLEMENTED", absl::StatusCode::kUnimplemented)
      .value("INTERNAL", absl::StatusCode::kInternal);
}

void bind_values(nb::module_& m) {
  nb::class_<BlockHash>(m, "BlockHash", "XXH3-128 hash of a full block chained with its parent.")
      .def(nb::init<>())
      .def(
          "__init__",
          [](BlockHash* self, uint64_t lo, uint64_t hi) {
            new (self) BlockHash{lo, hi};
          },
          "lo"_a, "hi"_a)
      .def_rw("lo", &BlockHash::lo)
      .def_rw("hi", &BlockHash::hi)
      .def(nb::self == nb::self)
      .def("__hash__",
           [](const BlockHash& h) {
             return static_cast<Py_hash_t>(h.lo ^ (h.hi * 0x9e3779b97f4a7c15ULL));
           })
      .def("__repr__", &hash_repr);

  nb::class_<BlockCopy>(m, "BlockCopy",
                        "Copy of the first num_tokens token slots of block src into dst, all "
                        "layers of layer group `group` (its pools' block ids).")
      .def(
          "__init__",
          [](BlockCopy* self, BlockId src, BlockId dst, int32_t num_tokens, int32_t group) {
            new (self) BlockCopy{src, dst, num_tokens, group};
          },
          "src"_a, "dst"_a, "num_tokens"_a, "group"_a = 0)
      .def_rw("src", &BlockCopy::src)
      .def_rw("dst", &BlockCopy::dst)
      .def_rw("num_tokens", &BlockCopy::num_tokens)
      .def_rw("group", &BlockCopy::group)
      .def(nb::self == nb::self)
      .def("__repr__", [](const BlockCopy& c) {
        return "BlockCopy(src=" + std::to_string(c.src) + ", dst=" + std::to_string(c.dst) +
               ", num_tokens=" + std::to_string(c.num_tokens) +
               (c.group != 0 ? ", group=" + std::to_string(c.group) : std::string()) + ")";
      });

  nb::class_<StateSave>(m, "StateSave",
                        "A state group's checkpoint: when the computation of sequence `seq` has\n"
                        "processed exactly `position` tokens, copy its state slot src into the\n"
                        "checkpoint slot dst of layer group `group`.")
      .def_ro("seq", &StateSave::seq)
      .def_ro("position", &StateSave::position)
      .def_ro("src", &StateSave::src)
      .def_ro("dst", &StateSave::dst)
      .def_ro("group", &StateSave::group)
      .def(nb::self == nb::self)
      .def("__repr__", [](const StateSave& s) {
        return "StateSave(seq=" + std::to_string(s.seq) +
               ", position=" + std::to_string(s.position) + ", src=" + std::to_string(s.src) +
               ", dst=" + std::to_string(s.dst) + ", group=" + std::to_string(s.group) + ")";
      });

  nb::class_<StepOps>(
      m, "StepOps",
      "Every block copy of one step (KvCacheManager.take_step_ops()), one list of\n"
      "BlockCopy per kind, in the order to run them before the step's K/V writes\n"
      "(KvStorage.run_step_ops() does): swap_out, demote, exchange, copy_on_write,\n"
      "copy_state, swap_in, promote. Copies within one list may run concurrently. The\n"
      "state saves (save_state) run during the step's computation.")
      .def_ro("swap_out", &StepOps::swap_out, "device src -> host dst: a preempted sequence")
      .def_ro("demote", &StepOps::demote, "device src -> host dst: an evicted cached block")
      .def_ro("exchange", &StepOps::exchange,
              "device src <-> host dst: a host-tier hit trades places with the evicted cached "
              "block of its new device block")
      .def_ro("copy_on_write", &StepOps::copy_on_write,
              "device src -> device dst: a shared partially filled block about to be appended to")
      .def_ro("copy_state", &StepOps::copy_state,
              "device src -> device dst of a state group: a checkpoint restored by a prefix hit, "
              "or a fork's copy of its parent's slot")
      .def_ro("swap_in", &StepOps::swap_in, "host src -> device dst: a swapped sequence resumes")
      .def_ro("promote", &StepOps::promote, "host src -> device dst: a host-tier prefix hit")
      .def_ro("save_state", &StepOps::save_state,
              "StateSave list: checkpoints to copy during the step's computation")
      .def("empty", &StepOps::empty, "True when the step has no copy to run.");

  nb::class_<RetentionRange>(m, "RetentionRange",
                             "The retention of the blocks of a sequence whose first token lies in\n"
                             "[begin, end): eviction takes lower priorities first; with a\n"
                             "duration_ms > 0 the priority expires that long after the block is\n"
                             "freed.")
      .def(
          "__init__",
          [](RetentionRange* self, int32_t begin, int32_t end, int32_t priority,
             int64_t duration_ms) {
            new (self) RetentionRange{begin, end, priority, duration_ms};
          },
          nb::kw_only(), "begin"_a = 0, "end"_a = RetentionRange{}.end,
          "priority"_a = kDefaultRetentionPriority, "duration_ms"_a = 0)
      .def_rw("begin", &RetentionRange::begin)
      .def_rw("end", &RetentionRange::end)
      .def_rw("priority", &RetentionRange::priority,
              "in [MIN_RETENTION_PRIORITY, MAX_RETENTION_PRIORITY]")
      .def_rw("duration_ms", &RetentionRange::duration_ms, "0: no expiry")
      .def(
          "__eq__",
          [](const RetentionRange& a, const RetentionRange& b) {
            return a.begin == b.begin && a.end == b.end && a.priority == b.priority &&
                   a.duration_ms == b.duration_ms;
          },
          nb::is_operator())
      .def("__repr__", [](const RetentionRange& r) {
        return "RetentionRange(begin=" + std::to_string(r.begin) +
               ", end=" + std::to_string(r.end) + ", priority=" + std::to_string(r.priority) +
               ", duration_ms=" + std::to_string(r.duration_ms) + ")";
      });
  nb::class_<LayerGroup>(m, "LayerGroup",
                         "A layer group of a hybrid model as the allocator sees it: the kind\n"
                         "of attention its layers use, its window, and its pools' sizes\n"
                         "(KvCacheManager(layer_groups=[...]); KvCacheConfig.split_budget()).")
      .def(
          "__init__",
          [](LayerGroup* self, AttentionKind kind, int32_t window, int32_t num_blocks,
             int32_t num_host_blocks) {
            new (self) LayerGroup{kind, window, num_blocks, num_host_blocks};
          },
          nb::kw_only(), "kind"_a = AttentionKind::kFull, "window"_a = 0, "num_blocks"_a = 0,
          "num_host_blocks"_a = 0)
      .def_rw("kind", &LayerGroup::kind)
      .def_rw("window", &LayerGroup::window,
              "tokens: > 0 for SLIDING_WINDOW and CHUNKED_LOCAL, 0 for FULL")
      .def_rw("num_blocks", &LayerGroup::num_blocks, "device blocks of the group's pool, > 0")
      .def_rw("num_host_blocks", &LayerGroup::num_host_blocks,
              "host blocks (swap and host tier) of the group, >= 0")
      .def(
          "__eq__",
          [](const LayerGroup& a, const LayerGroup& b) {
            return a.kind == b.kind && a.window == b.window && a.num_blocks == b.num_blocks &&
                   a.num_host_blocks == b.num_host_blocks;
          },
          nb::is_operator())
      .def("__repr__", [](const LayerGroup& g) {
        return "LayerGroup(kind=" + kind_repr(g.kind) + ", window=" + std::to_string(g.window) +
               ", num_blocks=" + std::to_string(g.num_blocks) +
               ", num_host_blocks=" + std::to_string(g.num_host_blocks) + ")";
      });
  m.def(
      "full_attention",
      [](int32_t num_blocks, int32_t num_host_blocks) {
        return full_attention(num_blocks, num_host_blocks);
      },
      "num_blocks"_a, "num_host_blocks"_a = 0,
      "The layer groups of a model whose layers all attend to every earlier token: one FULL\n"
      "LayerGroup of num_blocks device and num_host_blocks host blocks, e.g.\n"
      "KvCacheManager(layer_groups=full_attention(4096)).");
  m.attr("NO_BLOCK") = kNoBlock;            // a released table entry (SequenceView)
  m.attr("PADDING_BLOCK") = kPaddingBlock;  // what block tables hold where nothing is read
  m.attr("MIN_RETENTION_PRIORITY") = kMinRetentionPriority;
  m.attr("MAX_RETENTION_PRIORITY") = kMaxRetentionPriority;
  m.attr("DEFAULT_RETENTION_PRIORITY") = kDefaultRetentionPriority;
}

void bind_events(nb::module_& m) {
  nb::class_<EventGroup>(m, "EventGroup",
                         "The layer group an event is about (a manager with more than one\n"
                         "group): vLLM's group_idx, kv_cache_spec_kind and\n"
                         "kv_cache_spec_sliding_window on the wire.")
      .def_ro("index", &EventGroup::index, "the group's index in layer_groups")
      .def_ro("kind", &EventGroup::kind)
      .def_ro("window", &EventGroup::window, "tokens; 0 for AttentionKind.FULL")
      .def(nb::self == nb::self)
      .def("__repr__", [](const EventGroup& g) {
        return "EventGroup(index=" + std::to_string(g.index) + ", kind=" + kind_repr(g.kind) +
               ", window=" + std::to_string(g.window) + ")";
      });
  nb::class_<BlockStored>(m, "BlockStored", "Full blocks entered the prefix index of a medium.")
      .def_ro("block_hashes", &BlockStored::block_hashes)
      .def_ro("parent_hash", &BlockStored::parent_hash)
      .def_ro("token_ids", &BlockStored::token_ids)
      .def_ro("block_size", &BlockStored::block_size)
      .def_ro("extra_keys", &BlockStored::extra_keys)
      .def_ro("medium", &BlockStored::medium)
      .def_ro("group", &BlockStored::group,
              "the EventGroup of a manager with more than one layer group; None otherwise");
  nb::class_<BlockRemoved>(m, "BlockRemoved",
                           "Cached blocks left the prefix index of a medium (evicted, or moved "
                           "to the other medium).")
      .def_ro("block_hashes", &BlockRemoved::block_hashes)
      .def_ro("medium", &BlockRemoved::medium)
      .def_ro("group", &BlockRemoved::group, "as BlockStored.group");
  nb::class_<AllBlocksCleared>(m, "AllBlocksCleared", "The prefix index was emptied.");

  nb::class_<KvEventBuffer>(m, "KvEventBuffer",
                            "A native event sink that keeps events until take(): no Python "
                            "call per event.")
      .def(nb::init<>())
      .def("take", &KvEventBuffer::take,
           "Returns the events received since the last call, oldest first.");
}

void bind_functions(nb::module_& m) {
  m.def(
      "hash_block",
      [](std::optional<BlockHash> parent, IntValues<TokenId> tokens,
         IntValues<uint64_t> extra_keys) {
        return hash_block(parent ? &*parent : nullptr, tokens.checked("hash_block", "tokens"),
                          extra_keys.checked("hash_block", "extra_keys"));
      },
      "parent"_a.none(), "tokens"_a, "extra_keys"_a = std::vector<uint64_t>{},
      "XXH3-128 of a full block: parent hash (None for the first block), extra keys, tokens.");
  m.def(
      "first_attended",
      [](AttentionKind kind, int32_t window, int64_t pos) {
        if (kind != AttentionKind::kFull && window <= 0) {
          raise_status(absl::InvalidArgumentError(absl::StrCat(
              "first_attended: window ", window, " must be > 0 for ", attention_kind_name(kind))));
        }
        if (pos < 0) {
          raise_status(absl::InvalidArgumentError(
              absl::StrCat("first_attended: pos ", pos, " must be >= 0")));
        }
        return first_attended(kind, window, pos);
      },
      "kind"_a, "window"_a, "pos"_a,
      "The first position a token at `pos` attends to in a group of `kind` with `window`\n"
      "tokens (ignored for FULL): 0, max(0, pos - window + 1), or pos - pos % window.");
  m.def("cuda_device_available", &cuda_device_available,
        "True when the library was compiled with CUDA and a CUDA device is usable.");
  m.def("cuda_unavailable_reason", &cuda_unavailable_reason,
        "Why no CUDA device is usable, or '' when one is.");
  m.def("default_device", &default_device, "Device.CUDA when a GPU is usable, else Device.CPU.");
  m.def("bytes_per_element", &bytes_per_element, "dtype"_a);
}

}  // namespace

void bind_types(nb::module_& m) {
  bind_enums(m);
  bind_values(m);
  bind_events(m);
  bind_functions(m);
}

}  // namespace pagedkv::python
