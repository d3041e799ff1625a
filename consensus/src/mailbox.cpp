#include "consensusd/consensus/mailbox.hpp"

#include <algorithm>

namespace consensusd::consensus {

template <class Scalar>
Mailbox<Scalar>::Mailbox(std::size_t depth, std::size_t dimension)
    : slots_(std::max<std::size_t>(depth, 1)) {
  for (Entry& slot : slots_) slot.values.resize(static_cast<Eigen::Index>(dimension));
}

template <class Scalar>
Receipt Mailbox<Scalar>::store(std::int64_t round, const Scalar* values, Time arrival,
                               std::int64_t oldestUseful) {
  if (round < oldestUseful) return Receipt::Stale;
  Entry* target = nullptr;
  for (Entry& slot : slots_) {
    if (slot.round == round) return Receipt::Duplicate;
    if (target == nullptr || slot.round < target->round) target = &slot;  // empty or oldest
  }
  if (target->round > round) return Receipt::Superseded;
  target->round = round;
  target->arrival = arrival;
  std::copy(values, values + target->values.size(), target->values.data());
  return Receipt::Stored;
}

template <class Scalar>
const typename Mailbox<Scalar>::Entry* Mailbox<Scalar>::newest() const {
  const Entry* best = nullptr;
  for (const Entry& slot : slots_) {
    if (slot.round >= 0 && (best == nullptr || slot.round > best->round)) best = &slot;
  }
  return best;
}

template <class Scalar>
const typename Mailbox<Scalar>::Entry* Mailbox<Scalar>::exact(std::int64_t round) const {
  for (const Entry& slot : slots_) {
    if (slot.round == round) return &slot;
  }
  return nullptr;
}

template <class Scalar>
void Mailbox<Scalar>::discardBefore(std::int64_t round) {
  for (Entry& slot : slots_) {
    if (slot.round >= 0 && slot.round < round) slot.round = -1;
  }
}

template <class Scalar>
void Mailbox<Scalar>::discardAfter(std::int64_t round) {
  for (Entry& slot : slots_) {
    if (slot.round > round) slot.round = -1;
  }
}

template class Mailbox<float>;
template class Mailbox<double>;

}  // namespace consensusd::consensus
