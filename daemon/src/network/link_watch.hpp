#pragma once
// A neighbour whose estimates take about as long as a round (or longer)
// sets the node's pace, or arrives too late to be mixed: said once per
// neighbour, with the figures, after three such estimates in a row.

#include <cstddef>
#include <map>
#include <string>

#include "network/chunk_receiver.hpp"

namespace consensusd::daemon {

class LinkWatch {
 public:
  explicit LinkWatch(std::size_t estimateBytes) : estimateBytes_(estimateBytes) {}
  // After a round of `round`: neighbour `node` (`id`) as its inflow stands.
  // True when this is what made the warning.
  bool observe(std::size_t node, const std::string& id, const Inflow& inflow,
               consensus::Duration round);
  void clear() { watches_.clear(); }  // a new graph: indices change

 private:
  struct Watch {
    consensus::Duration lastTransfer{};
    int slowInARow = 0;
    bool said = false;
  };
  std::size_t estimateBytes_;
  std::map<std::size_t, Watch> watches_;  // per in-neighbour
};

}  // namespace consensusd::daemon
