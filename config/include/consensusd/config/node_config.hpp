#pragma once
// A node's configuration (docs/design.md §5), after validation. Plain values with
// units in the names; later modules turn them into their own parameter types.
// Every key, its default and its range: config/README.md (and schemaKeys()).

#include <cstdint>
#include <string>
#include <vector>

namespace consensusd::config {

struct NodeConfig {
  struct Node {
    std::string id;
    std::string bind;  // "" = the topology endpoint
  } node;
  struct Topology {
    std::string file;
    bool watch = false;  // apply the file when it changes, as on SIGHUP
  } topology;
  struct Data {
    std::string dataset = "fashion-mnist";
    std::string path = "/usr/share/datasets/fashion-mnist";
    std::string testPath;
    double testFraction = 0.2;
    bool csvHeader = false;
    std::int64_t labelColumn = 0;
    std::string partition = "iid";
    std::int64_t shardsPerNode = 2;
    double dirichletAlpha = 0.5;
    std::string scaling = "unit";
    std::int64_t seed = 1;
  } data;
  struct Model {
    std::string kind = "softmax";
    std::vector<std::int64_t> hidden{256};
    std::int64_t dimension = 0;  // kind: external or none
    std::string dtype = "float32";
    std::int64_t initSeed = 1;
  } model;
  struct Train {
    std::int64_t batchSize = 32;
    double learningRate = 0.05;
    std::string schedule = "constant";
    std::int64_t stepEveryRounds = 1000;
    double stepFactor = 0.5;
    double momentum = 0.0;
    std::string outer = "plain";
    double outerLearningRate = 0.7;
    double outerMomentum = 0.9;
    double weightDecay = 0.0;
    std::int64_t rounds = 1000;
    double untilAccuracy = 0.0;
    double maxTimeS = 0.0;
    std::int64_t evalEveryRounds = 50;
  } train;
  struct Consensus {
    std::string policy = "dynamic";
    std::int64_t backups = 1;
    double timeoutMs = 20.0;
    double quantile = 0.5;
    std::int64_t minResponders = 1;
    std::int64_t maxResponders = 0;  // 0: the node's degree
    std::string mixRound = "newest";
    std::string publish = "start";
    std::string mix = "renormalize";
    std::string robust = "none";
    std::int64_t trim = 1;
    double clipRadius = 0.0;  // 0: the median distance of the round's responders
    std::string compression = "none";
    double consensusStep = 1.0;
    std::int64_t staleness = 0;
    std::int64_t maxLead = 20;
    bool roundSkipping = true;
    bool dynamicPull = true;
    bool dynamicNoise = false;
    bool dynamicHeterogeneity = false;
    double dynamicTieMargin = 0.05;
    std::int64_t skipAhead = 2;
    std::int64_t mailboxDepth = 4;
    double peerTimeoutMs = 3000.0;
    double hardDeadlineMs = 10000.0;
    std::int64_t warmupRounds = 2;
    std::int64_t windowRounds = 50;
  } consensus;
  struct Straggler {
    std::string kind = "none";
    double delayMs = 0.0;
    double meanMs = 0.0;
    double paretoShape = 1.2;
    double slowProbability = 0.1;
    double slowFactor = 20.0;
    double baseComputeMs = 0.0;
    std::int64_t fromRound = 0;
    std::int64_t toRound = 0;  // 0: until the end
    double linkDelayMs = 0.0;
    std::int64_t seed = 1;
  } straggler;
  struct Status {
    std::string socket;       // "": the topology's status path, else /run/consensusd/<id>.sock
    std::string http;         // "": off; else HOST:PORT on loopback
    bool httpRemote = false;  // status.http may bind a non-loopback address
  } status;
  struct Trainer {
    std::string socket;  // "": next to the status socket
    std::string group;   // "": the daemon's user only
  } trainer;
  struct Checkpoint {
    std::string dir;  // "": /var/lib/consensusd/<id>
    std::int64_t everyRounds = 100;
    std::int64_t keep = 2;
  } checkpoint;
  struct Security {
    bool curve = false;
    std::string secretKeyFile;
  } security;
  struct Log {
    std::string level = "info";
    std::string metricsFile;
    double progressEveryS = 5.0;
  } log;
};

}  // namespace consensusd::config
