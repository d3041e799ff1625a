// The config schema: every key once, with its type, range and one line of
// documentation. Reading, `--set`, `consensusd --print-config` and the
// README check all come from this table.

#include <charconv>
#include <limits>
#include <optional>

#include "consensusd/config/load.hpp"
#include "consensusd/config/params.hpp"

namespace consensusd::config {
namespace {

using schema::Source;
using schema::YamlNode;

constexpr std::int64_t kMaxInt = std::numeric_limits<std::int64_t>::max();
constexpr double kHuge = 1e12;

std::string showDouble(double value) {
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  std::string text(buffer, result.ptr);
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

std::string showString(const std::string& value) {
  std::string out = "\"";
  for (const char c : value) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// "[lo, hi]" or "[lo, inf)", appended piece by piece: g++ 12 at -O2 warns
// (-Wrestrict, a false positive) on "[" + std::string.
std::string rangeText(const std::string& low, const std::optional<std::string>& high) {
  std::string text = "[";
  text += low;
  text += ", ";
  text += high ? *high : std::string("inf");
  text += high ? "]" : ")";
  return text;
}

template <class Ref>
Key integer(std::string path, Ref ref, std::int64_t min, std::int64_t max, std::string doc) {
  const std::string range = rangeText(
      std::to_string(min), max == kMaxInt ? std::nullopt : std::optional(std::to_string(max)));
  return {path,
          "integer",
          range,
          std::move(doc),
          [=](NodeConfig& c, const Source& s, const YamlNode& n) {
            ref(c) = schema::readInt(s, n, path, min, max);
          },
          [=](const NodeConfig& c) { return std::to_string(ref(c)); },
          {}};
}

// An integer, or the word `auto` (stored as kAuto: decided at run time).
template <class Ref>
Key integerOrAuto(std::string path, Ref ref, std::int64_t min, std::int64_t max, std::string doc) {
  Key key = integer(path, ref, min, max, std::move(doc));
  key.type = "integer | auto";
  key.read = [=](NodeConfig& c, const Source& s, const YamlNode& n) {
    const bool word = n.kind == schema::NodeKind::Scalar && n.scalar == kAuto;
    ref(c) = word ? kAutoDimension : schema::readInt(s, n, path, min, max);
  };
  key.show = [=](const NodeConfig& c) {
    return ref(c) == kAutoDimension ? std::string(kAuto) : std::to_string(ref(c));
  };
  return key;
}

template <class Ref>
Key number(std::string path, Ref ref, double min, double max, std::string doc) {
  const std::string range =
      rangeText(showDouble(min), max >= kHuge ? std::nullopt : std::optional(showDouble(max)));
  return {path,
          "number",
          range,
          std::move(doc),
          [=](NodeConfig& c, const Source& s, const YamlNode& n) {
            ref(c) = schema::readDouble(s, n, path, min, max);
          },
          [=](const NodeConfig& c) { return showDouble(ref(c)); },
          {}};
}

template <class Ref>
Key flag(std::string path, Ref ref, std::string doc) {
  return {path,
          "boolean",
          "true | false",
          std::move(doc),
          [=](NodeConfig& c, const Source& s, const YamlNode& n) {
            ref(c) = schema::readBool(s, n, path);
          },
          [=](const NodeConfig& c) { return std::string(ref(c) ? "true" : "false"); },
          {}};
}

template <class Ref>
Key text(std::string path, Ref ref, std::string type, std::string doc) {
  Key key{path,
          type,
          "",
          std::move(doc),
          [=](NodeConfig& c, const Source& s, const YamlNode& n) {
            ref(c) = schema::readString(s, n, path);
          },
          [=](const NodeConfig& c) { return showString(ref(c)); },
          {}};
  if (type == "path") key.pathField = [=](NodeConfig& c) -> std::string& { return ref(c); };
  return key;
}

// model.kind: the data module's models, an external trainer, or none.
std::vector<std::string> withConfigModels(std::vector<std::string> names) {
  names.emplace_back(kExternalModel);
  names.emplace_back(kNoModel);
  return names;
}

template <class Ref>
Key choice(std::string path, Ref ref, std::vector<std::string> choices, std::string doc) {
  std::string range;
  for (const std::string& option : choices) range += (range.empty() ? "" : " | ") + option;
  return {path,
          "choice",
          range,
          std::move(doc),
          [=, choices = std::move(choices)](NodeConfig& c, const Source& s, const YamlNode& n) {
            ref(c) = schema::readChoice(s, n, path, choices);
          },
          [=](const NodeConfig& c) { return ref(c); },
          {}};
}

template <class Ref>
Key integerList(std::string path, Ref ref, std::size_t maxLength, std::int64_t min,
                std::int64_t max, std::string doc) {
  const std::string range = "up to " + std::to_string(maxLength) + " of [" + std::to_string(min) +
                            ", " + std::to_string(max) + "]";
  return {path,
          "list of integers",
          range,
          std::move(doc),
          [=](NodeConfig& c, const Source& s, const YamlNode& n) {
            if (n.kind != schema::NodeKind::Sequence) {
              schema::fail(s, n, "expected a list, got " + schema::describe(n), path);
            }
            if (n.items.size() > maxLength) {
              schema::fail(s, n, "at most " + std::to_string(maxLength) + " entries", path);
            }
            std::vector<std::int64_t> values;
            for (std::size_t i = 0; i < n.items.size(); ++i) {
              values.push_back(
                  schema::readInt(s, n.items[i], path + "[" + std::to_string(i) + "]", min, max));
            }
            ref(c) = std::move(values);
          },
          [=](const NodeConfig& c) {
            std::string out = "[";
            for (const std::int64_t value : ref(c))
              out += (out.size() > 1 ? ", " : "") + std::to_string(value);
            return out + "]";
          },
          {}};
}

// `[](auto& c) -> auto& { return c.x; }` works on both const and mutable configs.
#define CONSENSUSD_FIELD(member) ([](auto& c) -> auto& { return c.member; })

std::vector<Key> makeKeys() {
  return {
      text("node.id", CONSENSUSD_FIELD(node.id), "string",
           "This node's id; must be a node of the topology. Required."),
      text("node.bind", CONSENSUSD_FIELD(node.bind), "string",
           "ZeroMQ address to bind, e.g. tcp://*:7000; \"\" = the topology endpoint. For "
           "containers and NAT, where the endpoint names a host the node cannot bind."),
      text("topology.file", CONSENSUSD_FIELD(topology.file), "path",
           "Topology file (docs/design.md §4), relative to this config's folder. Required."),
      flag("topology.watch", CONSENSUSD_FIELD(topology.watch),
           "Apply the topology file whenever it changes on disk, as on SIGHUP (for a "
           "Kubernetes ConfigMap, which is updated in place)."),

      choice("data.dataset", CONSENSUSD_FIELD(data.dataset), data::namesOf(data::kDatasetKinds),
             "Training data set."),
      text("data.path", CONSENSUSD_FIELD(data.path), "path",
           "Folder (IDX) or file (LIBSVM, CSV) holding the data."),
      text("data.test_path", CONSENSUSD_FIELD(data.testPath), "path",
           "LIBSVM/CSV test file; \"\" = hold out test_fraction of data.path."),
      number("data.test_fraction", CONSENSUSD_FIELD(data.testFraction), 0.01, 0.9,
             "Share of a LIBSVM/CSV file held out for testing (seeded by data.seed)."),
      flag("data.csv_header", CONSENSUSD_FIELD(data.csvHeader), "CSV: the first line is a header."),
      integer("data.label_column", CONSENSUSD_FIELD(data.labelColumn), -1000, 1000,
              "CSV: column of the label, 0-based; negative counts from the end."),
      choice("data.partition", CONSENSUSD_FIELD(data.partition),
             data::namesOf(data::kPartitionKinds),
             "How the training set is split across the topology's nodes."),
      integer("data.shards_per_node", CONSENSUSD_FIELD(data.shardsPerNode), 1, 1000,
              "Classes per node with partition: shards."),
      number("data.dirichlet_alpha", CONSENSUSD_FIELD(data.dirichletAlpha), 1e-3, 1e6,
             "Concentration with partition: dirichlet (small = skewed)."),
      choice("data.scaling", CONSENSUSD_FIELD(data.scaling), data::namesOf(data::kScalings),
             "Feature scaling: none, to [0, 1], or standardised with training statistics."),
      integer("data.seed", CONSENSUSD_FIELD(data.seed), 0, kMaxInt,
              "Seed of the partition; must be the same on every node."),

      choice("model.kind", CONSENSUSD_FIELD(model.kind),
             withConfigModels(data::namesOf(data::kModelKinds)),
             "Model to train; external = a trainer process attached at trainer.socket computes "
             "the updates (docs/trainers.md); none = no model, zero gradients on "
             "model.dimension parameters (a round is the exchange alone: benchmarks)."),
      integerOrAuto("model.dimension", CONSENSUSD_FIELD(model.dimension), 0, 1LL << 31,
                    "Parameter count with kind: external or none; auto (external): the first "
                    "trainer's, before the node joins its neighbours."),
      integerList("model.hidden", CONSENSUSD_FIELD(model.hidden), 2, 1, 65536,
                  "Hidden layer widths with kind: mlp (1 or 2 layers)."),
      choice("model.dtype", CONSENSUSD_FIELD(model.dtype), {"float32", kFloat64, kAuto},
             "Parameter type, on the wire too; must match the neighbours'. auto (external): the "
             "first trainer's."),
      integer("model.init_seed", CONSENSUSD_FIELD(model.initSeed), 0, kMaxInt,
              "Seed of the initial parameters; the same on every node."),

      integer("train.batch_size", CONSENSUSD_FIELD(train.batchSize), 1, 65536, "Minibatch size B."),
      number("train.learning_rate", CONSENSUSD_FIELD(train.learningRate), 1e-9, 100,
             "Step size eta_0."),
      choice("train.schedule", CONSENSUSD_FIELD(train.schedule),
             data::namesOf(data::kScheduleKinds), "Learning-rate schedule over rounds."),
      integer("train.step_every_rounds", CONSENSUSD_FIELD(train.stepEveryRounds), 1, kMaxInt,
              "With schedule: step, multiply the rate by step_factor every this many rounds."),
      number("train.step_factor", CONSENSUSD_FIELD(train.stepFactor), 1e-6, 1,
             "Factor of schedule: step."),
      number("train.momentum", CONSENSUSD_FIELD(train.momentum), 0, 0.999, "Heavy-ball momentum."),
      choice("train.outer", CONSENSUSD_FIELD(train.outer), data::namesOf(consensus::kOuters),
             "Each round's update u (a trainer's delta over its local steps, or -eta g) after "
             "the mix: plain adds it; nesterov takes DiLoCo's outer step v <- mu v + u, "
             "x <- x + lr (u + mu v) (docs/trainers.md, \"Local steps and an outer step\")."),
      number("train.outer_learning_rate", CONSENSUSD_FIELD(train.outerLearningRate), 1e-6, 10,
             "lr of the outer step with outer: nesterov (DiLoCo: 0.7)."),
      number("train.outer_momentum", CONSENSUSD_FIELD(train.outerMomentum), 0, 0.999,
             "mu of the outer step with outer: nesterov (DiLoCo: 0.9)."),
      number("train.weight_decay", CONSENSUSD_FIELD(train.weightDecay), 0, 1,
             "L2 penalty (weight_decay / 2) ||W||^2 on weights (not biases), part of the loss."),
      integer("train.rounds", CONSENSUSD_FIELD(train.rounds), 0, kMaxInt,
              "Rounds to run; 0 = until stopped."),
      number("train.until_accuracy", CONSENSUSD_FIELD(train.untilAccuracy), 0, 1,
             "Stop once test accuracy reaches this; 0 = off."),
      number("train.max_time_s", CONSENSUSD_FIELD(train.maxTimeS), 0, kHuge,
             "Stop after this wall time; 0 = off."),
      integer("train.eval_every_rounds", CONSENSUSD_FIELD(train.evalEveryRounds), 0, kMaxInt,
              "Test-set evaluation period; 0 = never."),

      choice("consensus.policy", CONSENSUSD_FIELD(consensus.policy),
             data::namesOf(consensus::kPolicyKinds), "Wait policy (docs/design.md §3)."),
      integer("consensus.backups", CONSENSUSD_FIELD(consensus.backups), 0, 1 << 20,
              "Backup neighbours b with policy: static (wait for degree - b)."),
      number("consensus.timeout_ms", CONSENSUSD_FIELD(consensus.timeoutMs), 0.01, kHuge,
             "Cut-off after round start with policy: timeout."),
      number("consensus.quantile", CONSENSUSD_FIELD(consensus.quantile), 0.01, 1,
             "Quantile of predicted arrivals with policy: quantile."),
      integer("consensus.min_responders", CONSENSUSD_FIELD(consensus.minResponders), 0, 1 << 20,
              "m_min: never mix with fewer neighbours (0 allows local-only rounds)."),
      integer("consensus.max_responders", CONSENSUSD_FIELD(consensus.maxResponders), 0, 1 << 20,
              "Upper bound on m; 0 = the node's degree."),
      choice("consensus.mix_round", CONSENSUSD_FIELD(consensus.mixRound),
             data::namesOf(consensus::kMixRounds),
             "Which estimate of a neighbour counts for round k."),
      choice("consensus.publish", CONSENSUSD_FIELD(consensus.publish),
             data::namesOf(consensus::kPublishes),
             "When a round's estimate leaves: at its start (x_k, sent while the update is "
             "computed), or with the update (x_k + u: the mix averages the neighbours' results, "
             "as FedAvg does; one exchange per round of local steps; docs/trainers.md)."),
      choice("consensus.mix", CONSENSUSD_FIELD(consensus.mix), data::namesOf(consensus::kMixModes),
             "A missing neighbour's weight is shared by self and the neighbours that "
             "answered (renormalize; uniform weights: their plain average), or goes to "
             "self (absorb), or only mutually used edges count (symmetric)."),
      choice("consensus.robust", CONSENSUSD_FIELD(consensus.robust),
             data::namesOf(consensus::kRobustModes),
             "Against a neighbour sending garbage: clip each neighbour's difference to "
             "clip_radius, or a coordinate-wise trimmed mean (docs/protocol.md)."),
      integer("consensus.trim", CONSENSUSD_FIELD(consensus.trim), 1, 64,
              "robust: trimmed-mean: values dropped at each end of every coordinate."),
      number("consensus.clip_radius", CONSENSUSD_FIELD(consensus.clipRadius), 0, kHuge,
             "robust: clip: the radius; 0 = the median distance of this round's responders."),
      choice("consensus.compression", CONSENSUSD_FIELD(consensus.compression),
             data::namesOf(consensus::kCompressions),
             "Estimates as compressed differences to a public copy every neighbour holds "
             "(CHOCO-SGD, docs/protocol.md); must match the neighbours'."),
      number("consensus.consensus_step", CONSENSUSD_FIELD(consensus.consensusStep), 0.01, 1,
             "compression: gamma of the mix x + gamma sum_j w_ij (c_j - c_i) over the public "
             "copies (docs/protocol.md, \"Compressed estimates\")."),
      integer("consensus.staleness", CONSENSUSD_FIELD(consensus.staleness), 0, 1000,
              "s: estimates of round >= k - s are usable."),
      integer("consensus.max_lead", CONSENSUSD_FIELD(consensus.maxLead), 1, 100000,
              "Never run more than this many rounds ahead of the slowest live neighbour."),
      flag("consensus.round_skipping", CONSENSUSD_FIELD(consensus.roundSkipping),
           "Jump to the neighbours' median round when they are far ahead."),
      integer("consensus.skip_ahead", CONSENSUSD_FIELD(consensus.skipAhead), 1, 100000,
              "Rounds behind the neighbours that trigger a skip."),
      integer("consensus.mailbox_depth", CONSENSUSD_FIELD(consensus.mailboxDepth), 1, 1024,
              "Estimates kept per neighbour (mix_round: same)."),
      number(
          "consensus.peer_timeout_ms", CONSENSUSD_FIELD(consensus.peerTimeoutMs), 1, kHuge,
          "Silence after which a neighbour is suspect (any message of it counts, each chunk of an "
          "estimate too)."),
      number(
          "consensus.hard_deadline_ms", CONSENSUSD_FIELD(consensus.hardDeadlineMs), 1, kHuge,
          "No round waits longer than this for neighbours, but for an estimate it can use that is "
          "still arriving (its chunks keep coming)."),
      integer("consensus.warmup_rounds", CONSENSUSD_FIELD(consensus.warmupRounds), 0, 1000000,
              "Rounds with policy all that seed the dynamic policy's estimators."),
      integer("consensus.window_rounds", CONSENSUSD_FIELD(consensus.windowRounds), 1, 100000,
              "Sliding window of the arrival-time and gradient estimators."),
      flag("consensus.dynamic_pull", CONSENSUSD_FIELD(consensus.dynamicPull),
           "dynamic: count the pull toward the neighbours (L/2 sum w ||x_j - x_i||^2) in the "
           "gain of waiting for more."),
      flag("consensus.dynamic_noise", CONSENSUSD_FIELD(consensus.dynamicNoise),
           "dynamic: count DBW's minibatch-noise term (sum of squared mixing weights) in the "
           "gain; off by default (consensus/README.md)."),
      flag("consensus.dynamic_heterogeneity", CONSENSUSD_FIELD(consensus.dynamicHeterogeneity),
           "dynamic: leave out of the descent term the part of the gradient the neighbours "
           "pull back every round (data that differ between nodes); off by default "
           "(docs/design-notes.md)."),
      number("consensus.dynamic_tie_margin", CONSENSUSD_FIELD(consensus.dynamicTieMargin), 0, 0.5,
             "dynamic: once the arrival window is full, waiting for more neighbours whose "
             "progress per second is within this fraction of the best counts as a tie, and "
             "ties go to more neighbours (docs/design-notes.md, \"A margin for mixing\")."),

      choice("straggler.kind", CONSENSUSD_FIELD(straggler.kind),
             data::namesOf(consensus::kStragglerKinds),
             "Emulated extra compute delay per round (docs/design.md §8)."),
      number("straggler.delay_ms", CONSENSUSD_FIELD(straggler.delayMs), 0, kHuge,
             "constant: the delay; shifted-exponential: the shift; pareto: the scale (minimum)."),
      number("straggler.mean_ms", CONSENSUSD_FIELD(straggler.meanMs), 0, kHuge,
             "Mean of the exponential part (exponential, shifted-exponential)."),
      number("straggler.pareto_shape", CONSENSUSD_FIELD(straggler.paretoShape), 0.1, 100,
             "Tail index of pareto (<= 1.2 is heavy)."),
      number("straggler.slow_probability", CONSENSUSD_FIELD(straggler.slowProbability), 0, 1,
             "bimodal: probability that a round is slow."),
      number("straggler.slow_factor", CONSENSUSD_FIELD(straggler.slowFactor), 1, 10000,
             "bimodal: a slow round's compute time as a multiple of the base."),
      number("straggler.base_compute_ms", CONSENSUSD_FIELD(straggler.baseComputeMs), 0, kHuge,
             "bimodal: base compute time; 0 = the measured gradient time."),
      integer("straggler.from_round", CONSENSUSD_FIELD(straggler.fromRound), 0, kMaxInt,
              "First round the straggler model applies to."),
      integer("straggler.to_round", CONSENSUSD_FIELD(straggler.toRound), 0, kMaxInt,
              "Last round it applies to; 0 = until the end."),
      number("straggler.link_delay_ms", CONSENSUSD_FIELD(straggler.linkDelayMs), 0, kHuge,
             "Extra delay on every estimate this node sends (emulated slow links), in the "
             "rounds from_round..to_round; the simulator applies it too."),
      integer("straggler.seed", CONSENSUSD_FIELD(straggler.seed), 0, kMaxInt,
              "Seed of the delay draws."),

      text("status.socket", CONSENSUSD_FIELD(status.socket), "path",
           "Status socket; \"\" = the topology's status path, else /run/consensusd/<id>.sock."),
      text("status.http", CONSENSUSD_FIELD(status.http), "string",
           "HTTP status/metrics address HOST:PORT on loopback; \"\" = off."),
      flag("status.http_remote", CONSENSUSD_FIELD(status.httpRemote),
           "Let status.http bind a non-loopback address (a pod IP, for probes and Prometheus). "
           "It has no authentication: restrict who reaches it (a NetworkPolicy, a firewall)."),

      text("trainer.socket", CONSENSUSD_FIELD(trainer.socket), "path",
           "With model.kind: external, the Unix socket trainers attach to (mode 0660); \"\" = "
           "the status socket's path with .trainer.sock for .sock."),
      text("trainer.group", CONSENSUSD_FIELD(trainer.group), "string",
           "A group whose processes may attach besides the daemon's own user; \"\" = none."),

      text("checkpoint.dir", CONSENSUSD_FIELD(checkpoint.dir), "path",
           "Checkpoint folder; \"\" = /var/lib/consensusd/<id>."),
      integer("checkpoint.every_rounds", CONSENSUSD_FIELD(checkpoint.everyRounds), 0, kMaxInt,
              "Checkpoint period; 0 = only on stop."),
      integer("checkpoint.keep", CONSENSUSD_FIELD(checkpoint.keep), 2, 100,
              "Generations kept (at least 2)."),

      flag("security.curve", CONSENSUSD_FIELD(security.curve),
           "Authenticate and encrypt links with CurveZMQ: only the neighbours' public keys (the "
           "topology's public_key) are admitted."),
      text("security.secret_key_file", CONSENSUSD_FIELD(security.secretKeyFile), "path",
           "This node's key file (consensusctl keygen); must not be readable by others."),

      choice("log.level", CONSENSUSD_FIELD(log.level), {"trace", "debug", "info", "warn", "error"},
             "Log level."),
      text("log.metrics_file", CONSENSUSD_FIELD(log.metricsFile), "path",
           "Per-round metrics as JSON lines; \"\" = off."),
      number("log.progress_every_s", CONSENSUSD_FIELD(log.progressEveryS), 0.1, kHuge,
             "Period of the progress log line."),
  };
}

#undef CONSENSUSD_FIELD

}  // namespace

const std::vector<Key>& schemaKeys() {
  static const std::vector<Key> kKeys = makeKeys();
  return kKeys;
}

std::string schemaTable() {
  const NodeConfig defaults;
  std::string out = "| key | type | default | range | meaning |\n|---|---|---|---|---|\n";
  // A '|' inside a cell (a choice's values, "integer | auto") would end it.
  const auto cell = [](std::string text) {
    for (std::size_t at = text.find('|'); at != std::string::npos; at = text.find('|', at + 2))
      text.replace(at, 1, "\\|");
    return text;
  };
  for (const Key& key : schemaKeys()) {
    out += "| `" + key.path + "` | " + cell(key.type) + " | `" + key.show(defaults) + "` | " +
           cell(key.range) + " | " + key.doc + " |\n";
  }
  return out;
}

}  // namespace consensusd::config
