// File: src/transfer/transfer_checks.h
//
// Argument checks the sender and the receiver share. Each message names the call, the
// transfer, the value and the limit: "send(transfer 7): block 2 (group 0, index 2) has
// 1024 bytes; group 0's blocks hold 2048".
#ifndef PAGEDKV_TRANSFER_TRANSFER_CHECKS_H_
#define PAGEDKV_TRANSFER_TRANSFER_CHECKS_H_

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "pagedkv/kv_transfer.h"

namespace pagedkv::internal {

absl::Status check_options(const KvTransferOptions& options);

// The checks of send() and expect() that do not depend on the transfers in flight.
// `Block` is KvTransferBlock or KvTransferDestination.
template <typename Block>
absl::Status check_blocks(absl::string_view call, KvTransferId id, const std::vector<Block>& blocks,
                          absl::Duration timeout, const KvTransferOptions& options) {
  const std::string where = absl::StrCat(call, "(transfer ", id, "): ");
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "timeout ", absl::FormatDuration(timeout), " is not > 0"));
  }
  if (blocks.empty() || std::ssize(blocks) > options.max_blocks_per_transfer) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, blocks.size(), " blocks; a transfer has 1 to ", options.max_blocks_per_transfer));
  }
  const int64_t groups = std::ssize(options.block_bytes);
  absl::flat_hash_set<std::pair<int32_t, int32_t>> seen;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Block& block = blocks[i];
    const std::string which =
        absl::StrCat(where, "block ", i, " (group ", block.group, ", index ", block.index, ")");
    if (block.group < 0 || block.group >= groups) {
      return absl::InvalidArgumentError(absl::StrCat(which, ": group outside [0, ", groups, ")"));
    }
    if (block.index < 0) return absl::InvalidArgumentError(absl::StrCat(which, ": index < 0"));
    if (!seen.insert({block.group, block.index}).second) {
      return absl::InvalidArgumentError(absl::StrCat(which, ": named twice"));
    }
    int64_t bytes = 0;
    for (const auto& part : block.parts) bytes += std::ssize(part);
    if (bytes != options.block_bytes[block.group]) {
      return absl::InvalidArgumentError(absl::StrCat(which, " has ", bytes, " bytes; group ",
                                                     block.group, "'s blocks hold ",
                                                     options.block_bytes[block.group]));
    }
  }
  return absl::OkStatus();
}

// AlreadyExists, ResourceExhausted or the connection's error, for a new transfer `id`.
absl::Status check_admission(absl::string_view call, KvTransferId id, bool in_flight,
                             int32_t transfers_in_flight, const KvTransferOptions& options,
                             const absl::Status& connection);

}  // namespace pagedkv::internal

#endif  // PAGEDKV_TRANSFER_TRANSFER_CHECKS_H_
