// ZapHandler: answers libzmq's ZAP requests from an allow list of CURVE public keys.
#include "events/zap_handler.h"

#include <chrono>
#include <iterator>
#include <utility>
#include <zmq_addon.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pagedkv::internal {
namespace {

constexpr char kZapEndpoint[] = "inproc://zeromq.zap.01";
// How often the thread looks at its stop flag while no handshake comes.
constexpr auto kStopPoll = std::chrono::milliseconds(50);
// A ZAP request: version, request id, domain, address, routing id, mechanism, then the
// mechanism's credentials (CURVE: one frame, the client's public key).
constexpr size_t kCurveRequestFrames = 7;
constexpr size_t kCurveKeyBytes = 32;

}  // namespace

absl::StatusOr<std::unique_ptr<ZapHandler>> ZapHandler::start(
    zmq::context_t& context, std::vector<std::string> allowed_keys) {
  zmq::socket_t socket(context, zmq::socket_type::rep);
  socket.set(zmq::sockopt::linger, 0);
  try {
    socket.bind(kZapEndpoint);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(absl::StrCat("KvEventPublisher: cannot bind the ZAP handler ",
                                               kZapEndpoint, ": ", e.what()));
  }
  return std::unique_ptr<ZapHandler>(new ZapHandler(std::move(socket), std::move(allowed_keys)));
}

ZapHandler::ZapHandler(zmq::socket_t socket, std::vector<std::string> allowed_keys)
    : socket_(std::move(socket)), allowed_(allowed_keys.begin(), allowed_keys.end()) {
  thread_ = std::thread([this] { run(); });
}

ZapHandler::~ZapHandler() {
  stop_.store(true, std::memory_order_release);
  thread_.join();
}

void ZapHandler::run() {
  std::vector<zmq::message_t> request;
  while (!stop_.load(std::memory_order_acquire)) {
    try {
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, kStopPoll) == 0) continue;
      request.clear();
      if (!zmq::recv_multipart(socket_, std::back_inserter(request), zmq::recv_flags::dontwait)) {
        continue;
      }
      // A malformed request (not from libzmq) still gets an answer: REP must reply.
      const bool well_formed =
          request.size() == kCurveRequestFrames && request[0].to_string_view() == "1.0" &&
          request[5].to_string_view() == "CURVE" && request[6].size() == kCurveKeyBytes;
      const bool admit = well_formed && allowed_.contains(request[6].to_string());
      (admit ? admitted_ : refused_).fetch_add(1, std::memory_order_relaxed);
      std::string request_id = request.size() > 1 ? request[1].to_string() : "";
      std::array<zmq::const_buffer, 6> reply = {
          zmq::str_buffer("1.0"),
          zmq::buffer(request_id),
          admit ? zmq::str_buffer("200") : zmq::str_buffer("400"),
          admit ? zmq::str_buffer("OK") : zmq::str_buffer("client key not allowed"),
          zmq::str_buffer(""),  // user id
          zmq::str_buffer(""),  // metadata
      };
      zmq::send_multipart(socket_, reply);
    } catch (const zmq::error_t&) {
      // The context is terminating, or a broken exchange: the next turn looks at stop_.
    }
  }
  socket_.close();
}

}  // namespace pagedkv::internal
