#include "simulate_command.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "consensusd/config/load.hpp"
#include "consensusd/config/params.hpp"
#include "consensusd/daemon/command_line.hpp"
#include "consensusd/data/partition.hpp"
#include "consensusd/data/source.hpp"
#include "consensusd/sim/simulator.hpp"
#include "consensusd/topology/yaml_io.hpp"
#include "straggler_flags.hpp"

namespace consensusd::cli {
namespace {

namespace fs = std::filesystem;

struct SimulateOptions {
  std::string topology;
  std::string policies = "all,static:1,dynamic";
  std::string seeds = "1";
  std::vector<std::string> sets;
  std::vector<std::string> stragglers;  // NODE|all=KEY=VALUE[,KEY=VALUE]
  std::vector<std::string> attacks;     // NODE=sign-flip|shift[:SCALE]
  double computeMs = 10;
  double latencyMs = 0.1;
  double bandwidthGbps = 10;
  double linkSpread = 0;
  double downloadMbps = 0;
  std::vector<std::string> downloads;  // NODE=MBPS
  double estimateMb = 0;
  double timeS = 60;
  double sampleMs = 500;
  double target = 0.8;
  bool stopAtTarget = false;
  std::size_t nodeEval = 2000;
  std::size_t threads = std::max(1U, std::thread::hardware_concurrency());
  std::string output;
};

// One policy of the sweep: its name and the config overrides that select it.
struct Policy {
  std::string name;
  std::vector<std::string> overrides;
  bool isStatic = false;
  bool synchronous = false;  // sync: the synchronous data-parallel baseline, not a wait policy
};

std::vector<std::string> split(const std::string& text, char by) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, by);)
    if (!part.empty()) parts.push_back(part);
  return parts;
}

// all | static:B | static:A..B | timeout:MS | quantile:Q | dynamic | sync
std::vector<Policy> parsePolicies(const std::string& text) {
  std::vector<Policy> policies;
  for (const std::string& item : split(text, ',')) {
    if (item == "sync") {
      policies.push_back({item, {}, false, true});
      continue;
    }
    const auto colon = item.find(':');
    const std::string kind = item.substr(0, colon);
    const std::string arg = colon == std::string::npos ? "" : item.substr(colon + 1);
    const auto bad = [&] { return UsageError("--policy: cannot read '" + item + "'"); };
    using consensus::PolicyKind;
    const std::optional<PolicyKind> parsed = data::parseName(consensus::kPolicyKinds, kind);
    if (!parsed) throw bad();
    const bool takesArgument = *parsed != PolicyKind::All && *parsed != PolicyKind::Dynamic;
    if (arg.empty() == takesArgument) throw bad();
    const std::string set = "consensus.policy=" + kind;
    switch (*parsed) {
      case PolicyKind::All:
      case PolicyKind::Dynamic:
        policies.push_back({kind, {set}});
        break;
      case PolicyKind::Static: {
        const auto dots = arg.find("..");
        try {
          const int from = std::stoi(arg.substr(0, dots));
          const int to = dots == std::string::npos ? from : std::stoi(arg.substr(dots + 2));
          for (int b = from; b <= to; ++b)
            policies.push_back({"static:" + std::to_string(b),
                                {set, "consensus.backups=" + std::to_string(b)},
                                true});
        } catch (const std::exception&) {
          throw bad();
        }
        break;
      }
      case PolicyKind::Timeout:
        policies.push_back({item, {set, "consensus.timeout_ms=" + arg}});
        break;
      case PolicyKind::Quantile:
        policies.push_back({item, {set, "consensus.quantile=" + arg}});
        break;
    }
  }
  if (policies.empty()) throw UsageError("--policy: no policy given");
  return policies;
}

// NODE=sign-flip[:SCALE] (sends -SCALE x) or NODE=shift[:SCALE] (x + SCALE);
// SCALE defaults to 1.
std::vector<sim::Attacker> parseAttacks(const std::vector<std::string>& specs,
                                        const topology::Topology& graph) {
  std::vector<sim::Attacker> attackers;
  for (const std::string& spec : specs) {
    const auto bad = [&] {
      return UsageError("--attack '" + spec +
                        "': expected NODE=sign-flip[:SCALE] or NODE=shift[:SCALE] with NODE a "
                        "node of the topology");
    };
    const auto eq = spec.find('=');
    const auto index = graph.indexOf(spec.substr(0, eq));
    if (eq == std::string::npos || !index) throw bad();
    const std::string what = spec.substr(eq + 1);
    const auto colon = what.find(':');
    sim::Attacker attacker{*index, sim::Attack::SignFlip, 1.0};
    if (what.substr(0, colon) == "shift")
      attacker.attack = sim::Attack::Shift;
    else if (what.substr(0, colon) != "sign-flip")
      throw bad();
    if (colon != std::string::npos) {
      std::size_t used = 0;
      try {
        attacker.scale = std::stod(what.substr(colon + 1), &used);
      } catch (const std::exception&) {
        throw bad();
      }
      if (used != what.size() - colon - 1) throw bad();
    }
    attackers.push_back(attacker);
  }
  return attackers;
}

// Every node's download rate in bytes/s: `all` Mbit/s, then NODE=MBPS for one.
std::vector<double> parseDownloads(double all, const std::vector<std::string>& specs,
                                   const topology::Topology& graph) {
  std::vector<double> rates(graph.size(), all * 1e6 / 8);
  for (const std::string& spec : specs) {
    const auto eq = spec.find('=');
    const auto index = eq == std::string::npos ? std::nullopt : graph.indexOf(spec.substr(0, eq));
    double mbps = -1;
    std::size_t used = 0;
    try {
      if (index) mbps = std::stod(spec.substr(eq + 1), &used);
    } catch (const std::exception&) {
      mbps = -1;
    }
    if (!index || mbps <= 0 || used != spec.size() - eq - 1)
      throw UsageError("--download '" + spec +
                       "': expected NODE=MBPS with NODE a node of the topology and MBPS > 0");
    rates[*index] = mbps * 1e6 / 8;
  }
  return rates;
}

consensus::Duration milliseconds(double ms) {
  return std::chrono::duration_cast<consensus::Duration>(
      std::chrono::duration<double, std::milli>(ms));
}

std::string formatTime(const std::optional<double>& t) {
  if (!t) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", *t);
  return text;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Seed by seed: the time `policy` took over the time `baseline` took with the same seed (the
// same delays), mean and standard error over the seeds where both reached the target. Finer
// than a ratio of medians, which sets two spreads side by side. No seeds: fewer than two pairs.
struct SeedRatio {
  double mean = 0;
  double standardError = 0;
  std::size_t seeds = 0;
};

SeedRatio seedRatio(const std::vector<std::optional<double>>& policy,
                    const std::vector<std::optional<double>>& baseline) {
  std::vector<double> ratios;
  for (std::size_t i = 0; i < policy.size() && i < baseline.size(); ++i)
    if (policy[i] && baseline[i] && *baseline[i] > 0) ratios.push_back(*policy[i] / *baseline[i]);
  SeedRatio r;
  if (ratios.size() < 2) return r;
  r.seeds = ratios.size();
  for (const double x : ratios) r.mean += x;
  r.mean /= static_cast<double>(r.seeds);
  double squares = 0;
  for (const double x : ratios) squares += (x - r.mean) * (x - r.mean);
  r.standardError =
      std::sqrt(squares / static_cast<double>(r.seeds - 1) / static_cast<double>(r.seeds));
  return r;
}

void writeCsv(const fs::path& path, const std::vector<sim::Sample>& samples) {
  std::ofstream out(path, std::ios::trunc);
  out << "time_s,mean_round,mean_loss,accuracy,min_accuracy,max_accuracy,consensus_distance,"
         "mean_b,mean_m,cut_timeout,cut_deadline,sent_mb,bytes_per_sample\n";
  for (const sim::Sample& s : samples) {
    out << s.timeS << ',' << s.meanRound << ',' << s.meanLoss << ',' << s.accuracy << ','
        << s.minAccuracy << ',' << s.maxAccuracy << ',' << s.consensusDistance << ','
        << s.meanBackups << ',' << s.meanTarget << ',' << s.timeoutShare << ',' << s.deadlineShare
        << ',' << s.sentBytesPerNode / 1e6 << ',' << s.sentBytesPerSample << '\n';
  }
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

std::vector<std::uint64_t> parseSeeds(const std::string& text) {
  std::vector<std::uint64_t> seeds;
  for (const std::string& s : split(text, ',')) {
    try {
      seeds.push_back(std::stoull(s));
    } catch (const std::exception&) {
      throw UsageError("--seeds: '" + s + "' is not a number");
    }
  }
  if (seeds.empty()) throw UsageError("--seeds: no seed given");
  return seeds;
}

// What every run of a policy shares besides its seed: the config's engine,
// model and schedule, and the command line's clock, links and faults.
struct RunSetting {
  std::vector<std::vector<consensus::StragglerSpec>> stragglers;
  std::vector<sim::Attacker> attackers;
  std::vector<double> downloads;
};

sim::SimOptions simOptions(const config::NodeConfig& cfg, const SimulateOptions& options,
                           const data::TrainTest& data, const RunSetting& setting,
                           std::uint64_t seed) {
  sim::SimOptions sim;
  sim.engine = config::engineOptions(cfg);
  sim.schedule = config::schedule(cfg);
  sim.momentum = cfg.train.momentum;
  sim.model = config::modelOptions(cfg, data.train);
  sim.initSeed = static_cast<std::uint64_t>(cfg.model.initSeed);
  sim.seed = seed;
  sim.compute = milliseconds(options.computeMs);
  sim.stragglers = setting.stragglers;
  sim.attackers = setting.attackers;
  sim.link.latency = milliseconds(options.latencyMs);
  sim.link.bytesPerSecond = options.bandwidthGbps * 1e9 / 8;
  sim.link.spread = options.linkSpread;
  sim.link.downloadBytesPerSecond = setting.downloads;
  sim.link.estimateBytes = static_cast<std::size_t>(options.estimateMb * 1e6);
  sim.sampleEvery = milliseconds(options.sampleMs);
  sim.maxTime = milliseconds(options.timeS * 1000);
  sim.stopAtAccuracy = options.stopAtTarget ? options.target : 0.0;
  sim.nodeEvalSamples = options.nodeEval;
  sim.threads = options.threads;
  return sim;
}

// Each policy's times to the target, one per seed (none: never reached).
using Crossings = std::map<std::string, std::vector<std::optional<double>>>;

// The table and the CSVs (summary.csv, crossings.csv in `out`): the
// median time to target over seeds (runs that never got there count as
// missing), against `all` and the best static b.
void summarize(const SimulateOptions& options, const std::vector<Policy>& policies,
               const std::vector<std::uint64_t>& seeds, const Crossings& first,
               const Crossings& smoothed, const fs::path& out) {
  const auto summary = [&](const std::vector<std::optional<double>>& times)
      -> std::pair<std::optional<double>, std::size_t> {
    std::vector<double> reached;
    for (const auto& t : times)
      if (t) reached.push_back(*t);
    if (reached.size() * 2 <= times.size()) return {std::nullopt, reached.size()};
    return {median(reached), reached.size()};
  };
  std::optional<double> all, bestStatic;
  std::string bestStaticName;
  for (const Policy& policy : policies) {
    const auto t = summary(smoothed.at(policy.name)).first;
    if (policy.name == "all") all = t;
    if (policy.isStatic && t && (!bestStatic || *t < *bestStatic)) {
      bestStatic = t;
      bestStaticName = policy.name;
    }
  }
  // The spread over seeds: fastest and slowest smoothed crossing among the seeds that got there.
  const auto range = [](const std::vector<std::optional<double>>& times) -> std::string {
    std::vector<double> reached;
    for (const auto& t : times)
      if (t) reached.push_back(*t);
    if (reached.empty()) return "-";
    const auto [lo, hi] = std::minmax_element(reached.begin(), reached.end());
    return formatTime(*lo) + "-" + formatTime(*hi);
  };
  // Each run's crossings, for comparing any two policies seed by seed (scripts/seed-ratio).
  std::ofstream crossings(out / "crossings.csv", std::ios::trunc);
  crossings << "policy,seed,first_s,smoothed_s\n";
  for (const Policy& policy : policies)
    for (std::size_t i = 0; i < seeds.size(); ++i) {
      crossings << policy.name << ',' << seeds[i] << ',';
      if (first.at(policy.name)[i]) crossings << *first.at(policy.name)[i];
      crossings << ',';
      if (smoothed.at(policy.name)[i]) crossings << *smoothed.at(policy.name)[i];
      crossings << '\n';
    }
  if (!crossings) throw std::runtime_error("cannot write " + (out / "crossings.csv").string());

  std::ofstream csv(out / "summary.csv", std::ios::trunc);
  csv << "policy,seeds_reached,median_first_s,median_smoothed_s,speedup_vs_all,"
         "vs_best_static,smoothed_range_s,per_seed_vs_best_static,per_seed_standard_error\n";
  std::printf("\n%-14s %7s %10s %10s %12s %8s %10s %16s\n", "policy", "reached", "first s",
              "smooth s", "range s", "vs all", "vs best b", "per seed");
  for (const Policy& policy : policies) {
    const auto [firstMedian, reached] = summary(first.at(policy.name));
    const auto smooth = summary(smoothed.at(policy.name)).first;
    const std::string spread = range(smoothed.at(policy.name));
    const auto ratio = [](std::optional<double> a, std::optional<double> b) {
      return a && b ? formatTime(*a / *b) : std::string("-");
    };
    // `all` that never got there: the speed-up is at least run length / time.
    const bool allMissed = !all && std::any_of(policies.begin(), policies.end(),
                                               [](const Policy& p) { return p.name == "all"; });
    const std::string vsAll =
        allMissed && smooth ? ">" + formatTime(options.timeS / *smooth) : ratio(all, smooth);
    SeedRatio perSeed;
    if (!bestStaticName.empty())
      perSeed = seedRatio(smoothed.at(policy.name), smoothed.at(bestStaticName));
    char perSeedText[48] = "-";
    if (perSeed.seeds > 0)
      std::snprintf(perSeedText, sizeof perSeedText, "%.3f +- %.3f", perSeed.mean,
                    perSeed.standardError);
    std::printf("%-14s %4zu/%-2zu %10s %10s %12s %8s %10s %16s\n", policy.name.c_str(), reached,
                seeds.size(), formatTime(firstMedian).c_str(), formatTime(smooth).c_str(),
                spread.c_str(), vsAll.c_str(), ratio(smooth, bestStatic).c_str(), perSeedText);
    csv << policy.name << ',' << reached << ',' << formatTime(firstMedian) << ','
        << formatTime(smooth) << ',' << vsAll << ',' << ratio(smooth, bestStatic) << ',' << spread
        << ',';
    if (perSeed.seeds > 0)
      csv << perSeed.mean << ',' << perSeed.standardError;
    else
      csv << ',';
    csv << '\n';
  }
  std::printf(
      "\nvs all: speed-up over waiting for every neighbour (>1 is faster); vs best b: "
      "time over the best static b (%s; <=1.05 is the goal); per seed: the same ratio seed by "
      "seed, mean +- standard error. Smoothed: first time the mean of 5 samples reaches the "
      "target. CSVs in %s\n",
      bestStaticName.empty() ? "none reached the target" : bestStaticName.c_str(),
      out.string().c_str());
}

int runSimulate(const SimulateOptions& options) {
  const topology::Topology graph = topology::loadTopology(options.topology);
  const std::vector<Policy> policies = parsePolicies(options.policies);
  const std::vector<std::uint64_t> seeds = parseSeeds(options.seeds);

  // The daemon's config schema reads every setting: same keys, same checks.
  const std::string base = "node: {id: " + graph.node(0).id + "}\ntopology: {file: unused}\n";
  const config::NodeConfig common = config::readConfig(base, "--set", options.sets);
  RunSetting setting;
  setting.stragglers.resize(graph.size());
  for (const StragglerFlag& flag : stragglerFlags(options.stragglers, graph, true)) {
    std::vector<std::string> all = options.sets;
    all.insert(all.end(), flag.overrides.begin(), flag.overrides.end());
    setting.stragglers[flag.node].push_back(
        config::stragglerSpec(config::readConfig(base, "--straggler", all)));
  }

  setting.attackers = parseAttacks(options.attacks, graph);
  setting.downloads = parseDownloads(options.downloadMbps, options.downloads, graph);

  const data::TrainTest data = data::load(config::dataSource(common));
  const auto parts = data::partition(data.train, config::partitionOptions(common, graph.size()));
  std::vector<data::Dataset> shares;
  for (const auto& part : parts) shares.push_back(data::subset(data.train, part));
  std::printf("%s; %zu nodes of %s, %s; target accuracy %.3f\n", data.description.c_str(),
              graph.size(), graph.name().c_str(), common.model.kind.c_str(), options.target);

  const fs::path out = options.output.empty() ? fs::path("runs") / "sim" : fs::path(options.output);
  fs::create_directories(out);
  Crossings first, smoothed;
  for (const Policy& policy : policies) {
    std::vector<std::string> overrides = options.sets;
    overrides.insert(overrides.end(), policy.overrides.begin(), policy.overrides.end());
    const config::NodeConfig cfg = config::readConfig(base, "--policy " + policy.name, overrides);
    for (const std::uint64_t seed : seeds) {
      const sim::SimOptions sim = simOptions(cfg, options, data, setting, seed);
      const auto started = std::chrono::steady_clock::now();
      const sim::SimResult result = policy.synchronous
                                        ? sim::simulateSynchronous(graph, data, shares, sim)
                                        : sim::simulate(graph, data, shares, sim);
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      std::string name = policy.name;
      std::replace(name.begin(), name.end(), ':', '-');
      writeCsv(out / (name + "-seed" + std::to_string(seed) + ".csv"), result.samples);
      first[policy.name].push_back(sim::firstCrossing(result.samples, options.target));
      smoothed[policy.name].push_back(sim::firstCrossing(result.samples, options.target, 5));
      const sim::Sample& last = result.samples.back();
      std::printf(
          "%-14s seed %-3llu %8.0f rounds/node  accuracy %.4f (nodes %.4f-%.4f)  b %.2f  "
          "target at %s s  (%.1f s wall)\n",
          policy.name.c_str(), static_cast<unsigned long long>(seed), last.meanRound, last.accuracy,
          last.minAccuracy, last.maxAccuracy, last.meanBackups,
          formatTime(first[policy.name].back()).c_str(), wall);
      std::fflush(stdout);
    }
  }

  summarize(options, policies, seeds, first, smoothed, out);
  return kExitOk;
}

}  // namespace

void addSimulateCommand(CLI::App& parent, std::function<int()>& action) {
  auto o = std::make_shared<SimulateOptions>();
  CLI::App* cmd = parent.add_subcommand(
      "simulate",
      "Sweep wait policies over N virtual nodes on a virtual clock (same core, "
      "real gradients): CSV per run and a time-to-accuracy table");
  cmd->add_option("topology", o->topology, "Topology file")->required();
  cmd->add_option("--policy", o->policies,
                  "Comma list: all, static:B or static:A..B, timeout:MS, quantile:Q, dynamic, "
                  "and sync (the synchronous data-parallel baseline: all wait for all, exact "
                  "average by ring all-reduce)")
      ->capture_default_str();
  cmd->add_option("--seeds", o->seeds, "Comma list of seeds (minibatches, stragglers)")
      ->capture_default_str();
  cmd->add_option("--set", o->sets,
                  "Node-config key for every node (data.*, model.*, train.*, "
                  "consensus.*)")
      ->type_name("KEY=VALUE");
  cmd->add_option("--straggler", o->stragglers,
                  "NODE=KEY=VALUE[,KEY=VALUE] or all=...: one straggler model (straggler.* "
                  "keys), e.g. all=kind=bimodal,slow_probability=0.1; a node's models add "
                  "up, each in its from_round..to_round");
  cmd->add_option("--attack", o->attacks,
                  "NODE=sign-flip[:SCALE] (sends -SCALE x) or NODE=shift[:SCALE] (sends x + "
                  "SCALE): a node that lies to its neighbours (see consensus.robust)");
  cmd->add_option("--compute-ms", o->computeMs, "Virtual time of one gradient")
      ->capture_default_str();
  cmd->add_option("--latency-ms", o->latencyMs, "Link latency")->capture_default_str();
  cmd->add_option("--bandwidth-gbps", o->bandwidthGbps, "Link bandwidth")->capture_default_str();
  cmd->add_option("--link-spread", o->linkSpread,
                  "Links of mixed speed: each link exp(SPREAD Z) times slower (latency x, "
                  "bandwidth /), Z standard normal drawn per link from the seed; 0: all alike")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--download-mbps", o->downloadMbps,
                  "Every node's download rate in Mbit/s, estimates into a node one after "
                  "another (as scripts/netns-testbed --rate); 0: none, links as above")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--download", o->downloads, "NODE=MBPS: one node's download rate (repeatable)");
  cmd->add_option("--estimate-mb", o->estimateMb,
                  "What an estimate weighs on the wire in MB (0: the model's size): big models' "
                  "links with a small model's gradients")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--time-s", o->timeS, "Virtual time per run")->capture_default_str();
  cmd->add_option("--sample-ms", o->sampleMs, "Virtual time between CSV rows")
      ->capture_default_str();
  cmd->add_option("--target", o->target, "Test accuracy of the average model to time")
      ->capture_default_str();
  cmd->add_flag("--stop-at-target", o->stopAtTarget, "End each run once the target is reached");
  cmd->add_option("--node-eval", o->nodeEval,
                  "Test samples for min/max accuracy over nodes (0: skip, for large N)")
      ->capture_default_str();
  cmd->add_option("--threads", o->threads,
                  "Threads computing gradients (default: one per core); the results do not "
                  "depend on it")
      ->check(CLI::PositiveNumber);
  cmd->add_option("-o,--output", o->output, "Folder for the CSVs (default runs/sim)");
  cmd->callback([o, &action] { action = [o] { return runSimulate(*o); }; });
}

}  // namespace consensusd::cli
