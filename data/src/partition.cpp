#include "consensusd/data/partition.hpp"

#include <algorithm>
#include <numeric>
#include <random>

#include "consensusd/data/random.hpp"

namespace consensusd::data {
namespace {

using Parts = std::vector<std::vector<std::size_t>>;

// Deals `order` into `nodes` consecutive near-equal parts.
Parts blocks(const std::vector<std::size_t>& order, std::size_t nodes) {
  Parts parts(nodes);
  for (std::size_t k = 0; k < nodes; ++k) {
    const std::size_t begin = order.size() * k / nodes;
    const std::size_t end = order.size() * (k + 1) / nodes;
    parts[k].assign(order.begin() + static_cast<std::ptrdiff_t>(begin),
                    order.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return parts;
}

void requireLabels(const Dataset& train, const char* kind) {
  if (!train.isClassification())
    throw DataError(std::string("partition: ") + kind + " needs class labels");
}

Parts shards(const Dataset& train, const PartitionOptions& options, std::mt19937_64& rng) {
  requireLabels(train, "shards");
  std::vector<std::size_t> byLabel(train.size());
  std::iota(byLabel.begin(), byLabel.end(), 0);
  shuffle(byLabel, rng);  // random order within each class
  std::stable_sort(byLabel.begin(), byLabel.end(),
                   [&](std::size_t a, std::size_t b) { return train.labels[a] < train.labels[b]; });
  const Parts pieces = blocks(byLabel, options.nodes * options.shardsPerNode);
  std::vector<std::size_t> owner(pieces.size());
  for (std::size_t s = 0; s < owner.size(); ++s) owner[s] = s % options.nodes;
  shuffle(owner, rng);
  Parts parts(options.nodes);
  for (std::size_t s = 0; s < pieces.size(); ++s) {
    parts[owner[s]].insert(parts[owner[s]].end(), pieces[s].begin(), pieces[s].end());
  }
  return parts;
}

Parts dirichlet(const Dataset& train, const PartitionOptions& options, std::mt19937_64& rng) {
  requireLabels(train, "dirichlet");
  std::vector<std::vector<std::size_t>> ofClass(static_cast<std::size_t>(train.classes));
  for (std::size_t i = 0; i < train.size(); ++i)
    ofClass[static_cast<std::size_t>(train.labels[i])].push_back(i);
  std::gamma_distribution<double> gamma(options.dirichletAlpha, 1.0);
  Parts parts(options.nodes);
  std::vector<double> share(options.nodes);
  for (auto& members : ofClass) {
    shuffle(members, rng);
    double total = 0;
    for (double& s : share) total += (s = gamma(rng));
    if (total <= 0) std::fill(share.begin(), share.end(), total = 1.0);
    double cumulative = 0;
    std::size_t begin = 0;
    for (std::size_t k = 0; k < options.nodes; ++k) {
      cumulative += share[k];
      const std::size_t end =
          k + 1 == options.nodes
              ? members.size()
              : static_cast<std::size_t>(cumulative / total * static_cast<double>(members.size()));
      parts[k].insert(parts[k].end(), members.begin() + static_cast<std::ptrdiff_t>(begin),
                      members.begin() + static_cast<std::ptrdiff_t>(std::max(begin, end)));
      begin = std::max(begin, end);
    }
  }
  for (auto& part : parts) {
    if (!part.empty()) continue;
    auto largest = std::max_element(parts.begin(), parts.end(), [](const auto& a, const auto& b) {
      return a.size() < b.size();
    });
    part.push_back(largest->back());
    largest->pop_back();
  }
  return parts;
}

}  // namespace

std::vector<std::vector<std::size_t>> partition(const Dataset& train,
                                                const PartitionOptions& options) {
  if (options.nodes == 0) throw DataError("partition: no nodes");
  if (train.size() < options.nodes) {
    throw DataError("partition: " + std::to_string(train.size()) + " samples cannot cover " +
                    std::to_string(options.nodes) + " nodes");
  }
  std::mt19937_64 rng(options.seed);
  std::vector<std::size_t> order(train.size());
  std::iota(order.begin(), order.end(), 0);
  Parts parts;
  switch (options.kind) {
    case PartitionKind::Iid:
      shuffle(order, rng);
      parts = blocks(order, options.nodes);
      break;
    case PartitionKind::Contiguous:
      parts = blocks(order, options.nodes);
      break;
    case PartitionKind::Shards:
      parts = shards(train, options, rng);
      break;
    case PartitionKind::Dirichlet:
      parts = dirichlet(train, options, rng);
      break;
  }
  for (auto& part : parts) std::sort(part.begin(), part.end());
  return parts;
}

std::vector<std::size_t> classHistogram(const Dataset& data,
                                        const std::vector<std::size_t>& indices) {
  std::vector<std::size_t> counts(static_cast<std::size_t>(std::max(data.classes, 0)), 0);
  for (const std::size_t i : indices) ++counts[static_cast<std::size_t>(data.labels[i])];
  return counts;
}

Dataset subset(const Dataset& data, const std::vector<std::size_t>& indices) {
  Dataset out;
  out.classes = data.classes;
  out.features.resize(data.features.rows(), static_cast<Eigen::Index>(indices.size()));
  if (data.targets.size() > 0) out.targets.resize(static_cast<Eigen::Index>(indices.size()));
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const auto j = static_cast<Eigen::Index>(indices[k]);
    out.features.col(static_cast<Eigen::Index>(k)) = data.features.col(j);
    if (data.isClassification()) out.labels.push_back(data.labels[indices[k]]);
    if (data.targets.size() > 0) out.targets[static_cast<Eigen::Index>(k)] = data.targets[j];
  }
  return out;
}

}  // namespace consensusd::data
