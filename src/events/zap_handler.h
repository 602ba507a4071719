// ZapHandler: the ZeroMQ authentication handler (ZAP, ZeroMQ RFC 27) of a publisher's
// context, admitting CURVE clients whose public key is on an allow list.
//
// libzmq asks the handler bound at inproc://zeromq.zap.01 in the socket's context about
// every CURVE handshake: (version "1.0", request id, domain, address, routing id,
// mechanism "CURVE", the client's 32-byte public key). The answer is "200" (admit) or
// "400" (refuse: the handshake fails and the client receives nothing). The handler runs on
// its own thread, so a handshake never waits for the publisher thread's turns.
#ifndef PAGEDKV_EVENTS_ZAP_HANDLER_H_
#define PAGEDKV_EVENTS_ZAP_HANDLER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"

namespace pagedkv::internal {

class ZapHandler {
 public:
  // Binds the handler in `context` and starts its thread. `allowed_keys`: raw 32-byte
  // public keys. Unavailable when the endpoint is taken (another handler in the context).
  static absl::StatusOr<std::unique_ptr<ZapHandler>> start(zmq::context_t& context,
                                                           std::vector<std::string> allowed_keys);
  // Stops the thread and closes its socket. Close the sockets it authenticates for first:
  // a CURVE socket with ZMQ_ZAP_ENFORCE_DOMAIN refuses every handshake once it is gone.
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  int64_t admitted() const { return admitted_.load(std::memory_order_relaxed); }
  int64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  ZapHandler(zmq::socket_t socket, std::vector<std::string> allowed_keys);
  void run();

  zmq::socket_t socket_;  // REP, used by the handler thread only once it runs
  absl::flat_hash_set<std::string> allowed_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> admitted_{0}, refused_{0};
  std::thread thread_;
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_EVENTS_ZAP_HANDLER_H_
