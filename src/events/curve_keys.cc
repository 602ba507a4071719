// CURVE certificates: ZPL text read line by line (see curve_keys.h).
#include "events/curve_keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace pagedkv::internal {
namespace {

// The public-key and secret-key values of a certificate, as written (not yet checked).
struct CertificateText {
  std::optional<std::string> public_key;
  std::optional<std::string> secret_key;
};

absl::Status invalid(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("CURVE certificate ", path, ": ", what));
}

absl::StatusOr<CertificateText> read_certificate(const std::string& path) {
  std::ifstream in(path);
  if (!in) return invalid(path, absl::StrCat("cannot open (", std::strerror(errno), ")"));
  CertificateText cert;
  int line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text.front() == '#') continue;
    // ZPL: "name = value" under its section; only the two key names matter here.
    std::optional<std::string>* slot = nullptr;
    if (absl::ConsumePrefix(&text, "public-key")) {
      slot = &cert.public_key;
    } else if (absl::ConsumePrefix(&text, "secret-key")) {
      slot = &cert.secret_key;
    } else {
      continue;
    }
    text = absl::StripLeadingAsciiWhitespace(text);
    if (!absl::ConsumePrefix(&text, "=")) {
      return invalid(path, absl::StrCat("line ", line_number, ": expected '=' after the key name"));
    }
    text = absl::StripAsciiWhitespace(text);
    if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') &&
        text.back() == text.front()) {
      text = text.substr(1, text.size() - 2);
    }
    if (slot->has_value()) {
      return invalid(path, absl::StrCat("line ", line_number, ": a second ",
                                        slot == &cert.public_key ? "public-key" : "secret-key"));
    }
    *slot = std::string(text);
  }
  if (in.bad()) return invalid(path, "read error");
  return cert;
}

// The 32 bytes of a Z85 key, or an error naming the file and which key is wrong.
absl::StatusOr<std::string> decode_key(const std::string& path, absl::string_view name,
                                       const std::string& z85) {
  if (z85.size() != kZ85KeyChars) {
    return invalid(path, absl::StrCat(name, " has ", z85.size(), " characters, expected ",
                                      kZ85KeyChars, " of Z85"));
  }
  std::array<uint8_t, 32> bytes{};
  if (zmq_z85_decode(bytes.data(), z85.c_str()) == nullptr) {
    return invalid(path, absl::StrCat(name, " is not valid Z85"));
  }
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace

bool curve_available() { return zmq_has("curve") != 0; }

absl::StatusOr<CurveKeyPair> read_secret_certificate(const std::string& path) {
  absl::StatusOr<CertificateText> cert = read_certificate(path);
  if (!cert.ok()) return cert.status();
  if (!cert->secret_key) {
    return invalid(path, "no secret-key (a public certificate? the secret one is NAME.key_secret)");
  }
  if (absl::StatusOr<std::string> s = decode_key(path, "secret-key", *cert->secret_key); !s.ok()) {
    return s.status();
  }
  std::array<char, kZ85KeyChars + 1> derived{};
  if (zmq_curve_public(derived.data(), cert->secret_key->c_str()) != 0) {
    return invalid(path, absl::StrCat("cannot derive the public key: ", zmq_strerror(zmq_errno())));
  }
  CurveKeyPair keys{.public_key = derived.data(), .secret_key = *cert->secret_key};
  if (cert->public_key && *cert->public_key != keys.public_key) {
    if (absl::StatusOr<std::string> p = decode_key(path, "public-key", *cert->public_key);
        !p.ok()) {
      return p.status();
    }
    return invalid(path, "public-key is not the public key of its secret-key");
  }
  return keys;
}

absl::StatusOr<std::string> read_public_certificate(const std::string& path) {
  absl::StatusOr<CertificateText> cert = read_certificate(path);
  if (!cert.ok()) return cert.status();
  if (cert->secret_key) {
    return invalid(path, "holds a secret-key; give the public certificate (NAME.key)");
  }
  if (!cert->public_key) return invalid(path, "no public-key");
  if (absl::StatusOr<std::string> p = decode_key(path, "public-key", *cert->public_key); !p.ok()) {
    return p.status();
  }
  return *cert->public_key;
}

absl::StatusOr<std::vector<std::string>> read_allowed_client_keys(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::directory_iterator entries(dir, error);
  if (error) {
    return absl::InvalidArgumentError(absl::StrCat("CURVE allowed clients directory ", dir,
                                                   ": cannot list (", error.message(), ")"));
  }
  std::vector<std::string> paths;
  for (const fs::directory_entry& entry : entries) {
    if (entry.path().extension() == ".key" && entry.is_regular_file()) {
      paths.push_back(entry.path().string());
    }
  }
  if (paths.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CURVE allowed clients directory ", dir,
                     ": no *.key certificate in it, so no client could connect"));
  }
  std::sort(paths.begin(), paths.end());  // the first bad file reported is deterministic
  std::vector<std::string> keys;
  for (const std::string& path : paths) {
    absl::StatusOr<std::string> z85 = read_public_certificate(path);
    if (!z85.ok()) return z85.status();
    absl::StatusOr<std::string> bytes = decode_key(path, "public-key", *z85);
    if (!bytes.ok()) return bytes.status();
    keys.push_back(*std::move(bytes));
  }
  return keys;
}

absl::Status write_certificate(const std::string& path, const CurveKeyPair& keys,
                               bool with_secret) {
  std::ostringstream text;
  text << "#   ****  Generated by pagedkv-curve-keygen  ****\n"
       << "#   ZeroMQ CURVE " << (with_secret ? "**Secret** Certificate" : "Public Certificate")
       << "\n"
       << (with_secret ? "#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.\n"
                       : "#   Exchange securely, or use a secure mechanism to verify the contents\n"
                         "#   of this file after exchange. Store public certificates in your home\n"
                         "#   directory, in the .curve subdirectory.\n")
       << "\nmetadata\ncurve\n    public-key = \"" << keys.public_key << "\"\n";
  if (with_secret) text << "    secret-key = \"" << keys.secret_key << "\"\n";
  const std::string bytes = text.str();
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, with_secret ? 0600 : 0644);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  const ssize_t written = ::write(fd, bytes.data(), bytes.size());
  const int close_result = ::close(fd);
  if (written != static_cast<ssize_t>(bytes.size()) || close_result != 0) {
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<CurveKeyPair> new_curve_key_pair() {
  std::array<char, kZ85KeyChars + 1> public_key{}, secret_key{};
  if (zmq_curve_keypair(public_key.data(), secret_key.data()) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "zmq_curve_keypair: ", zmq_strerror(zmq_errno()), " (libzmq built without CURVE?)"));
  }
  return CurveKeyPair{.public_key = public_key.data(), .secret_key = secret_key.data()};
}

}  // namespace pagedkv::internal
