// The --remote store and the corrupting wrapper of --fault corrupt-remote.
#include "remote.h"

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "pagedkv/directory_kv_store.h"
#include "pagedkv/redis_kv_store.h"

namespace decode_loop {
namespace {

// Every value it fetches has its last byte (a payload byte) flipped, as if it had been
// corrupted where it is stored.
class CorruptingKvStore final : public pagedkv::RemoteKvStore {
 public:
  explicit CorruptingKvStore(std::unique_ptr<pagedkv::RemoteKvStore> store)
      : store_(std::move(store)) {}

  absl::StatusOr<pagedkv::RemoteRequestId> put(std::vector<std::string> keys,
                                               std::vector<std::string> values) override {
    return store_->put(std::move(keys), std::move(values));
  }
  absl::StatusOr<pagedkv::RemoteRequestId> get(std::vector<std::string> keys) override {
    return store_->get(std::move(keys));
  }
  absl::StatusOr<pagedkv::RemoteRequestId> exists(std::vector<std::string> keys) override {
    return store_->exists(std::move(keys));
  }
  size_t poll(std::vector<pagedkv::RemoteCompletion>* out, size_t max_completions) override {
    const size_t first = out->size();
    const size_t n = store_->poll(out, max_completions);
    for (size_t i = first; i < out->size(); ++i) {
      for (std::string& value : (*out)[i].values) {
        if (!value.empty()) value.back() ^= 0x01;
      }
    }
    return n;
  }
  pagedkv::RemoteKvStats stats() const override { return store_->stats(); }

 private:
  std::unique_ptr<pagedkv::RemoteKvStore> store_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<pagedkv::RemoteKvStore>> open_remote_store(const std::string& spec,
                                                                          bool corrupt_reads) {
  absl::StatusOr<std::unique_ptr<pagedkv::RemoteKvStore>> store;
  if (absl::StartsWith(spec, "redis://")) {
    store = pagedkv::create_redis_kv_store({.url = spec});
  } else if (absl::StartsWith(spec, "dir:") && spec.size() > 4) {
    store = pagedkv::create_directory_kv_store({.directory = spec.substr(4)});
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--remote '", spec, "': expected redis://HOST:PORT[/DB] or dir:PATH"));
  }
  if (!store.ok() || !corrupt_reads) return store;
  return std::make_unique<CorruptingKvStore>(*std::move(store));
}

}  // namespace decode_loop
