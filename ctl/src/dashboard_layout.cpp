#include "dashboard_layout.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>
#include <random>
#include <set>
#include <utility>

namespace consensusd::cli {
namespace {

using Adjacency = std::vector<std::set<std::size_t>>;

Adjacency undirected(const topology::Topology& graph) {
  Adjacency out(graph.size());
  for (const topology::Edge& e : graph.edges()) {
    if (e.from == e.to) continue;
    out[e.from].insert(e.to);
    out[e.to].insert(e.from);
  }
  return out;
}

// The nodes in cycle order if the graph is one cycle through all of them.
std::optional<std::vector<std::size_t>> cycleOrder(const Adjacency& adjacent) {
  const std::size_t n = adjacent.size();
  if (n < 3) return std::nullopt;
  for (const auto& neighbours : adjacent)
    if (neighbours.size() != 2) return std::nullopt;
  std::vector<std::size_t> order{0};
  std::size_t previous = 0;
  std::size_t at = *adjacent[0].begin();
  while (at != 0) {
    if (order.size() == n) return std::nullopt;
    order.push_back(at);
    const std::size_t next =
        *adjacent[at].begin() == previous ? *adjacent[at].rbegin() : *adjacent[at].begin();
    previous = at;
    at = next;
  }
  if (order.size() != n) return std::nullopt;  // several cycles
  return order;
}

// rows x cols (both >= 3) whose torus on the nodes' order is exactly this graph.
std::optional<std::pair<std::size_t, std::size_t>> torusShape(const Adjacency& adjacent) {
  const std::size_t n = adjacent.size();
  for (std::size_t rows = 3; rows * 3 <= n; ++rows) {
    if (n % rows != 0) continue;
    const std::size_t cols = n / rows;
    bool matches = true;
    for (std::size_t i = 0; i < n && matches; ++i) {
      const std::size_t r = i / cols;
      const std::size_t c = i % cols;
      const std::set<std::size_t> expected{
          r * cols + (c + 1) % cols, r * cols + (c + cols - 1) % cols, ((r + 1) % rows) * cols + c,
          ((r + rows - 1) % rows) * cols + c};
      matches = adjacent[i] == expected;
    }
    if (matches) return std::pair{rows, cols};
  }
  return std::nullopt;
}

// Fruchterman-Reingold from a circle, a fixed number of cooling steps, with
// a little seeded jitter so symmetric graphs do not stay stuck on the circle.
void forceLayout(const Adjacency& adjacent, Layout& layout) {
  const std::size_t n = adjacent.size();
  std::mt19937 random(20261205);
  std::uniform_real_distribution<double> jitter(-0.01, 0.01);
  for (std::size_t i = 0; i < n; ++i) {
    const double angle = 2 * std::numbers::pi * static_cast<double>(i) / static_cast<double>(n);
    layout.x[i] = 0.5 + 0.4 * std::cos(angle) + jitter(random);
    layout.y[i] = 0.5 + 0.4 * std::sin(angle) + jitter(random);
  }
  const double k = std::sqrt(1.0 / static_cast<double>(n));  // the ideal edge length
  constexpr int kSteps = 300;
  std::vector<double> dx(n);
  std::vector<double> dy(n);
  for (int step = 0; step < kSteps; ++step) {
    std::fill(dx.begin(), dx.end(), 0.0);
    std::fill(dy.begin(), dy.end(), 0.0);
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = i + 1; j < n; ++j) {
        const double ex = layout.x[i] - layout.x[j];
        const double ey = layout.y[i] - layout.y[j];
        const double d = std::max(std::hypot(ex, ey), 1e-6);
        double force = k * k / d;                           // repulsion
        if (adjacent[i].count(j) != 0) force -= d * d / k;  // attraction along edges
        dx[i] += ex / d * force;
        dy[i] += ey / d * force;
        dx[j] -= ex / d * force;
        dy[j] -= ey / d * force;
      }
    }
    const double temperature = 0.1 * (1.0 - static_cast<double>(step) / kSteps) + 1e-4;
    for (std::size_t i = 0; i < n; ++i) {
      const double d = std::max(std::hypot(dx[i], dy[i]), 1e-12);
      const double move = std::min(d, temperature);
      layout.x[i] += dx[i] / d * move;
      layout.y[i] += dy[i] / d * move;
    }
  }
  // Into [0.05, 0.95] on both axes, keeping the aspect.
  const auto [minX, maxX] = std::minmax_element(layout.x.begin(), layout.x.end());
  const auto [minY, maxY] = std::minmax_element(layout.y.begin(), layout.y.end());
  const double x0 = *minX;
  const double y0 = *minY;
  const double span = std::max({*maxX - x0, *maxY - y0, 1e-9});
  for (std::size_t i = 0; i < n; ++i) {
    layout.x[i] = 0.05 + 0.9 * (layout.x[i] - x0) / span;
    layout.y[i] = 0.05 + 0.9 * (layout.y[i] - y0) / span;
  }
}

}  // namespace

Layout layoutGraph(const topology::Topology& graph) {
  const std::size_t n = graph.size();
  Layout layout{"force", std::vector<double>(n, 0.5), std::vector<double>(n, 0.5)};
  if (n <= 1) return layout;
  const Adjacency adjacent = undirected(graph);
  if (const auto order = cycleOrder(adjacent)) {
    layout.kind = "ring";
    for (std::size_t k = 0; k < n; ++k) {
      // Clockwise from the top.
      const double angle = 2 * std::numbers::pi * static_cast<double>(k) / static_cast<double>(n);
      layout.x[(*order)[k]] = 0.5 + 0.45 * std::sin(angle);
      layout.y[(*order)[k]] = 0.5 - 0.45 * std::cos(angle);
    }
  } else if (const auto shape = torusShape(adjacent)) {
    layout.kind = "grid";
    const auto [rows, cols] = *shape;
    for (std::size_t i = 0; i < n; ++i) {
      layout.x[i] = 0.05 + 0.9 * static_cast<double>(i % cols) / static_cast<double>(cols - 1);
      layout.y[i] = 0.05 + 0.9 * static_cast<double>(i / cols) / static_cast<double>(rows - 1);
    }
  } else {
    forceLayout(adjacent, layout);
  }
  return layout;
}

}  // namespace consensusd::cli
