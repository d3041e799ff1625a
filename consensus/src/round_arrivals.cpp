// What neighbours send, as the round engine takes it: estimates (whole, or
// compressed frames onto the sender's public copy), parts still arriving,
// decisions and keep-alives, each admitted only from a neighbour and at a
// plausible round. Starting and ending rounds are round_engine.cpp and
// round_end.cpp.

#include <algorithm>
#include <utility>

#include "consensusd/consensus/codec.hpp"
#include "consensusd/consensus/round_engine.hpp"
#include "round_arithmetic.hpp"

namespace consensusd::consensus {

template <class Scalar>
bool RoundEngine<Scalar>::plausibleRound(Slot& slot, std::int64_t round, Time now) {
  if (round < 0) return false;
  const std::int64_t limit = addSaturating(round_, slot.reach);
  if (round <= limit) {
    slot.aheadSince.reset();
    // Back in reach: what was believed beyond it (a liar's claim while the
    // real sender was away) stops counting now that the sender speaks.
    if (slot.newestRound > limit) {
      slot.mailbox.discardAfter(limit);
      const auto* newest = slot.mailbox.newest();
      slot.newestRound = newest != nullptr ? newest->round : -1;
    }
    return true;
  }
  const bool fresh = !slot.aheadSince || now - slot.aheadLast > options_.peerTimeout;
  slot.aheadLast = now;
  if (fresh) {
    slot.aheadSince = now;  // a new run (an old one went silent)
    return false;
  }
  return now - *slot.aheadSince >= options_.peerTimeout / 2;
}

template <class Scalar>
void RoundEngine<Scalar>::heard(Slot& slot, Time now) {
  if (now - slot.lastHeard < silenceLimit(slot)) {
    slot.lastHeard = now;
    return;
  }
  if (slot.revivalStart && now > *slot.revivalStart &&
      now - *slot.revivalStart < options_.peerTimeout) {
    slot.lastHeard = now;
    slot.revivalStart.reset();
    return;
  }
  slot.revivalStart = now;
}

template <class Scalar>
Receipt RoundEngine<Scalar>::onEstimate(std::size_t node, std::int64_t round, const Scalar* values,
                                        Time now, std::shared_ptr<const void> owner) {
  const auto admitted = admit(node, round, now);
  if (const auto* refused = std::get_if<Receipt>(&admitted)) return *refused;
  const std::size_t index = std::get<std::size_t>(admitted);
  Slot& slot = slots_[index];
  if (slot.arriving && *slot.arriving <= round) slot.arriving.reset();  // here whole
  if (compressed()) {  // a keyframe: whatever we held, the sender's copy is this
    std::copy(values, values + slot.copy.size(), slot.copy.data());
    slot.copyRound = round;
    return holdCopy(index, round, now);
  }
  const Receipt receipt = slot.mailbox.store(round, values, now, oldestUseful(), std::move(owner));
  return noteStored(index, round, values, receipt, now);
}

template <class Scalar>
Receipt RoundEngine<Scalar>::onFrame(std::size_t node, std::int64_t round, std::int64_t base,
                                     std::span<const std::byte> frame, Time now) {
  if (!compressed()) return Receipt::Corrupt;
  const auto admitted = admit(node, round, now);
  if (const auto* refused = std::get_if<Receipt>(&admitted)) return *refused;
  const std::size_t index = std::get<std::size_t>(admitted);
  Slot& slot = slots_[index];
  if (slot.arriving && *slot.arriving <= round) slot.arriving.reset();
  if (slot.copyRound >= 0 && round <= slot.copyRound) {  // applied already (a replay)
    ++slot.counters.duplicate;
    return Receipt::Duplicate;
  }
  if (slot.copyRound < 0 || base != slot.copyRound) {
    ++slot.counters.gap;
    return Receipt::Gap;
  }
  switch (applyDifference<Scalar>(options_.compression, frame, valuesOf(slot.copy))) {
    case FrameCheck::Applied:
      slot.copyRound = round;
      return holdCopy(index, round, now);
    case FrameCheck::Overflow:  // the copy is no longer the sender's: nothing of it is mixed
      slot.copyRound = -1;
      slot.mailbox.discardAfter(-1);
      break;
    case FrameCheck::Malformed:  // untouched, but the sender's copy moved on without us
      break;
  }
  ++slot.counters.corrupt;
  return Receipt::Corrupt;
}

template <class Scalar>
Receipt RoundEngine<Scalar>::holdCopy(std::size_t index, std::int64_t round, Time now) {
  Slot& slot = slots_[index];
  // Every entry points at the one copy: only its newest round is true.
  slot.mailbox.discardAfter(-1);
  // Held in place (an owner without a control block): the slot outlives the entry.
  const std::shared_ptr<const void> inPlace(std::shared_ptr<const void>(), slot.copy.data());
  const Receipt receipt = slot.mailbox.store(round, slot.copy.data(), now, oldestUseful(), inPlace);
  return noteStored(index, round, slot.copy.data(), receipt, now);
}

template <class Scalar>
Receipt RoundEngine<Scalar>::noteStored(std::size_t index, std::int64_t round, const Scalar* values,
                                        Receipt receipt, Time now) {
  Slot& slot = slots_[index];
  if (receipt == Receipt::Stored || receipt == Receipt::Stale) {
    // Too old to mix or not, it completes the record of the rounds it was due
    // in: a neighbour a round behind is late, not absent.
    arrivals_.observeLate(
        index,
        options_.mixRound == MixRound::Newest ? addSaturating(round, options_.staleness) : round,
        now);
    // A neighbour not yet in is the one whose distance the dynamic rule
    // weighs against the wait (consensus pull term), from its newest
    // estimate. One kept is measured later, in the mix's pass if it is
    // mixed; one not kept, now.
    if (measuresDistances()) {
      if (receipt == Receipt::Stored) {
        slot.distanceDue = round;
      } else {
        slot.distanceDue.reset();
        slot.distanceSq =
            squaredDistance(values, params_->data(), static_cast<std::size_t>(params_->size()));
      }
    }
  }
  switch (receipt) {
    case Receipt::Stored:
      ++(round < round_ ? slot.counters.late : slot.counters.onTime);
      break;
    case Receipt::Duplicate:
      ++slot.counters.duplicate;
      break;
    case Receipt::Stale:
      ++slot.counters.stale;
      break;
    case Receipt::Superseded:
      ++slot.counters.superseded;
      break;
    case Receipt::NotNeighbor:
    case Receipt::Implausible:
    case Receipt::Gap:
    case Receipt::Corrupt:
      break;
  }
  return receipt;
}

template <class Scalar>
Receipt RoundEngine<Scalar>::onDecision(std::size_t node, std::int64_t round, bool usedMine,
                                        Time now) {
  const std::optional<std::size_t> index = slotOf(node);
  if (!index) return Receipt::NotNeighbor;
  Slot& slot = slots_[*index];
  // The sender's round: the same horizon, but no run (decisions come after estimates).
  if (round < 0 || round > addSaturating(round_, slot.reach)) return Receipt::Implausible;
  if (round < round_) return Receipt::Stale;
  heard(slot, now);
  slot.decisions[round] = usedMine;
  while (slot.decisions.size() > options_.mailboxDepth + 1)
    slot.decisions.erase(slot.decisions.begin());
  return Receipt::Stored;
}

template <class Scalar>
Receipt RoundEngine<Scalar>::onKeepAlive(std::size_t node, std::int64_t round, Time now,
                                         Presence presence) {
  const auto admitted = admit(node, round, now);
  if (const auto* refused = std::get_if<Receipt>(&admitted)) return *refused;
  slots_[std::get<std::size_t>(admitted)].presence = presence;
  return Receipt::Stored;
}

template <class Scalar>
Receipt RoundEngine<Scalar>::onArriving(std::size_t node, std::int64_t round, Time now) {
  const auto admitted = admit(node, round, now);
  if (const auto* refused = std::get_if<Receipt>(&admitted)) return *refused;
  Slot& slot = slots_[std::get<std::size_t>(admitted)];
  slot.arriving = round;
  slot.arrivingAt = now;
  return Receipt::Stored;
}

template <class Scalar>
std::variant<std::size_t, Receipt> RoundEngine<Scalar>::admit(std::size_t node, std::int64_t round,
                                                              Time now) {
  const std::optional<std::size_t> index = slotOf(node);
  if (!index) return Receipt::NotNeighbor;
  Slot& slot = slots_[*index];
  if (!plausibleRound(slot, round, now)) return Receipt::Implausible;
  heard(slot, now);
  slot.newestRound = std::max(slot.newestRound, round);
  return *index;
}

// The header declares the engine instantiated elsewhere (extern template):
// what is defined here is instantiated here.
template Receipt RoundEngine<float>::onEstimate(std::size_t, std::int64_t, const float*, Time,
                                                std::shared_ptr<const void>);
template Receipt RoundEngine<float>::onFrame(std::size_t, std::int64_t, std::int64_t,
                                             std::span<const std::byte>, Time);
template Receipt RoundEngine<float>::onDecision(std::size_t, std::int64_t, bool, Time);
template Receipt RoundEngine<float>::onKeepAlive(std::size_t, std::int64_t, Time, Presence);
template Receipt RoundEngine<float>::onArriving(std::size_t, std::int64_t, Time);
template Receipt RoundEngine<double>::onEstimate(std::size_t, std::int64_t, const double*, Time,
                                                 std::shared_ptr<const void>);
template Receipt RoundEngine<double>::onFrame(std::size_t, std::int64_t, std::int64_t,
                                              std::span<const std::byte>, Time);
template Receipt RoundEngine<double>::onDecision(std::size_t, std::int64_t, bool, Time);
template Receipt RoundEngine<double>::onKeepAlive(std::size_t, std::int64_t, Time, Presence);
template Receipt RoundEngine<double>::onArriving(std::size_t, std::int64_t, Time);
template std::variant<std::size_t, Receipt> RoundEngine<float>::admit(std::size_t, std::int64_t,
                                                                      Time);
template bool RoundEngine<float>::plausibleRound(Slot&, std::int64_t, Time);
template void RoundEngine<float>::heard(Slot&, Time);
template Receipt RoundEngine<float>::noteStored(std::size_t, std::int64_t, const float*, Receipt,
                                                Time);
template Receipt RoundEngine<float>::holdCopy(std::size_t, std::int64_t, Time);
template std::variant<std::size_t, Receipt> RoundEngine<double>::admit(std::size_t, std::int64_t,
                                                                       Time);
template bool RoundEngine<double>::plausibleRound(Slot&, std::int64_t, Time);
template void RoundEngine<double>::heard(Slot&, Time);
template Receipt RoundEngine<double>::noteStored(std::size_t, std::int64_t, const double*, Receipt,
                                                 Time);
template Receipt RoundEngine<double>::holdCopy(std::size_t, std::int64_t, Time);

}  // namespace consensusd::consensus
