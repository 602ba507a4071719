// KvCacheSpec and KvStorage: the KV bytes of a model, each layer's pools exported as DLPack
// tensors, and the batched copy-on-write, swap and host-tier copies (one step's at once:
// run_step_ops).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bindings.h"
#include "pagedkv/kv_storage.h"
#include "tensors.h"

#ifdef PAGEDKV_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace pagedkv::python {
namespace {

using namespace nb::literals;

// A KvStorage and the CUDA device its pools were allocated on (the current device then).
struct PyKvStorage {
  KvStorage storage;
  int32_t device_id = 0;
};

int32_t current_device_id(Device device) {
#ifdef PAGEDKV_HAVE_CUDA
  int id = 0;
  if (device == Device::kCuda && cudaGetDevice(&id) == cudaSuccess) return id;
#endif
  (void)device;
  return 0;
}

KvStorageOptions storage_options(std::optional<Device> device, KvLayout layout,
                                 int32_t num_host_blocks) {
  return {.device = device.value_or(default_device()),
          .layout = layout,
          .num_host_blocks = num_host_blocks};
}

void check_layer(const KvStorage& storage, int32_t layer) {
  if (layer < 0 || layer >= storage.spec().num_layers) {
    raise_status(absl::OutOfRangeError(
        absl::StrCat("layer ", layer, " out of range [0, ", storage.spec().num_layers, ")")));
  }
}

// A tensor object with __dlpack__() / __dlpack_device__() and (CPU) the buffer protocol.
using PoolTensor = nb::ndarray<nb::array_api>;

// One pool of `view` (K or V) as a 4-D tensor in the storage's layout, kept alive by `owner`.
PoolTensor pool_tensor(const KvCacheView& view, void* data, KvLayout layout, int device_type,
                       int32_t device_id, nb::handle owner) {
  const bool hnd = layout == KvLayout::kHND;
  const size_t heads = static_cast<size_t>(view.num_kv_heads);
  const size_t tokens = static_cast<size_t>(view.block_size);
  const size_t shape[4] = {static_cast<size_t>(view.num_blocks), hnd ? heads : tokens,
                           hnd ? tokens : heads, static_cast<size_t>(view.head_dim)};
  const int64_t strides[4] = {view.block_stride, hnd ? view.head_stride : view.token_stride,
                              hnd ? view.token_stride : view.head_stride, 1};
  return PoolTensor(data, 4, shape, owner, strides, dlpack_dtype(view.dtype), device_type,
                    device_id);
}

// Copy ops as a list of BlockCopy or an integer array [n, 3] of (src, dst, num_tokens),
// the copies of layer group 0: any integer dtype, range-checked (never truncated); a
// float or bool one is refused.
using OpsArray = nb::ndarray<nb::ro, nb::shape<-1, 3>, nb::device::cpu>;

std::vector<BlockCopy> ops_from_array(const char* function, const OpsArray& ops) {
  std::vector<int32_t> values;
  std::optional<OutOfRangeEntry> out_of_range;
  if (!copy_integers(ops, values, out_of_range)) {
    PyErr_Format(PyExc_TypeError,
                 "%s: ops is not an integer array; expected int32 [n, 3] of (src, dst, "
                 "num_tokens) or a list of BlockCopy",
                 function);
    throw nb::python_error();
  }
  if (out_of_range.has_value()) raise_out_of_range<int32_t>(function, "ops", *out_of_range);
  std::vector<BlockCopy> copies(ops.shape(0));
  for (size_t i = 0; i < copies.size(); ++i) {
    copies[i] = {values[3 * i], values[3 * i + 1], values[3 * i + 2]};
  }
  return copies;
}

void* stream_ptr(uintptr_t stream) { return reinterpret_cast<void*>(stream); }

template <typename Method>
void bind_copy(nb::class_<PyKvStorage>& cls, const char* name, Method method, const char* doc) {
  cls.def(
         name,
         [method](PyKvStorage& self, const std::vector<BlockCopy>& ops, uintptr_t stream) {
           raise_if_error((self.storage.*method)(ops, stream_ptr(stream)));
         },
         "ops"_a, "stream"_a = 0, doc)
      .def(
          name,
          [method, name](PyKvStorage& self, const OpsArray& ops, uintptr_t stream) {
            raise_if_error((self.storage.*method)(ops_from_array(name, ops), stream_ptr(stream)));
          },
          "ops"_a, "stream"_a = 0, doc);
}

void bind_spec(nb::module_& m) {
  nb::class_<KvCacheSpec>(m, "KvCacheSpec", "Shape of a model's KV cache.")
      .def(
          "__init__",
          [](KvCacheSpec* self, int32_t num_layers, int32_t num_kv_heads, int32_t head_dim,
             DType dtype, int32_t block_size, bool latent) {
            new (self) KvCacheSpec{num_layers, num_kv_heads, head_dim, dtype, block_size, latent};
          },
          nb::kw_only(), "num_layers"_a = 1, "num_kv_heads"_a = 1, "head_dim"_a = 128,
          "dtype"_a = DType::kBFloat16, "block_size"_a = 16, "latent"_a = false)
      .def_rw("num_layers", &KvCacheSpec::num_layers)
      .def_rw("num_kv_heads", &KvCacheSpec::num_kv_heads)
      .def_rw("head_dim", &KvCacheSpec::head_dim)
      .def_rw("dtype", &KvCacheSpec::dtype)
      .def_rw("block_size", &KvCacheSpec::block_size)
      .def_rw("latent", &KvCacheSpec::latent,
              "one vector of head_dim elements per token per layer serves K and V (MLA)")
      .def("bytes_per_token", &KvCacheSpec::bytes_per_token)
      .def("bytes_per_block", &KvCacheSpec::bytes_per_block)
      .def("validate", [](const KvCacheSpec& s) { raise_if_error(s.validate()); })
      .def(
          "num_blocks_for_budget",
          [](const KvCacheSpec& s, int64_t budget) {
            return value_or_raise(s.num_blocks_for_budget(budget));
          },
          "budget_bytes"_a);
}

}  // namespace

void bind_kv_storage(nb::module_& m) {
  bind_spec(m);
  nb::class_<PyKvStorage> cls(
      m, "KvStorage",
      "The KV bytes of a KvCacheSpec: per layer a K and a V pool (CUDA memory, or host\n"
      "memory on CPU) and an optional host pool (swapped sequences and the prefix cache's\n"
      "host tier). k_cache(layer) / v_cache(layer) are\n"
      "DLPack tensors of the pools (torch.from_dlpack, numpy.from_dlpack), valid while\n"
      "they are referenced (they keep the storage alive). create_state() makes a state\n"
      "group's storage instead: per layer a pool of state slots (state_cache(layer)).");
  cls.def(
         "__init__",
         [](PyKvStorage* self, const KvCacheSpec& spec, int32_t num_blocks,
            std::optional<Device> device, KvLayout layout, int32_t num_host_blocks,
            int32_t layer_group) {
           KvStorageOptions options = storage_options(device, layout, num_host_blocks);
           options.layer_group = layer_group;
           new (self) PyKvStorage{value_or_raise(KvStorage::create(spec, num_blocks, options)),
                                  current_device_id(options.device)};
         },
         "spec"_a, "num_blocks"_a, nb::kw_only(), "device"_a.none() = nb::none(),
         "layout"_a = KvLayout::kHND, "num_host_blocks"_a = 0, "layer_group"_a = 0,
         "Allocates the pools (zero-filled) on device (default: CUDA when usable). A hybrid\n"
         "model keeps one storage per layer group: layer_group says whose copies\n"
         "run_step_ops() runs (the others' are skipped).")
      .def_static(
          "create_for_budget",
          [](const KvCacheSpec& spec, int64_t budget_bytes, std::optional<Device> device,
             KvLayout layout, int32_t num_host_blocks, int32_t layer_group) {
            KvStorageOptions options = storage_options(device, layout, num_host_blocks);
            options.layer_group = layer_group;
            return new PyKvStorage{
                value_or_raise(KvStorage::create_for_budget(spec, budget_bytes, options)),
                current_device_id(options.device)};
          },
          "spec"_a, "budget_bytes"_a, nb::kw_only(), "device"_a.none() = nb::none(),
          "layout"_a = KvLayout::kHND, "num_host_blocks"_a = 0, "layer_group"_a = 0,
          nb::rv_policy::take_ownership)
      .def_static(
          "create_state",
          [](const StateShape& shape, int32_t num_slots, std::optional<Device> device,
             int32_t num_host_slots, int32_t layer_group) {
            KvStorageOptions options = storage_options(device, KvLayout::kHND, num_host_slots);
            options.layer_group = layer_group;
            return new PyKvStorage{
                value_or_raise(KvStorage::create_state(shape, num_slots, options)),
                current_device_id(options.device)};
          },
          "shape"_a, "num_slots"_a, nb::kw_only(), "device"_a.none() = nb::none(),
          "num_host_slots"_a = 0, "layer_group"_a = 0, nb::rv_policy::take_ownership,
          "A state group's storage: num_slots slots of shape (zero-filled), and num_host_slots\n"
          "host slots for swapped sequences; run_step_ops() runs the ops of layer_group.")
      .def_static(
          "free_memory_budget",
          [](Device device, double fraction) {
            return value_or_raise(KvStorage::free_memory_budget(device, fraction));
          },
          "device"_a, "fraction"_a)
      .def_prop_ro("spec", [](const PyKvStorage& s) { return s.storage.spec(); })
      .def_prop_ro("device", [](const PyKvStorage& s) { return s.storage.device(); })
      .def_prop_ro("layout", [](const PyKvStorage& s) { return s.storage.layout(); })
      .def_prop_ro("num_blocks", [](const PyKvStorage& s) { return s.storage.num_blocks(); })
      .def_prop_ro("num_host_blocks",
                   [](const PyKvStorage& s) { return s.storage.num_host_blocks(); })
      .def_prop_ro("bytes", [](const PyKvStorage& s) { return s.storage.bytes(); })
      .def_prop_ro("host_bytes", [](const PyKvStorage& s) { return s.storage.host_bytes(); })
      .def_prop_ro("holds_state", [](const PyKvStorage& s) { return s.storage.holds_state(); })
      .def_prop_ro("layer_group", [](const PyKvStorage& s) { return s.storage.layer_group(); });

  auto pool = [](bool host, bool values) {
    return [host, values](PyKvStorage& self, int32_t layer) {
      check_layer(self.storage, layer);
      if (self.storage.holds_state()) {
        raise_status(absl::InvalidArgumentError(
            "a state storage has no K/V pools: state_cache(layer) holds its slots"));
      }
      const KvCacheView view = host ? self.storage.host_view(layer) : self.storage.view(layer);
      const bool cuda = !host && self.storage.device() == Device::kCuda;
      return pool_tensor(view, values ? view.v : view.k, self.storage.layout(),
                         cuda ? kDlCuda : kDlCpu, cuda ? self.device_id : 0, nb::find(&self));
    };
  };
  cls.def("k_cache", pool(false, false), "layer"_a, "Layer's K pool (4-D, the storage's layout).")
      .def("v_cache", pool(false, true), "layer"_a, "Layer's V pool.")
      .def("host_k_cache", pool(true, false), "layer"_a, "Layer's K pool in the host pool.")
      .def("host_v_cache", pool(true, true), "layer"_a, "Layer's V pool in the host pool.");
  cls.def(
      "state_cache",
      [](PyKvStorage& self, int32_t layer) {
        check_layer(self.storage, layer);
        if (!self.storage.holds_state()) {
          raise_status(absl::InvalidArgumentError(
              "state_cache: a K/V storage has no state slots (create_state() makes one)"));
        }
        const bool cuda = self.storage.device() == Device::kCuda;
        const size_t shape[2] = {static_cast<size_t>(self.storage.num_blocks()),
                                 static_cast<size_t>(self.storage.state_shape().bytes_per_layer())};
        return nb::ndarray<nb::array_api, uint8_t>(
            self.storage.num_blocks() > 0 ? self.storage.state(layer, 0) : nullptr, 2, shape,
            nb::find(&self), nullptr, nb::dtype<uint8_t>(), cuda ? kDlCuda : kDlCpu,
            cuda ? self.device_id : 0);
      },
      "layer"_a,
      "Layer's state slots as bytes [num_slots, bytes per layer]: each row the conv state\n"
      "(conv_elements of conv_dtype), then the recurrent state; view them in those dtypes.");
  bind_copy(cls, "copy_blocks", &KvStorage::copy_blocks,
            "Copy-on-write copies (StepOps.copy_on_write) in the main pool, one batch.");
  bind_copy(cls, "swap_out", &KvStorage::swap_out, "Main-pool src -> host-pool dst copies.");
  bind_copy(cls, "swap_in", &KvStorage::swap_in, "Host-pool src -> main-pool dst copies.");
  bind_copy(cls, "demote", &KvStorage::demote,
            "Host tier: main-pool src -> host-pool dst copies of whole blocks (num_tokens must "
            "be block_size).");
  bind_copy(cls, "promote", &KvStorage::promote,
            "Host tier: host-pool src -> main-pool dst copies of whole blocks (num_tokens must "
            "be block_size).");
  bind_copy(cls, "exchange", &KvStorage::exchange,
            "Host tier: swaps main-pool block src and host-pool block dst, whole blocks.");
  cls.def(
         "run_step_ops",
         [](PyKvStorage& self, const StepOps& ops, uintptr_t stream) {
           raise_if_error(self.storage.run_step_ops(ops, stream_ptr(stream)));
         },
         "ops"_a, "stream"_a = 0,
         "Runs a step's copies (KvCacheManager.take_step_ops()) of this storage's layer group\n"
         "in StepOps' order: swap_out, demote, exchange, copy_on_write, copy_state, swap_in,\n"
         "promote. On an error the lists before the failing one have run, the rest have not.")
      .def(
          "synchronize", [](PyKvStorage& self) { raise_if_error(self.storage.synchronize()); },
          "Waits for the storage's queued CUDA work (no-op on CPU).");
}

}  // namespace pagedkv::python
