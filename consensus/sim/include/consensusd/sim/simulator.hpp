#pragma once
// The consensus core's second driver (docs/design.md §9): N RoundEngines on a
// virtual clock, discrete events, real gradients on real data. Compute takes
// `compute` of virtual time plus each node's straggler delay; a message takes
// latency + size / bandwidth. Nothing of the round is re-implemented here:
// the engines decide, mix and step exactly as in the daemon.

#include <optional>
#include <vector>

#include "consensusd/consensus/options.hpp"
#include "consensusd/consensus/straggler.hpp"
#include "consensusd/data/dataset.hpp"
#include "consensusd/data/model.hpp"
#include "consensusd/data/optimizer.hpp"
#include "consensusd/topology/topology.hpp"

namespace consensusd::sim {

using consensus::Duration;

// Every link's latency and bandwidth; with `spread` > 0, each link is s
// times slower than that (latency x s, bandwidth / s, both ways), s =
// exp(spread Z) with Z standard normal, drawn once per link from the run's
// seed: a log-normal network, some links several times faster, some slower.
//
// A node with a download rate receives every estimate through it, one after
// another (first come, first served), as a node whose veth the kernel holds
// to that rate (scripts/netns-testbed --rate): an estimate arrives once
// the ones before it are in and its bytes have passed at that rate. Such a
// node's links are then that rate, not `bytesPerSecond`.
struct LinkModel {
  Duration latency{std::chrono::microseconds(100)};
  double bytesPerSecond = 1.25e9;              // 10 Gbit/s
  double spread = 0;                           // sigma of ln(s)
  std::vector<double> downloadBytesPerSecond;  // per node; 0 or missing: none
  // What an estimate weighs on the wire; 0: the model's size. Big models'
  // links with a small model's gradients (the exchange's timing only).
  std::size_t estimateBytes = 0;
};

// A node that trains honestly but sends its neighbours garbage instead of
// its estimate (consensus.robust): -scale * x, or x + scale everywhere.
enum class Attack { SignFlip, Shift };
struct Attacker {
  std::size_t node = 0;
  Attack attack = Attack::SignFlip;
  double scale = 1.0;
};

struct SimOptions {
  consensus::EngineOptions engine;
  data::Schedule schedule;
  double momentum = 0.0;
  data::ModelOptions model;
  std::uint64_t initSeed = 1;                       // the same initial parameters on every node
  std::uint64_t seed = 1;                           // minibatch order and straggler draws
  Duration compute{std::chrono::milliseconds(10)};  // one gradient, virtual
  // Per node, the straggler models whose delays add up (each only in its own
  // from_round..to_round window, so a node can switch regime); empty: none.
  std::vector<std::vector<consensus::StragglerSpec>> stragglers;
  LinkModel link;
  std::vector<Attacker> attackers;
  Duration sampleEvery{std::chrono::milliseconds(500)};
  Duration maxTime{std::chrono::seconds(60)};
  double stopAtAccuracy = 0.0;  // end once the average model reaches it; 0: run to maxTime
  // Min/max accuracy over nodes costs one evaluation per node per sample: on
  // this many test samples (0: skip it, for large N).
  std::size_t nodeEvalSamples = 2000;
  // Threads computing gradients (the event loop's included); the run is the
  // same for any count.
  std::size_t threads = 1;
};

// One row of the per-run CSV.
struct Sample {
  double timeS = 0;
  double meanRound = 0;
  // Minibatch loss, smoothed per node, averaged over the nodes whose first
  // gradient is in (NaN before).
  double meanLoss = 0;
  double accuracy = 0;     // of the network-average model, on the test set
  double minAccuracy = 0;  // over nodes (nodeEvalSamples test samples)
  double maxAccuracy = 0;
  double consensusDistance = 0;  // mean over nodes of ||x_i - x_bar||
  double meanBackups = 0;  // degree - neighbours mixed, mean over the rounds since the last row
  // What the policy decided over those rounds: the count m it waited for
  // (mean), and the share of rounds its time cut-off or the hard deadline
  // ended (the rest ended on the count).
  double meanTarget = 0;
  double timeoutShare = 0;
  double deadlineShare = 0;
  // Estimate bytes sent per node so far (frames, keyframes, whole estimates).
  double sentBytesPerNode = 0;
  // The same per training sample (B per round; 0 before the first round).
  double sentBytesPerSample = 0;
};

struct SimResult {
  std::vector<Sample> samples;
  std::uint64_t events = 0;
  std::int64_t rounds = 0;                  // finished, all nodes
  std::uint64_t bytesSent = 0;              // estimates' bytes (frames, keyframes), all nodes
  std::vector<std::int64_t> nodeRounds;     // each node's round at the end
  std::vector<Eigen::VectorXf> nodeParams;  // each node's parameters at the end
};

SimResult simulate(const topology::Topology& topology, const data::TrainTest& data,
                   const std::vector<data::Dataset>& shares, const SimOptions& options);

// The baseline users run instead (synchronous data parallelism, torch
// DDP's all-reduce): every node computes a gradient at the same x on its
// share, all wait for the slowest, the gradients are averaged exactly by a
// ring all-reduce (2(N-1) steps, each the slowest ring link's latency plus
// its slow link delay plus 1/N of the estimate at its rate), and one SGD
// step (the same schedule and momentum) is taken. The same shares,
// minibatch draws, stragglers and links as `simulate`; the topology only
// gives N and the ring's order. Samples as `simulate`'s (distance 0,
// m = N - 1, no backups).
SimResult simulateSynchronous(const topology::Topology& topology, const data::TrainTest& data,
                              const std::vector<data::Dataset>& shares, const SimOptions& options);

// How many times slower than `link` the link between nodes a and b is in a
// run with this seed: exp(spread Z), the same both ways.
double linkSlowness(const LinkModel& link, std::uint64_t seed, std::size_t a, std::size_t b);

// The first sample time at which accuracy reaches `target`, and the same on
// accuracies smoothed over `window` samples (steadier across seeds).
std::optional<double> firstCrossing(const std::vector<Sample>& samples, double target,
                                    std::size_t window = 1);

}  // namespace consensusd::sim
