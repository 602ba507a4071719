// File: pagedkv/directory_kv_store.h
//
// A RemoteKvStore in a directory, one file per key: a local disk, or a filesystem that
// several engines mount (NFS, Lustre, a FUSE object store). Its I/O thread writes each
// value to a temporary file in the same directory and renames it over the key's file, so
// a reader (this engine or another) sees the old value or the new one, never a part:
// rename() within one directory is atomic on POSIX filesystems, NFS included.
//
// File names: the key with every byte outside [A-Za-z0-9_-] written as %XX (uppercase
// hex), so a key can never name a path outside the directory or a hidden file.
// Temporary files start with ".tmp-"; a writer that dies mid-write leaves one behind,
// which no get ever reads (docs/remote.md).
//
// Example (in a function returning a Status):
//   auto store = create_directory_kv_store({.directory = "/mnt/kv/llama-8b"});
//   if (!store.ok()) return store.status();
//   auto id = (*store)->put({"pagedkv:llama-8b-tp0:00ff"}, {"payload"});
//   if (!id.ok()) return id.status();
#ifndef PAGEDKV_DIRECTORY_KV_STORE_H_
#define PAGEDKV_DIRECTORY_KV_STORE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "pagedkv/remote_kv_store.h"

namespace pagedkv {

struct DirectoryKvStoreOptions {
  std::string directory = "";
  bool create_directory = true;  // create it (and its parents) when missing
  // fsync each file before the rename and the directory after it: the value survives a
  // power loss once its put completes. Off: the page cache decides (much faster).
  bool fsync = false;
  RemoteKvLimits limits{};
};

// create_directory_kv_store()
//
// Checks that the directory exists (or creates it) and is writable, then starts the I/O
// thread. Errors: InvalidArgument for an empty path or a non-positive limit;
// FailedPrecondition for a path that is not a writable directory (the message names it
// and the errno text).
[[nodiscard]] absl::StatusOr<std::unique_ptr<RemoteKvStore>> create_directory_kv_store(
    const DirectoryKvStoreOptions& options);

}  // namespace pagedkv

#endif  // PAGEDKV_DIRECTORY_KV_STORE_H_
