#include "transfer/transfer_checks.h"

namespace pagedkv::internal {
namespace {
constexpr int64_t kMaxBlockBytes = int64_t{1} << 30;
constexpr size_t kMaxDigestBytes = 256;
}  // namespace

absl::Status check_options(const KvTransferOptions& options) {
  if (options.namespace_digest.size() > kMaxDigestBytes) {
    return absl::InvalidArgumentError(absl::StrCat("namespace_digest of ",
                                                   options.namespace_digest.size(),
                                                   " bytes; the limit is ", kMaxDigestBytes));
  }
  if (options.block_bytes.empty()) {
    return absl::InvalidArgumentError("block_bytes is empty; it needs one size per layer group");
  }
  for (size_t g = 0; g < options.block_bytes.size(); ++g) {
    if (options.block_bytes[g] < 1 || options.block_bytes[g] > kMaxBlockBytes) {
      return absl::InvalidArgumentError(absl::StrCat("block_bytes[", g,
                                                     "] = ", options.block_bytes[g],
                                                     " is outside [1, ", kMaxBlockBytes, "]"));
    }
  }
  if (options.max_blocks_per_transfer < 1 || options.max_transfers_in_flight < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_blocks_per_transfer ", options.max_blocks_per_transfer,
        " and max_transfers_in_flight ", options.max_transfers_in_flight, " must be >= 1"));
  }
  if (options.handshake_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "handshake_timeout ", absl::FormatDuration(options.handshake_timeout), " is not > 0"));
  }
  return absl::OkStatus();
}

absl::Status check_admission(absl::string_view call, KvTransferId id, bool in_flight,
                             int32_t transfers_in_flight, const KvTransferOptions& options,
                             const absl::Status& connection) {
  if (!connection.ok()) {
    return absl::UnavailableError(
        absl::StrCat(call, "(transfer ", id, "): the connection is gone: ", connection.message()));
  }
  if (in_flight) {
    return absl::AlreadyExistsError(
        absl::StrCat(call, "(transfer ", id, "): transfer ", id, " is in flight"));
  }
  if (transfers_in_flight >= options.max_transfers_in_flight) {
    return absl::ResourceExhaustedError(
        absl::StrCat(call, "(transfer ", id, "): ", transfers_in_flight,
                     " transfers in flight; the limit is ", options.max_transfers_in_flight));
  }
  return absl::OkStatus();
}

}  // namespace pagedkv::internal
