// listen_kv_transport() and connect_kv_transport(): the endpoint's scheme picks the backend.
#include <string>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "pagedkv/kv_transport.h"
#include "transfer/transports.h"

namespace pagedkv {
namespace {

constexpr absl::string_view kForms = "tcp://HOST:PORT or shm://NAME";

struct Endpoint {
  absl::string_view scheme;
  absl::string_view host;  // tcp: the host, brackets of an IPv6 address removed; shm: NAME
  absl::string_view port;
};

// Views into `endpoint`.
absl::StatusOr<Endpoint> parse_endpoint(absl::string_view endpoint) {
  auto malformed = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("endpoint '", endpoint, "' is not of the form ", kForms));
  };
  if (absl::StartsWith(endpoint, "shm://")) {
    return Endpoint{.scheme = "shm", .host = endpoint.substr(6), .port = {}};
  }
  if (!absl::StartsWith(endpoint, "tcp://")) return malformed();
  const absl::string_view address = endpoint.substr(6);
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0 || colon + 1 == address.size()) {
    return malformed();
  }
  absl::string_view host = address.substr(0, colon);
  if (host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return Endpoint{.scheme = "tcp", .host = host, .port = address.substr(colon + 1)};
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvTransportListener>> listen_kv_transport(
    std::string_view endpoint) {
  const std::string text(endpoint);
  absl::StatusOr<Endpoint> parsed = parse_endpoint(text);
  if (!parsed.ok()) return parsed.status();
  if (parsed->scheme == "shm") return internal::listen_shm(parsed->host);
  return internal::listen_tcp(parsed->host, parsed->port);
}

absl::StatusOr<std::unique_ptr<KvTransport>> connect_kv_transport(
    std::string_view endpoint, absl::Duration timeout, const KvTransportOptions& options) {
  const std::string text(endpoint);
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("connect to ", text, ": timeout ",
                                                   absl::FormatDuration(timeout), " is not > 0"));
  }
  absl::StatusOr<Endpoint> parsed = parse_endpoint(text);
  if (!parsed.ok()) return parsed.status();
  if (parsed->scheme == "shm") {
    return internal::connect_shm(parsed->host, timeout, options.shm_ring_bytes);
  }
  return internal::connect_tcp(parsed->host, parsed->port, timeout);
}

}  // namespace pagedkv
