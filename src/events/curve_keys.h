// CURVE key files: reading the ZeroMQ certificates that hold a publisher's key pair and
// the public keys of the clients it admits (docs/events.md, "Authenticated events").
//
// A certificate is the text file that pyzmq's zmq.auth.create_certificates(), CZMQ's
// zcert_save() and pagedkv-curve-keygen write (ZPL, ZeroMQ RFC 4):
//
//   #   ZeroMQ CURVE **Secret** Certificate        ('#' lines are comments)
//   metadata
//   curve
//       public-key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
//       secret-key = "JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6"
//
// Keys are 40 characters of Z85 (32 bytes), as zmq_curve_keypair() produces them; quotes
// are optional. A public certificate (NAME.key) has no secret-key line; a secret one
// (NAME.key_secret) has both.
#ifndef PAGEDKV_EVENTS_CURVE_KEYS_H_
#define PAGEDKV_EVENTS_CURVE_KEYS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pagedkv::internal {

// Z85 text of one 32-byte CURVE key.
inline constexpr size_t kZ85KeyChars = 40;

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters
};

// Whether this libzmq was built with CURVE (libsodium): zmq_has("curve").
bool curve_available();

// The key pair of a secret certificate. Errors (InvalidArgument, naming the file): it
// cannot be read, has no secret-key, a key is not 40 Z85 characters, or its public-key
// is not the secret key's.
absl::StatusOr<CurveKeyPair> read_secret_certificate(const std::string& path);

// The public key of a public certificate. Errors (InvalidArgument, naming the file): it
// cannot be read, has no public-key or a malformed one, or holds a secret-key (a secret
// certificate is never handed to the other side).
absl::StatusOr<std::string> read_public_certificate(const std::string& path);

// The public keys of every "*.key" certificate in `dir` (zmq.auth's layout: NAME.key is
// public, NAME.key_secret is not read), as 32 raw bytes each. Errors (InvalidArgument):
// `dir` is not a readable directory, holds no *.key file, or one of them is invalid.
absl::StatusOr<std::vector<std::string>> read_allowed_client_keys(const std::string& dir);

// Writes a certificate for `keys` to `path`: with the secret key when `with_secret`. The
// file is created with mode 0600 when it holds the secret key, else 0644.
absl::Status write_certificate(const std::string& path, const CurveKeyPair& keys, bool with_secret);

// A fresh key pair (zmq_curve_keypair). FailedPrecondition without CURVE.
absl::StatusOr<CurveKeyPair> new_curve_key_pair();

}  // namespace pagedkv::internal

#endif  // PAGEDKV_EVENTS_CURVE_KEYS_H_
