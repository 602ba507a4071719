#include "remote/queued_kv_store.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pagedkv::internal {
namespace {

const char* op_name(RemoteOp op) {
  switch (op) {
    case RemoteOp::kPut:
      return "put";
    case RemoteOp::kGet:
      return "get";
    case RemoteOp::kExists:
      return "exists";
  }
  return "?";
}

int latency_bucket(int64_t latency_us) {
  const auto& bounds = kRemoteLatencyBoundsUs;
  return static_cast<int>(std::lower_bound(bounds.begin(), bounds.end(), latency_us) -
                          bounds.begin());
}

}  // namespace

QueuedKvStore::QueuedKvStore(const RemoteKvLimits& limits) : limits_(limits) {}

QueuedKvStore::~QueuedKvStore() { stop_io_thread(); }

absl::StatusOr<RemoteRequestId> QueuedKvStore::put(std::vector<std::string> keys,
                                                   std::vector<std::string> values) {
  return enqueue(RemoteOp::kPut, std::move(keys), std::move(values));
}

absl::StatusOr<RemoteRequestId> QueuedKvStore::get(std::vector<std::string> keys) {
  return enqueue(RemoteOp::kGet, std::move(keys), {});
}

absl::StatusOr<RemoteRequestId> QueuedKvStore::exists(std::vector<std::string> keys) {
  return enqueue(RemoteOp::kExists, std::move(keys), {});
}

absl::Status QueuedKvStore::check_key(const std::string&) const { return absl::OkStatus(); }

absl::Status QueuedKvStore::check_request(RemoteOp op, const std::vector<std::string>& keys,
                                          const std::vector<std::string>& values) const {
  const char* name = op_name(op);
  if (keys.empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": no keys"));
  if (op == RemoteOp::kPut && values.size() != keys.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("put: ", keys.size(), " keys but ", values.size(), " values"));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": key ", i, " of ", keys.size(), " is empty"));
    }
    if (std::ssize(keys[i]) > limits_.max_key_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": key ", i, " is ", keys[i].size(),
                                                     " bytes; the limit is max_key_bytes ",
                                                     limits_.max_key_bytes));
    }
    if (absl::Status status = check_key(keys[i]); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": key ", i, ": ", status.message()));
    }
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::ssize(values[i]) > limits_.max_value_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("put: value of key ", i, " ('", keys[i], "') is ", values[i].size(),
                       " bytes; the limit is max_value_bytes ", limits_.max_value_bytes));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RemoteRequestId> QueuedKvStore::enqueue(RemoteOp op, std::vector<std::string> keys,
                                                       std::vector<std::string> values) {
  if (absl::Status status = check_request(op, keys, values); !status.ok()) return status;
  RemoteRequest request{.op = op, .keys = std::move(keys), .values = std::move(values)};
  for (const std::string& value : request.values) request.value_bytes += std::ssize(value);
  request.enqueued = std::chrono::steady_clock::now();

  std::lock_guard lock(mutex_);
  request.id = next_id_++;
  const RemoteRequestId id = request.id;
  const bool fits = std::ssize(pending_) < limits_.max_queued_requests &&
                    stats_.queued_bytes + request.value_bytes <= limits_.max_queued_bytes;
  if (!fits || stopping_) {
    complete_queue_full(std::move(request));
    return id;
  }
  stats_.queued_requests += 1;
  stats_.queued_bytes += request.value_bytes;
  pending_.push_back(std::move(request));
  wake_.notify_one();
  return id;
}

void QueuedKvStore::complete_queue_full(RemoteRequest request) {
  const bool is_put = request.op == RemoteOp::kPut;
  RemoteCompletion done{
      .id = request.id,
      .op = request.op,
      .results = std::vector<RemoteKeyResult>(
          request.keys.size(), is_put ? RemoteKeyResult::kError : RemoteKeyResult::kNotFound),
      .queue_full = true,
      .error = absl::ResourceExhaustedError(
          absl::StrCat(op_name(request.op), " not sent: the queue holds ", pending_.size(),
                       " requests (max ", limits_.max_queued_requests, ") and ",
                       stats_.queued_bytes, " bytes (max ", limits_.max_queued_bytes, ")"))};
  if (!is_put) done.values.resize(request.keys.size());
  stats_.requests += 1;
  (is_put ? stats_.dropped_puts : stats_.failed_fast) += 1;
  completed_.push_back(std::move(done));
}

size_t QueuedKvStore::poll(std::vector<RemoteCompletion>* out, size_t max_completions) {
  std::lock_guard lock(mutex_);
  const size_t n = std::min(max_completions, completed_.size());
  for (size_t i = 0; i < n; ++i) {
    out->push_back(std::move(completed_.front()));
    completed_.pop_front();
  }
  return n;
}

RemoteKvStats QueuedKvStore::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void QueuedKvStore::count_reconnect() {
  std::lock_guard lock(mutex_);
  stats_.reconnects += 1;
}

void QueuedKvStore::count_redirects(int64_t redirects) {
  std::lock_guard lock(mutex_);
  stats_.redirects += redirects;
}

void QueuedKvStore::start_io_thread() {
  io_thread_ = std::thread([this] {
    // A write to a socket the peer closed raises SIGPIPE in the writing thread, and its
    // default action ends the process; blocked here, the write fails with EPIPE instead.
    // Only this thread's mask changes: the engine's handlers stay as they are.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    io_loop();
  });
}

void QueuedKvStore::stop_io_thread() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (io_thread_.joinable()) io_thread_.join();
}

void QueuedKvStore::io_loop() {
  for (;;) {
    RemoteRequest request;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
      if (stopping_) return;
      request = std::move(pending_.front());
      pending_.pop_front();
      stats_.queued_requests -= 1;
      stats_.queued_bytes -= request.value_bytes;
    }
    RemoteCompletion done{.id = request.id, .op = request.op};
    done.results.assign(request.keys.size(), RemoteKeyResult::kError);
    if (request.op == RemoteOp::kGet) done.values.resize(request.keys.size());
    run_batch(request, &done);
    finish(request, std::move(done));
  }
}

void QueuedKvStore::finish(const RemoteRequest& request, RemoteCompletion done) {
  const auto elapsed = std::chrono::steady_clock::now() - request.enqueued;
  done.latency_us = std::chrono::duration_cast<std::chrono::microseconds>(elapsed).count();
  std::lock_guard lock(mutex_);
  stats_.requests += 1;
  for (size_t i = 0; i < done.results.size(); ++i) {
    const RemoteKeyResult result = done.results[i];
    if (request.op == RemoteOp::kPut) {
      stats_.puts += 1;
      if (result == RemoteKeyResult::kOk) stats_.bytes_written += std::ssize(request.values[i]);
    } else {
      stats_.gets += 1;
      if (result == RemoteKeyResult::kOk) stats_.hits += 1;
      if (result == RemoteKeyResult::kNotFound) stats_.misses += 1;
      if (result == RemoteKeyResult::kOk && request.op == RemoteOp::kGet) {
        stats_.bytes_read += std::ssize(done.values[i]);
      }
    }
    if (result == RemoteKeyResult::kError) stats_.errors += 1;
  }
  stats_.latency_sum_us += done.latency_us;
  stats_.latency_max_us = std::max(stats_.latency_max_us, done.latency_us);
  stats_.latency_histogram[latency_bucket(done.latency_us)] += 1;
  completed_.push_back(std::move(done));
}

}  // namespace pagedkv::internal
