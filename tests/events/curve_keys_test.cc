// Tests of the CURVE certificate files (src/events/curve_keys.h): what reads, and what is
// refused with the file named.
#include "events/curve_keys.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <string>

#include "support/skip.h"
#include "temp_dir.h"

namespace pagedkv::internal {
namespace {

// ZeroMQ's own test key pair (RFC 26, the CurveZMQ server's keys).
constexpr char kPublic[] = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";
constexpr char kSecret[] = "JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6";
// Another valid public key (RFC 26, the client's).
constexpr char kOtherPublic[] = "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID";

using pagedkv::testing::TempDir;

std::string certificate(const std::string& public_key, const std::string& secret_key) {
  std::string text = "#   ZeroMQ CURVE Certificate\n\nmetadata\ncurve\n";
  if (!public_key.empty()) text += "    public-key = \"" + public_key + "\"\n";
  if (!secret_key.empty()) text += "    secret-key = \"" + secret_key + "\"\n";
  return text;
}

std::string message(const absl::Status& status) { return std::string(status.message()); }

bool skipped_without_curve() {
  if (curve_available()) return false;
  pagedkv::testing::report_skip("libzmq was built without CURVE (zmq_has(\"curve\") is false)");
  return true;
}

TEST_CASE("a certificate in zmq.auth's format reads: the secret one gives both keys") {
  if (skipped_without_curve()) return;
  TempDir dir;
  const absl::StatusOr<CurveKeyPair> pair =
      read_secret_certificate(dir.file("server.key_secret", certificate(kPublic, kSecret)));
  REQUIRE(pair.ok());
  REQUIRE(pair->public_key == kPublic);
  REQUIRE(pair->secret_key == kSecret);
  // Without the public-key line it is derived; unquoted values read too.
  const absl::StatusOr<CurveKeyPair> derived = read_secret_certificate(
      dir.file("bare.key_secret", std::string("curve\n  secret-key = ") + kSecret + "\n"));
  REQUIRE(derived.ok());
  REQUIRE(derived->public_key == kPublic);
  const absl::StatusOr<std::string> pub =
      read_public_certificate(dir.file("server.key", certificate(kPublic, "")));
  REQUIRE(pub.ok());
  REQUIRE(*pub == kPublic);
}

TEST_CASE("written certificates read back and the secret one is private to its owner") {
  if (skipped_without_curve()) return;
  TempDir dir;
  const absl::StatusOr<CurveKeyPair> keys = new_curve_key_pair();
  REQUIRE(keys.ok());
  const std::string public_path = dir.path() + "/engine.key";
  const std::string secret_path = dir.path() + "/engine.key_secret";
  REQUIRE(write_certificate(public_path, *keys, false).ok());
  REQUIRE(write_certificate(secret_path, *keys, true).ok());
  struct stat st {};
  REQUIRE(stat(secret_path.c_str(), &st) == 0);
  REQUIRE((st.st_mode & 0777) == 0600);
  REQUIRE(read_public_certificate(public_path).value() == keys->public_key);
  const absl::StatusOr<CurveKeyPair> back = read_secret_certificate(secret_path);
  REQUIRE(back.ok());
  REQUIRE(back->secret_key == keys->secret_key);
  REQUIRE(back->public_key == keys->public_key);
  // The allowed clients directory reads the *.key files and skips the *.key_secret ones.
  const absl::StatusOr<std::vector<std::string>> allowed = read_allowed_client_keys(dir.path());
  REQUIRE(allowed.ok());
  REQUIRE(allowed->size() == 1);
  REQUIRE((*allowed)[0].size() == 32);
}

TEST_CASE("a bad key file is refused naming the file and what is wrong") {
  if (skipped_without_curve()) return;
  TempDir dir;
  auto secret_error = [&](const std::string& name, const std::string& text) {
    const std::string path = dir.file(name, text);
    const absl::StatusOr<CurveKeyPair> keys = read_secret_certificate(path);
    REQUIRE(keys.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(message(keys.status()), Catch::Contains(path));
    return message(keys.status());
  };
  REQUIRE_THAT(message(read_secret_certificate(dir.path() + "/absent").status()),
               Catch::Contains("absent: cannot open (No such file or directory)"));
  REQUIRE_THAT(secret_error("public-only", certificate(kPublic, "")),
               Catch::Contains("no secret-key"));
  REQUIRE_THAT(secret_error("short", certificate("", "abc")),
               Catch::Contains("secret-key has 3 characters, expected 40 of Z85"));
  REQUIRE_THAT(secret_error("not-z85", certificate("", std::string(40, '~'))),
               Catch::Contains("secret-key is not valid Z85"));
  REQUIRE_THAT(secret_error("mismatch", certificate(kOtherPublic, kSecret)),
               Catch::Contains("public-key is not the public key of its secret-key"));
  REQUIRE_THAT(secret_error("twice", certificate(kPublic, kSecret) + "secret-key = \"x\"\n"),
               Catch::Contains("line 7: a second secret-key"));
  REQUIRE_THAT(secret_error("no-equals", "curve\n  secret-key \"x\"\n"),
               Catch::Contains("line 2: expected '=' after the key name"));

  const std::string secret_as_public = dir.file("leaked.key", certificate(kPublic, kSecret));
  REQUIRE_THAT(message(read_public_certificate(secret_as_public).status()),
               Catch::Contains("leaked.key: holds a secret-key"));
}

TEST_CASE("the allowed clients directory must exist and hold valid public certificates") {
  if (skipped_without_curve()) return;
  TempDir dir;
  const absl::StatusOr<std::vector<std::string>> missing =
      read_allowed_client_keys(dir.path() + "/none");
  REQUIRE(missing.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(message(missing.status()), Catch::Contains("/none: cannot list"));
  dir.file("readme.txt", "not a certificate");
  const absl::StatusOr<std::vector<std::string>> empty = read_allowed_client_keys(dir.path());
  REQUIRE_THAT(message(empty.status()), Catch::Contains("no *.key certificate in it"));
  dir.file("a.key", certificate(kPublic, ""));
  const std::string bad = dir.file("b.key", certificate("too-short", ""));
  const absl::StatusOr<std::vector<std::string>> one_bad = read_allowed_client_keys(dir.path());
  REQUIRE(one_bad.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(message(one_bad.status()),
               Catch::Contains(bad + ": public-key has 9 characters, expected 40"));
}

}  // namespace
}  // namespace pagedkv::internal
