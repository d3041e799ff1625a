#include "consensusd/consensus/mailbox.hpp"

#include <algorithm>

namespace consensusd::consensus {

template <class Scalar>
Mailbox<Scalar>::Mailbox(std::size_t depth, std::size_t dimension)
    : dimension_(dimension), slots_(std::max<std::size_t>(depth, 1)) {}

template <class Scalar>
void Mailbox<Scalar>::clear(Entry& entry) {
  entry.round = -1;
  entry.values = nullptr;
  entry.owner.reset();  // a received message goes back now, not when the slot is reused
}

template <class Scalar>
Receipt Mailbox<Scalar>::store(std::int64_t round, const Scalar* values, Time arrival,
                               std::int64_t oldestUseful, std::shared_ptr<const void> owner) {
  if (round < oldestUseful) return Receipt::Stale;
  Entry* target = nullptr;
  for (Entry& slot : slots_) {
    if (slot.round == round) return Receipt::Duplicate;
    if (target == nullptr || slot.round < target->round) target = &slot;  // empty or oldest
  }
  if (target->round > round) return Receipt::Superseded;
  target->round = round;
  target->arrival = arrival;
  if (owner) {
    target->values = values;
    target->owner = std::move(owner);
  } else {
    target->storage.resize(static_cast<Eigen::Index>(dimension_));  // once: then reused
    std::copy(values, values + dimension_, target->storage.data());
    target->values = target->storage.data();
    target->owner.reset();
  }
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
    if (slot.round >= 0 && slot.round < round) clear(slot);
  }
}

template <class Scalar>
void Mailbox<Scalar>::discardAfter(std::int64_t round) {
  for (Entry& slot : slots_) {
    if (slot.round > round) clear(slot);
  }
}

template class Mailbox<float>;
template class Mailbox<double>;

}  // namespace consensusd::consensus
