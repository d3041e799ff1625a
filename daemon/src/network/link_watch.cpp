#include "network/link_watch.hpp"

#include <spdlog/spdlog.h>

namespace consensusd::daemon {

bool LinkWatch::observe(std::size_t node, const std::string& id, const Inflow& inflow,
                        consensus::Duration round) {
  Watch& watch = watches_[node];
  if (inflow.transfer == watch.lastTransfer || watch.said) return false;  // no new estimate
  watch.lastTransfer = inflow.transfer;
  const double roundS = std::chrono::duration<double>(round).count();
  const double transferS = std::chrono::duration<double>(inflow.transfer).count();
  watch.slowInARow = transferS >= 0.8 * roundS ? watch.slowInARow + 1 : 0;
  if (watch.slowInARow < 3) return false;
  watch.said = true;
  const double megabytes = static_cast<double>(estimateBytes_) / 1e6;
  spdlog::warn(
      "the link from {} is the bottleneck: its estimates ({:.0f} MB) take {:.2f} s to arrive "
      "({:.0f} Mbit/s) and rounds {:.2f} s{}",
      id, megabytes, transferS, megabytes * 8 / transferS, roundS,
      transferS > roundS ? "; they arrive rounds late and are mixed only when the round waits"
                         : "");
  return true;
}

}  // namespace consensusd::daemon
