#pragma once
// CurveZMQ on the peer links (docs/design.md §6, security.curve): every link is
// encrypted, and this node's ROUTER admits only the public keys of its
// in-neighbours. The ZAP handler (ZeroMQ RFC 27) runs on the engine thread:
// its REP socket shares the engine's context and is polled with the others.
// It fails closed: a key that is not a neighbour's, a malformed request, or a
// request outside our domain is denied, and ZAP_ENFORCE_DOMAIN makes a
// missing handler deny too.

#include <map>
#include <set>
#include <string>
#include <zmq.hpp>

#include "consensusd/config/load.hpp"

namespace consensusd::daemon::curve {

// The ZAP domain of the peer links.
inline constexpr const char* kDomain = "consensusd";

// Whether this libzmq was built with CURVE (libsodium).
bool available();

config::CurveKeyPair generateKeyPair();

// The public key that belongs to a Z85 secret key ("" if it is not one).
std::string publicKeyOf(const std::string& secretKey);

// The ROUTER side: server keys, domain, fail closed. Throws zmq::error_t if
// this libzmq cannot enforce the domain.
void makeServer(zmq::socket_t& router, const config::CurveKeyPair& keys);
// A DEALER side: our key pair and the server's public key.
void makeClient(zmq::socket_t& dealer, const config::CurveKeyPair& keys,
                const std::string& serverPublicKey);

class ZapHandler {
 public:
  // `admitted`: Z85 public key -> node id, the id becomes the connection's
  // User-Id (read back per message with userIdOf).
  ZapHandler(zmq::context_t& context, std::map<std::string, std::string> admitted);

  zmq::socket_t& socket() { return socket_; }
  // The keys admitted from now on (a new graph); connections made stay.
  void admit(std::map<std::string, std::string> admitted) { admitted_ = std::move(admitted); }

  // Answers every waiting request without blocking. Denied keys are logged
  // once each (the first kMaxLoggedKeys of them: a stranger cycling through
  // keys must not grow memory); the handshake failure itself reaches the
  // ROUTER's monitor.
  void answer();

 private:
  zmq::socket_t socket_;
  std::map<std::string, std::string> admitted_;
  static constexpr std::size_t kMaxLoggedKeys = 1024;
  std::set<std::string> deniedKeys_;
};

// The User-Id the ZAP handler gave the connection a message came from ("" if none).
std::string userIdOf(const zmq::message_t& message);

}  // namespace consensusd::daemon::curve
