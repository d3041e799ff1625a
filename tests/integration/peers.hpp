#pragma once
// Hand-made peers for a Cluster's nodes: raw ZeroMQ (optionally CURVE) and
// raw TCP, to send what a real consensusd never would.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "cluster.hpp"
#include "consensusd/daemon/wire.hpp"

namespace consensusd::testing {

// The hash a well-formed message from the cluster's topology carries, as
// `consensusctl topology info` reports it.
inline std::uint64_t topologyHash(const Cluster& cluster) {
  const auto info =
      runProcess({CONSENSUSCTL, "topology", "info", cluster.path("topology.yaml"), "--json"});
  return std::stoull(nlohmann::json::parse(info.out)["hash"].get<std::string>(), nullptr, 16);
}

// A CURVE client's keys (Z85): its own pair and the server's public key.
struct CurveClient {
  std::string publicKey;
  std::string secretKey;
  std::string serverKey;
};

// A raw ZeroMQ DEALER speaking to a node's ROUTER as `identity`.
struct Intruder {
  zmq::context_t context;
  zmq::socket_t socket{context, zmq::socket_type::dealer};
  Intruder(const std::string& endpoint, const std::string& identity,
           const std::optional<CurveClient>& curve = {}) {
    socket.set(zmq::sockopt::routing_id, identity);
    socket.set(zmq::sockopt::linger, 0);
    // A refused handshake removes the DEALER's only pipe: a send would then
    // wait for a peer forever.
    socket.set(zmq::sockopt::sndtimeo, 2000);
    if (curve) {
      socket.set(zmq::sockopt::curve_serverkey, curve->serverKey);
      socket.set(zmq::sockopt::curve_publickey, curve->publicKey);
      socket.set(zmq::sockopt::curve_secretkey, curve->secretKey);
    }
    socket.connect(endpoint);
  }
  // False when no connection would take the message within two seconds.
  bool send(const std::vector<std::string>& frames) {
    for (std::size_t i = 0; i < frames.size(); ++i) {
      if (!socket.send(zmq::buffer(frames[i]),
                       i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none))
        return false;
    }
    return true;
  }
};

inline std::string bytesOf(const std::array<std::byte, wire::kHeaderSize>& header) {
  return {reinterpret_cast<const char*>(header.data()), header.size()};
}

// A well-formed float32 estimate from node `sender` for `round`.
inline std::vector<std::string> estimateFrames(std::uint32_t sender, std::int64_t round,
                                               std::uint64_t topologyHash,
                                               const std::vector<float>& values) {
  wire::Header header;
  header.kind = wire::Kind::Estimate;
  header.sender = sender;
  header.round = round;
  header.dimension = values.size();
  header.topologyHash = topologyHash;
  header.payloadBytes = values.size() * 4;
  header.checksum = wire::checksum(values.data(), values.size() * 4);
  return {bytesOf(wire::encode(header)),
          std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4)};
}

inline std::string readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline std::string endpointOf(const Cluster& cluster, std::size_t i) {
  const std::string text = readBytes(cluster.path("topology.yaml"));
  std::size_t at = 0;
  for (std::size_t k = 0; k <= i; ++k) at = text.find("tcp://", at + (k > 0 ? 1 : 0));
  return text.substr(at, text.find('"', at) - at);
}

// A TCP connection to 127.0.0.1:`port`, or -1; the caller closes it.
inline int connectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A plain TCP connection (not ZMTP) to `endpoint` ("tcp://127.0.0.1:PORT"); the caller closes it.
inline int connectRawTcp(const std::string& endpoint) {
  const int fd = connectLoopback(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));
  if (fd < 0) throw std::runtime_error("cannot connect to " + endpoint);
  return fd;
}

inline void sendRawTcp(const std::string& endpoint, const std::string& bytes) {
  const int fd = connectRawTcp(endpoint);
  ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  ::close(fd);
}

}  // namespace consensusd::testing
