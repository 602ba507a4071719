// pagedkv-curve-keygen: writes a fresh CURVE key pair as the two ZeroMQ certificates that
// KvEventPublisher's CURVE options and the clients read (docs/events.md, "Authenticated
// events"): DIR/NAME.key (public, mode 0644) and DIR/NAME.key_secret (both keys, 0600), as
// pyzmq's zmq.auth.create_certificates() writes them.
// usage: pagedkv-curve-keygen DIR NAME
#include <cstdio>
#include <string>

#include "events/curve_keys.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr,
                 "usage: pagedkv-curve-keygen DIR NAME\n"
                 "writes DIR/NAME.key (public certificate) and DIR/NAME.key_secret (secret)\n");
    return 2;
  }
  const std::string base = std::string(argv[1]) + "/" + argv[2];
  absl::StatusOr<pagedkv::internal::CurveKeyPair> keys = pagedkv::internal::new_curve_key_pair();
  if (!keys.ok()) {
    std::fprintf(stderr, "pagedkv-curve-keygen: %s\n", keys.status().ToString().c_str());
    return 1;
  }
  for (const bool secret : {false, true}) {
    const std::string path = base + (secret ? ".key_secret" : ".key");
    if (absl::Status s = pagedkv::internal::write_certificate(path, *keys, secret); !s.ok()) {
      std::fprintf(stderr, "pagedkv-curve-keygen: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  std::printf("%s.key %s.key_secret\n", base.c_str(), base.c_str());
  return 0;
}
