// File: src/transfer/transports.h
//
// The KvTransport backends behind listen_kv_transport() and connect_kv_transport(), which
// parse the endpoint and call these.
#ifndef PAGEDKV_TRANSFER_TRANSPORTS_H_
#define PAGEDKV_TRANSFER_TRANSPORTS_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "pagedkv/kv_transport.h"

namespace pagedkv::internal {

// tcp://HOST:PORT (tcp_transport.cc).
absl::StatusOr<std::unique_ptr<KvTransportListener>> listen_tcp(absl::string_view host,
                                                                absl::string_view port);
absl::StatusOr<std::unique_ptr<KvTransport>> connect_tcp(absl::string_view host,
                                                         absl::string_view port,
                                                         absl::Duration timeout);

// shm://NAME (shm_transport.cc).
absl::StatusOr<std::unique_ptr<KvTransportListener>> listen_shm(absl::string_view name);
absl::StatusOr<std::unique_ptr<KvTransport>> connect_shm(absl::string_view name,
                                                         absl::Duration timeout,
                                                         int64_t ring_bytes);

}  // namespace pagedkv::internal

#endif  // PAGEDKV_TRANSFER_TRANSPORTS_H_
