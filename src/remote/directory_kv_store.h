// File: src/remote/directory_kv_store.h
//
// DirectoryKvStore: the QueuedKvStore backend behind create_directory_kv_store(). File
// operations run on the I/O thread; key_file_name() also on the caller's (check_key).
#ifndef PAGEDKV_REMOTE_DIRECTORY_KV_STORE_H_
#define PAGEDKV_REMOTE_DIRECTORY_KV_STORE_H_

#include <cstdint>
#include <string>

#include "pagedkv/directory_kv_store.h"
#include "remote/queued_kv_store.h"

namespace pagedkv::internal {

// Longest file name a key may map to: NAME_MAX (255) on Linux filesystems, less room
// for other filesystems' suffixes.
inline constexpr size_t kMaxKeyFileName = 240;

// The key's file name: bytes outside [A-Za-z0-9_-] as %XX.
std::string key_file_name(const std::string& key);

class DirectoryKvStore final : public QueuedKvStore {
 public:
  explicit DirectoryKvStore(const DirectoryKvStoreOptions& options);
  ~DirectoryKvStore() override;

 private:
  void run_batch(RemoteRequest& request, RemoteCompletion* done) override;
  absl::Status check_key(const std::string& key) const override;

  // Each returns the key's result; `error` gets the failure's status when kError.
  RemoteKeyResult write_file(const std::string& key, const std::string& value, absl::Status* error);
  RemoteKeyResult read_file(const std::string& key, std::string* value, absl::Status* error);
  RemoteKeyResult stat_file(const std::string& key, absl::Status* error);

  const DirectoryKvStoreOptions options_;
  const std::string temp_prefix_;  // ".tmp-<random>-": unique to this store
  uint64_t temp_counter_ = 0;      // I/O thread only
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_REMOTE_DIRECTORY_KV_STORE_H_
