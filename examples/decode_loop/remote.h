// File: examples/decode_loop/remote.h
//
// The remote tier's store for --remote: "redis://HOST:PORT[/DB]" (RedisKvStore) or
// "dir:PATH" (DirectoryKvStore), and the store that --fault corrupt-remote reads through,
// which flips one payload byte of every value it fetches, as a bad disk, a bit flip in the
// server's memory or a buggy writer would: the checksums must turn them into misses.
#ifndef PAGEDKV_EXAMPLES_DECODE_LOOP_REMOTE_H_
#define PAGEDKV_EXAMPLES_DECODE_LOOP_REMOTE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "pagedkv/remote_kv_store.h"

namespace decode_loop {

// The store `spec` names; with `corrupt_reads`, wrapped so that every fetched value has
// its last byte (a payload byte) flipped. InvalidArgument for another form, naming it.
absl::StatusOr<std::unique_ptr<pagedkv::RemoteKvStore>> open_remote_store(const std::string& spec,
                                                                          bool corrupt_reads);

}  // namespace decode_loop

#endif  // PAGEDKV_EXAMPLES_DECODE_LOOP_REMOTE_H_
