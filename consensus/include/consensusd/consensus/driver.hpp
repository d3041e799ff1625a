#pragma once
// The one order in which a driver advances a RoundEngine at time `now`:
// the daemon's engine loop, the simulator and the unit tests' network all
// call step() whenever something happened to a node (a message, its
// gradient, a wake-up) and do what it hands back, so the three cannot
// drift apart.
//
//   1. send the estimate an update made (publish: update), before the
//      round can end: the neighbours wait for it;
//   2. finish the round if its cut-off has come;
//   3. hand over the decisions symmetric mixing owes the neighbours
//      (before the record: telling them must not wait for a checkpoint);
//   4. report the finished round;
//   5. start the next round unless the driver holds (paused, stopping),
//      its estimate sent first (publish: start);
//   6. return when the engine next needs a step without a message (none:
//      it waits for a message or the gradient).
//
// `Driver` provides:
//   void decided(const Decision&);
//   void finished(const RoundRecord&);
//   bool mayStart();  // asked after finished(): a stop condition holds the start
//   void published(const RoundEngine<Scalar>::Publication&);  // to the out-neighbours
//   void started(RoundEngine<Scalar>::Start start);            // compute the update at x_k

#include <memory>
#include <optional>

#include "consensusd/consensus/round_engine.hpp"

namespace consensusd::consensus {

template <class Scalar, class Driver>
std::optional<Time> step(RoundEngine<Scalar>& engine, Time now, Driver& driver) {
  if (auto publication = engine.takePublication()) driver.published(*publication);
  std::optional<RoundRecord> record = engine.tryFinish(now);
  for (const Decision& decision : engine.takeDecisions()) driver.decided(decision);
  if (record) driver.finished(*record);
  if (driver.mayStart()) {
    if (auto start = engine.tryStart(now)) {
      if (start->publish) driver.published(*start);
      driver.started(std::move(*start));
    }
  }
  return engine.nextWakeup(now);
}

}  // namespace consensusd::consensus
