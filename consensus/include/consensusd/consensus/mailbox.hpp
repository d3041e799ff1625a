#pragma once
// What a node has received from one neighbour: a short ring of its recent
// estimates (round, arrival time, values), so memory stays bounded at depth
// x dimension per neighbour whatever the peer sends. An estimate whose
// buffer comes with an owner (the received message) is kept in place, not
// copied; one without is copied into the entry's own storage.

#include <Eigen/Core>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "consensusd/consensus/options.hpp"

namespace consensusd::consensus {

// Why an arriving message was kept or not. `Implausible`: a round the
// sender cannot honestly have reached (RoundEngine, docs/protocol.md).
// `Gap` and `Corrupt` concern compressed frames (RoundEngine::onFrame): the
// frame does not continue the copy held, or does not decode onto it; either
// way the sender must send its copy whole (a keyframe).
enum class Receipt { Stored, Duplicate, Stale, Superseded, NotNeighbor, Implausible, Gap, Corrupt };

template <class Scalar>
class Mailbox {
 public:
  using Vector = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;

  struct Entry {
    std::int64_t round = -1;  // -1: empty slot
    Time arrival{};
    const Scalar* values = nullptr;     // dimension values: in `owner`'s buffer, or `storage`
    std::shared_ptr<const void> owner;  // keeps a buffer held in place alive
    Vector storage;                     // a copied estimate
  };

  Mailbox(std::size_t depth, std::size_t dimension);

  // Keeps (round, values) unless it is a duplicate, older than `oldestUseful`
  // (stale), or older than everything the ring holds (superseded). With an
  // `owner`, the values stay where they are while the entry holds it.
  Receipt store(std::int64_t round, const Scalar* values, Time arrival, std::int64_t oldestUseful,
                std::shared_ptr<const void> owner = {});

  // Newest entry, if any.
  const Entry* newest() const;
  // The entry for exactly `round`, if still held.
  const Entry* exact(std::int64_t round) const;

  // Drops entries older than `round`: they can never be used again.
  void discardBefore(std::int64_t round);
  // Drops entries newer than `round` (claims found implausible later).
  void discardAfter(std::int64_t round);

 private:
  static void clear(Entry& entry);

  std::size_t dimension_;
  std::vector<Entry> slots_;
};

extern template class Mailbox<float>;
extern template class Mailbox<double>;

}  // namespace consensusd::consensus
