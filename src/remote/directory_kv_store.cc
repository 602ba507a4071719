#include "remote/directory_kv_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pagedkv {
namespace internal {
namespace {

std::string errno_text(int error) { return std::strerror(error); }

absl::Status file_error(const char* what, const std::string& path, int error) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", errno_text(error)));
}

// Closes a descriptor when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now and reports close()'s error (NFS reports write errors at close).
  int release_and_close() {
    const int result = close(fd_);
    fd_ = -1;
    return result;
  }

 private:
  int fd_;
};

bool write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

std::string random_temp_prefix() {
  std::random_device device;
  const uint64_t random = (static_cast<uint64_t>(device()) << 32) | device();
  return absl::StrFormat(".tmp-%016x-", random);
}

}  // namespace

std::string key_file_name(const std::string& key) {
  std::string name;
  name.reserve(key.size());
  for (const char c : key) {
    if (absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-') {
      name.push_back(c);
    } else {
      absl::StrAppendFormat(&name, "%%%02X", static_cast<unsigned char>(c));
    }
  }
  return name;
}

DirectoryKvStore::DirectoryKvStore(const DirectoryKvStoreOptions& options)
    : QueuedKvStore(options.limits), options_(options), temp_prefix_(random_temp_prefix()) {
  start_io_thread();
}

DirectoryKvStore::~DirectoryKvStore() { stop_io_thread(); }

absl::Status DirectoryKvStore::check_key(const std::string& key) const {
  const size_t length = key_file_name(key).size();
  if (length > kMaxKeyFileName) {
    return absl::InvalidArgumentError(absl::StrCat("its file name is ", length,
                                                   " bytes; the limit is ", kMaxKeyFileName,
                                                   " (bytes outside [A-Za-z0-9_-] take 3)"));
  }
  return absl::OkStatus();
}

RemoteKeyResult DirectoryKvStore::write_file(const std::string& key, const std::string& value,
                                             absl::Status* error) {
  const std::string path = absl::StrCat(options_.directory, "/", key_file_name(key));
  const std::string temp = absl::StrCat(options_.directory, "/", temp_prefix_, temp_counter_++);
  Fd fd(open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    *error = file_error("create", temp, errno);
    return RemoteKeyResult::kError;
  }
  const bool written = write_all(fd.get(), value) && (!options_.fsync || fsync(fd.get()) == 0);
  const int saved_errno = errno;
  if (!written || fd.release_and_close() != 0) {
    *error = file_error("write", temp, written ? errno : saved_errno);
    unlink(temp.c_str());
    return RemoteKeyResult::kError;
  }
  if (rename(temp.c_str(), path.c_str()) != 0) {
    *error = file_error("rename to", path, errno);
    unlink(temp.c_str());
    return RemoteKeyResult::kError;
  }
  return RemoteKeyResult::kOk;
}

RemoteKeyResult DirectoryKvStore::read_file(const std::string& key, std::string* value,
                                            absl::Status* error) {
  const std::string path = absl::StrCat(options_.directory, "/", key_file_name(key));
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return RemoteKeyResult::kNotFound;
    *error = file_error("open", path, errno);
    return RemoteKeyResult::kError;
  }
  struct stat info {};
  if (fstat(fd.get(), &info) != 0) {
    *error = file_error("stat", path, errno);
    return RemoteKeyResult::kError;
  }
  if (info.st_size > options_.limits.max_value_bytes) {
    *error = absl::InternalError(absl::StrCat(path, " is ", info.st_size,
                                              " bytes; the limit is max_value_bytes ",
                                              options_.limits.max_value_bytes));
    return RemoteKeyResult::kError;
  }
  // The file never changes once renamed into place: its size at open is its size.
  value->resize(static_cast<size_t>(info.st_size));
  size_t done = 0;
  while (done < value->size()) {
    const ssize_t n = read(fd.get(), value->data() + done, value->size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *error = n == 0 ? absl::InternalError(absl::StrCat(path, ": shorter than its size"))
                      : file_error("read", path, errno);
      value->clear();
      return RemoteKeyResult::kError;
    }
    done += static_cast<size_t>(n);
  }
  return RemoteKeyResult::kOk;
}

RemoteKeyResult DirectoryKvStore::stat_file(const std::string& key, absl::Status* error) {
  const std::string path = absl::StrCat(options_.directory, "/", key_file_name(key));
  struct stat info {};
  if (stat(path.c_str(), &info) == 0) return RemoteKeyResult::kOk;
  if (errno == ENOENT) return RemoteKeyResult::kNotFound;
  *error = file_error("stat", path, errno);
  return RemoteKeyResult::kError;
}

void DirectoryKvStore::run_batch(RemoteRequest& request, RemoteCompletion* done) {
  for (size_t i = 0; i < request.keys.size(); ++i) {
    absl::Status error;
    const std::string& key = request.keys[i];
    switch (request.op) {
      case RemoteOp::kPut:
        done->results[i] = write_file(key, request.values[i], &error);
        break;
      case RemoteOp::kGet:
        done->results[i] = read_file(key, &done->values[i], &error);
        break;
      case RemoteOp::kExists:
        done->results[i] = stat_file(key, &error);
        break;
    }
    if (!error.ok() && done->error.ok()) done->error = std::move(error);
  }
  // One directory fsync per batch makes its renames durable.
  if (options_.fsync && request.op == RemoteOp::kPut) {
    Fd directory(open(options_.directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (directory.get() < 0 || fsync(directory.get()) != 0) {
      if (done->error.ok()) done->error = file_error("fsync", options_.directory, errno);
      done->results.assign(done->results.size(), RemoteKeyResult::kError);
    }
  }
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<RemoteKvStore>> create_directory_kv_store(
    const DirectoryKvStoreOptions& options) {
  if (options.directory.empty()) {
    return absl::InvalidArgumentError("directory store: no directory given");
  }
  const RemoteKvLimits& limits = options.limits;
  if (limits.max_value_bytes <= 0 || limits.max_key_bytes <= 0 || limits.max_queued_requests <= 0 ||
      limits.max_queued_bytes <= 0) {
    return absl::InvalidArgumentError("directory store: every limit must be positive");
  }
  std::error_code error;
  if (options.create_directory) std::filesystem::create_directories(options.directory, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("directory store: cannot create ", options.directory, ": ", error.message()));
  }
  struct stat info {};
  std::string why;
  if (stat(options.directory.c_str(), &info) != 0) {
    why = internal::errno_text(errno);
  } else if (!S_ISDIR(info.st_mode)) {
    why = "not a directory";
  } else if (access(options.directory.c_str(), W_OK | X_OK) != 0) {
    why = internal::errno_text(errno);
  }
  if (!why.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("directory store: ", options.directory,
                                                      " is not a writable directory: ", why));
  }
  return std::make_unique<internal::DirectoryKvStore>(options);
}

}  // namespace pagedkv
