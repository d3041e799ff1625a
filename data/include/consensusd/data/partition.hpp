#pragma once
// Splitting a training set across the nodes of a topology. Deterministic
// from the seed; every sample lands on exactly one node; no node is empty.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "consensusd/data/dataset.hpp"
#include "consensusd/data/names.hpp"

namespace consensusd::data {

enum class PartitionKind { Iid, Contiguous, Shards, Dirichlet };
inline constexpr NameTable<PartitionKind, 4> kPartitionKinds{
    {{PartitionKind::Iid, "iid"},
     {PartitionKind::Contiguous, "contiguous"},
     {PartitionKind::Shards, "shards"},
     {PartitionKind::Dirichlet, "dirichlet"}}};

struct PartitionOptions {
  PartitionKind kind = PartitionKind::Iid;
  std::size_t nodes = 1;
  std::size_t shardsPerNode = 2;  // Shards: classes per node
  double dirichletAlpha = 0.5;    // Dirichlet: concentration
  std::uint64_t seed = 1;
};

// Sample indices of each node, each list sorted.
// - Iid: a seeded shuffle dealt in near-equal parts.
// - Contiguous: near-equal blocks in file order.
// - Shards: samples sorted by label, cut into nodes * shardsPerNode equal
//   shards, each node gets shardsPerNode shards at random (so about that
//   many classes; McMahan et al. 2017).
// - Dirichlet: for each class, proportions over nodes ~ Dir(alpha).
//   A node left empty takes one sample from the largest node.
std::vector<std::vector<std::size_t>> partition(const Dataset& train,
                                                const PartitionOptions& options);

// Samples of each class among `indices` (the status socket shows this).
std::vector<std::size_t> classHistogram(const Dataset& data,
                                        const std::vector<std::size_t>& indices);

// The columns `indices` of `data`, in that order.
Dataset subset(const Dataset& data, const std::vector<std::size_t>& indices);

}  // namespace consensusd::data
