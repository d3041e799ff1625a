#include "node/deliver.hpp"

#include <cstring>

namespace consensusd::daemon {
namespace {

consensus::Presence presenceOf(const wire::Header& h) {
  if (h.kind == wire::Kind::Bye) return consensus::Presence::Left;
  const bool idle = h.kind == wire::Kind::Hello && (h.flags & wire::kHelloIdle) != 0;
  return idle ? consensus::Presence::Idle : consensus::Presence::Working;
}

}  // namespace

template <class Scalar>
consensus::Receipt deliver(consensus::RoundEngine<Scalar>& engine, const Inbound& message,
                           Eigen::Matrix<Scalar, Eigen::Dynamic, 1>& aligned, consensus::Time now) {
  const wire::Header& h = message.header;
  if (message.partial) return engine.onArriving(message.from, h.round, now);
  switch (h.kind) {
    case wire::Kind::Estimate: {
      const std::span<const std::byte> payload = message.payload;
      constexpr wire::Dtype kDtype =
          sizeof(Scalar) == 8 ? wire::Dtype::Float64 : wire::Dtype::Float32;
      if (h.dtype != kDtype)  // a compressed frame: onto the neighbour's copy
        return engine.onFrame(message.from, h.round, h.base, payload, now);
      const Scalar* values = reinterpret_cast<const Scalar*>(payload.data());
      if (reinterpret_cast<std::uintptr_t>(values) % alignof(Scalar) != 0) {
        aligned.resize(static_cast<Eigen::Index>(payload.size() / sizeof(Scalar)));
        std::memcpy(aligned.data(), payload.data(), payload.size());
        return engine.onEstimate(message.from, h.round, aligned.data(), now);  // copied
      }
      // Kept in place: the mailbox holds the received message (or the
      // neighbour's receive buffer), no copy.
      return engine.onEstimate(message.from, h.round, values, now, message.owner);
    }
    case wire::Kind::Decision:
      return engine.onDecision(message.from, h.round, h.flags == 1, now);
    case wire::Kind::Ready:  // the transport's own: never handed out
    case wire::Kind::Resync:
    case wire::Kind::Hello:
    case wire::Kind::Bye:
      // A keep-alive: the engine hears from the peer without an estimate.
      return engine.onKeepAlive(message.from, h.round, now, presenceOf(h));
  }
  return consensus::Receipt::NotNeighbor;
}

template consensus::Receipt deliver(consensus::RoundEngine<float>&, const Inbound&,
                                    Eigen::Matrix<float, Eigen::Dynamic, 1>&, consensus::Time);
template consensus::Receipt deliver(consensus::RoundEngine<double>&, const Inbound&,
                                    Eigen::Matrix<double, Eigen::Dynamic, 1>&, consensus::Time);

}  // namespace consensusd::daemon
