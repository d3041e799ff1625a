#include "consensusd/daemon/curve.hpp"

#include <spdlog/spdlog.h>

#include <array>
#include <cstdint>
#include <stdexcept>
#include <vector>
#include <zmq_addon.hpp>

// A draft option in zmq.h that Debian's libzmq 4.3 implements; setting it is
// checked, so a library without it refuses to start rather than fail open.
#ifndef ZMQ_ZAP_ENFORCE_DOMAIN
#define ZMQ_ZAP_ENFORCE_DOMAIN 93
#endif

namespace consensusd::daemon::curve {
namespace {

constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";  // fixed by RFC 27

std::string z85(const std::uint8_t* key32) {
  std::array<char, 41> text{};
  if (zmq_z85_encode(text.data(), key32, 32) == nullptr) return {};
  return text.data();
}

}  // namespace

bool available() {
  return zmq_has("curve") != 0;
}

config::CurveKeyPair generateKeyPair() {
  std::array<char, 41> publicKey{};
  std::array<char, 41> secretKey{};
  if (zmq_curve_keypair(publicKey.data(), secretKey.data()) != 0) throw zmq::error_t();
  return {publicKey.data(), secretKey.data()};
}

std::string publicKeyOf(const std::string& secretKey) {
  std::array<char, 41> publicKey{};
  if (secretKey.size() != 40 || zmq_curve_public(publicKey.data(), secretKey.c_str()) != 0)
    return {};
  return publicKey.data();
}

void makeServer(zmq::socket_t& router, const config::CurveKeyPair& keys) {
  router.set(zmq::sockopt::curve_server, 1);
  router.set(zmq::sockopt::curve_secretkey, keys.secretKey);
  router.set(zmq::sockopt::zap_domain, kDomain);
  const int one = 1;
  if (zmq_setsockopt(router.handle(), ZMQ_ZAP_ENFORCE_DOMAIN, &one, sizeof one) != 0)
    throw zmq::error_t();
}

void makeClient(zmq::socket_t& dealer, const config::CurveKeyPair& keys,
                const std::string& serverPublicKey) {
  dealer.set(zmq::sockopt::curve_serverkey, serverPublicKey);
  dealer.set(zmq::sockopt::curve_publickey, keys.publicKey);
  dealer.set(zmq::sockopt::curve_secretkey, keys.secretKey);
}

ZapHandler::ZapHandler(zmq::context_t& context, std::map<std::string, std::string> admitted)
    : socket_(context, zmq::socket_type::rep), admitted_(std::move(admitted)) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.bind(kZapEndpoint);
}

void ZapHandler::answer() {
  std::vector<zmq::message_t> request;
  while (zmq::recv_multipart(socket_, std::back_inserter(request), zmq::recv_flags::dontwait)) {
    // version, request id, domain, address, identity, mechanism, credentials...
    std::string status = "400";
    std::string reason = "malformed request";
    std::string userId;
    std::string key;
    if (request.size() >= 6 && request[0].to_string_view() == "1.0") {
      const auto mechanism = request[5].to_string_view();
      if (request[2].to_string_view() != kDomain) {
        reason = "unknown domain";
      } else if (mechanism != "CURVE" || request.size() != 7 || request[6].size() != 32) {
        reason = "not CURVE";
      } else {
        key = z85(static_cast<const std::uint8_t*>(request[6].data()));
        if (const auto it = admitted_.find(key); it != admitted_.end()) {
          status = "200";
          reason = "OK";
          userId = it->second;
        } else {
          reason = "key is not a neighbour's";
          if (deniedKeys_.size() < kMaxLoggedKeys && deniedKeys_.insert(key).second) {
            spdlog::warn("refusing a CURVE connection from {}: public key {} is not a neighbour's",
                         request[3].to_string(), key);
          }
        }
      }
    }
    const std::string requestId = request.size() > 1 ? request[1].to_string() : "";
    std::array<zmq::const_buffer, 6> reply{zmq::str_buffer("1.0"), zmq::buffer(requestId),
                                           zmq::buffer(status),    zmq::buffer(reason),
                                           zmq::buffer(userId),    zmq::const_buffer()};
    // REP answers before the next request; a failed send would wedge it: treat as fatal.
    if (!zmq::send_multipart(socket_, reply, zmq::send_flags::dontwait))
      throw std::runtime_error("ZAP handler could not answer");
    request.clear();
  }
}

std::string userIdOf(const zmq::message_t& message) {
  const char* value = zmq_msg_gets(message.handle(), "User-Id");
  return value == nullptr ? std::string() : std::string(value);
}

}  // namespace consensusd::daemon::curve
