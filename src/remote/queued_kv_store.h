// File: src/remote/queued_kv_store.h
//
// QueuedKvStore: what every RemoteKvStore backend shares: argument checks, the bounded
// request queue, the I/O thread, the completion queue and the stats. A backend derives
// from it and implements run_batch(), which the I/O thread calls for one request at a
// time, in the order accepted.
//
//   caller thread                 mutex_                        I/O thread
//   put/get/exists --check--> pending_ (bounded) ----pop----> run_batch(request, done)
//   poll()        <---------- completed_ <------------------- finish(): stats, latency
//
// NOTE: a derived class must call stop_io_thread() first in its destructor, so that the
// thread never runs run_batch() on a half-destroyed backend.
#ifndef PAGEDKV_REMOTE_QUEUED_KV_STORE_H_
#define PAGEDKV_REMOTE_QUEUED_KV_STORE_H_

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "pagedkv/remote_kv_store.h"

namespace pagedkv::internal {

// One accepted request, owned by the queue and then by the I/O thread.
struct RemoteRequest {
  RemoteRequestId id = 0;
  RemoteOp op = RemoteOp::kGet;
  std::vector<std::string> keys{};
  std::vector<std::string> values{};  // put only
  int64_t value_bytes = 0;
  std::chrono::steady_clock::time_point enqueued{};
};

class QueuedKvStore : public RemoteKvStore {
 public:
  explicit QueuedKvStore(const RemoteKvLimits& limits);
  ~QueuedKvStore() override;
  QueuedKvStore(const QueuedKvStore&) = delete;
  QueuedKvStore& operator=(const QueuedKvStore&) = delete;

  absl::StatusOr<RemoteRequestId> put(std::vector<std::string> keys,
                                      std::vector<std::string> values) final;
  absl::StatusOr<RemoteRequestId> get(std::vector<std::string> keys) final;
  absl::StatusOr<RemoteRequestId> exists(std::vector<std::string> keys) final;
  size_t poll(std::vector<RemoteCompletion>* out, size_t max_completions) final;
  RemoteKvStats stats() const final;

 protected:
  // Runs `request` against the backend on the I/O thread and fills done->results (one
  // per key) and, for gets, done->values; done->error gets the first failure.
  virtual void run_batch(RemoteRequest& request, RemoteCompletion* done) = 0;

  // A key the backend cannot store although it passed the common checks (a file name
  // too long, say): a non-OK status refuses the request. Called on the caller thread.
  virtual absl::Status check_key(const std::string& key) const;

  // Counts a connection re-established after a failure (I/O thread).
  void count_reconnect();
  // Counts redirections followed (Redis Cluster's MOVED and ASK; I/O thread).
  void count_redirects(int64_t redirects);

  // Starts the I/O thread; the derived constructor calls it last.
  void start_io_thread();
  // Stops and joins the I/O thread; requests still queued are discarded. Idempotent.
  void stop_io_thread();

 private:
  absl::StatusOr<RemoteRequestId> enqueue(RemoteOp op, std::vector<std::string> keys,
                                          std::vector<std::string> values);
  absl::Status check_request(RemoteOp op, const std::vector<std::string>& keys,
                             const std::vector<std::string>& values) const;
  void complete_queue_full(RemoteRequest request);  // with mutex_ held
  void io_loop();
  void finish(const RemoteRequest& request, RemoteCompletion done);

  const RemoteKvLimits limits_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;            // new request or stop, for the I/O thread
  std::deque<RemoteRequest> pending_;       // accepted, not yet taken by the I/O thread
  std::deque<RemoteCompletion> completed_;  // finished, not yet polled
  RemoteKvStats stats_;                     // queued_* gauges kept here under mutex_
  RemoteRequestId next_id_ = 1;
  bool stopping_ = false;
  std::thread io_thread_;
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_REMOTE_QUEUED_KV_STORE_H_
