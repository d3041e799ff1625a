#include "status_commands.hpp"

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <thread>

#include "consensusd/config/load.hpp"
#include "consensusd/ctl/status_client.hpp"
#include "consensusd/daemon/command_line.hpp"
#include "consensusd/daemon/status_server.hpp"
#include "consensusd/schema/yaml_tree.hpp"
#include "consensusd/topology/yaml_io.hpp"

namespace consensusd::cli {
namespace {

struct Target {
  std::string socket;
  std::string config;
  bool json = false;

  std::string path() const {
    if (!socket.empty()) return socket;
    if (!config.empty()) return config::loadConfig(config).config.status.socket;
    throw CLI::ValidationError("give --socket PATH or --config FILE");
  }
};

std::string fixed(double value, int digits) {
  if (value < 0) return "-";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.*f", digits, value);
  return buffer;
}

// The phase; for a node with model.kind: external whether a trainer is
// attached; for one that joined a running cluster, the round it joined at.
std::string state(const nlohmann::json& s) {
  std::string phase = s.value("phase", "?");
  if (s.contains("trainer") && !s["trainer"].value("attached", false)) phase += ", no trainer";
  if (const auto joined = s.value("joined_at_round", -1LL); joined >= 0)
    phase += ", joined at " + std::to_string(joined);
  return phase;
}

void printStatus(const nlohmann::json& s) {
  std::printf("node %s  round %lld  %s  policy %s  m %zu/%zu  %.1f rounds/s  up %.0f s\n",
              s.value("node", "?").c_str(), static_cast<long long>(s.value("round", 0LL)),
              s.value("phase", "?").c_str(), s.value("policy", "?").c_str(),
              s.value("target", std::size_t{0}), s.value("degree", std::size_t{0}),
              s.value("rounds_per_s", 0.0), s.value("uptime_s", 0.0));
  std::printf("loss %s  test accuracy %s  consensus distance %s  last checkpoint %lld\n",
              fixed(s.value("loss", -1.0), 4).c_str(), fixed(s.value("accuracy", -1.0), 4).c_str(),
              fixed(s.value("consensus_distance", -1.0), 5).c_str(),
              static_cast<long long>(s.value("last_checkpoint_round", -1LL)));
  if (s.contains("trainer")) {  // model.kind: external
    const nlohmann::json& t = s["trainer"];
    if (t.value("attached", false)) {
      std::printf("trainer: pid %lld  updates %llu  rejected %llu  update ms %.2f (p95 %.2f)\n",
                  static_cast<long long>(t.value("pid", 0LL)),
                  static_cast<unsigned long long>(t.value("updates", 0ULL)),
                  static_cast<unsigned long long>(t.value("rejected_updates", 0ULL)),
                  t.value("mean_update_ms", 0.0), t.value("p95_update_ms", 0.0));
    } else {
      std::printf("trainer: none attached (%llu refused)\n",
                  static_cast<unsigned long long>(t.value("refused", 0ULL)));
    }
  }
  // Each counter map on one line: what ended the rounds; refused messages apart from the normal
  // discards of asynchrony and the send queue's events.
  for (const char* group : {"cutoffs", "rejects", "discarded", "sends"}) {
    std::string line;
    const nlohmann::json counts =
        s.value(group, nlohmann::json::object());  // a local: items() must not dangle
    for (const auto& [name, count] : counts.items()) line += " " + name + "=" + count.dump();
    std::printf("%s:%s\n", group, line.empty() ? " none" : line.c_str());
  }
}

void printNeighbors(const nlohmann::json& list) {
  std::printf("%-10s %-8s %10s %10s %8s %8s %6s %6s %6s %8s %7s %9s %10s\n", "neighbor", "state",
              "last round", "median ms", "p90 ms", "on time", "late", "stale", "dup", "rejected",
              "mixed", "in Mbit/s", "transfer s");
  for (const auto& n : list) {
    std::printf("%-10s %-8s %10lld %10.2f %8.2f %8llu %6llu %6llu %6llu %8llu %7llu %9.1f %10.2f\n",
                n.value("id", "?").c_str(), n.value("state", "?").c_str(),
                static_cast<long long>(n.value("last_round", -1LL)),
                n.value("median_arrival_ms", 0.0), n.value("p90_arrival_ms", 0.0),
                n.value("on_time", 0ULL), n.value("late", 0ULL), n.value("stale", 0ULL),
                n.value("duplicate", 0ULL), n.value("rejected", 0ULL), n.value("mixed", 0ULL),
                n.value("bytes_per_s", 0.0) * 8 / 1e6, n.value("transfer_ms", 0.0) / 1000);
  }
}

int simple(const Target& target, const nlohmann::json& request,
           const std::function<void(const nlohmann::json&)>& human) {
  const nlohmann::json answer = askDaemon(target.path(), request);
  if (target.json) {
    std::cout << answer.dump(2) << "\n";
  } else if (!answer.value("ok", false)) {
    std::cerr << "consensusctl: " << answer.value("error", std::string("request failed")) << "\n";
  } else {
    human(answer);
  }
  return answer.value("ok", false) ? kExitOk : 1;
}

struct TopOptions {
  std::string topology;
  double interval = 1.0;
  bool once = false;
  bool json = false;
};

int runTop(const TopOptions& options) {
  const topology::Topology graph = topology::loadTopology(options.topology);
  for (;;) {
    nlohmann::json all = nlohmann::json::array();
    std::string table;
    char line[320];
    std::snprintf(line, sizeof line, "%-8s %8s %9s %8s %8s %5s %5s %5s %8s %9s %10s %9s %9s  %s\n",
                  "node", "round", "rounds/s", "loss", "acc", "b", "resp", "susp", "rejects",
                  "in Mbit/s", "transfer s", "sent MB", "kB/sample", "state");
    table += line;
    for (const topology::NodeSpec& node : graph.nodes()) {
      const std::string path =
          node.status.empty() ? "/run/consensusd/" + node.id + ".sock" : node.status;
      nlohmann::json s;
      try {
        s = askDaemon(path, {{"cmd", "status"}}, std::chrono::milliseconds(500));
      } catch (const std::exception& e) {
        s = {{"node", node.id}, {"ok", false}, {"error", e.what()}};
      }
      all.push_back(s);
      if (!s.value("ok", false)) {
        std::snprintf(line, sizeof line,
                      "%-8s %8s %9s %8s %8s %5s %5s %5s %8s %9s %10s %9s %9s  %s\n",
                      node.id.c_str(), "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-",
                      "unreachable");
        table += line;
        continue;
      }
      std::uint64_t rejects = 0;
      for (const auto& [reason, count] : s["rejects"].items())
        rejects += count.get<std::uint64_t>();
      // What comes in from all neighbours, and the slowest last estimate.
      double inBytesPerS = 0;
      double transferMs = 0;
      for (const auto& n : s.value("neighbors", nlohmann::json::array())) {
        inBytesPerS += n.value("bytes_per_s", 0.0);
        transferMs = std::max(transferMs, n.value("transfer_ms", 0.0));
      }
      const nlohmann::json perSample = s.value("sent_bytes_per_sample", nlohmann::json());
      std::snprintf(line, sizeof line,
                    "%-8s %8lld %9.1f %8s %8s %5lld %5zu %5zu %8llu %9.1f %10.2f %9.1f %9s  %s\n",
                    node.id.c_str(), static_cast<long long>(s.value("round", 0LL)),
                    s.value("rounds_per_s", 0.0), fixed(s.value("loss", -1.0), 4).c_str(),
                    fixed(s.value("accuracy", -1.0), 4).c_str(),
                    static_cast<long long>(s.value("backups", 0LL)),
                    s.value("responders", std::size_t{0}), s.value("suspects", std::size_t{0}),
                    static_cast<unsigned long long>(rejects), inBytesPerS * 8 / 1e6,
                    transferMs / 1000, s.value("bytes_sent", 0.0) / 1e6,
                    perSample.is_number() ? fixed(perSample.get<double>() / 1e3, 2).c_str() : "-",
                    state(s).c_str());
      table += line;
    }
    if (options.json) {
      std::cout << all.dump() << std::endl;
    } else {
      if (!options.once) std::cout << "\033[H\033[2J";  // clear the terminal for the live view
      std::cout << graph.name() << " (" << graph.size() << " nodes)\n" << table << std::flush;
    }
    if (options.once) return kExitOk;
    std::this_thread::sleep_for(std::chrono::duration<double>(options.interval));
  }
}

// TOPOLOGY to one node, or to every node it lists that runs (at its status
// path): each checks it as at start and switches between rounds. A node
// that is not running reads its topology.file when it starts.
int runApply(const std::string& file, const Target& target) {
  const std::string text = schema::readYamlText(file);
  // Checked here first: a bad file reaches no node (78, with file:line).
  const topology::Topology graph = topology::parseTopology(text, file);
  const std::string name = std::filesystem::absolute(file).lexically_normal().string();
  const nlohmann::json request = {{"cmd", "apply"}, {"file", name}, {"topology", text}};
  if (daemon::serialize(request).size() + 1 > daemon::kMaxStatusRequest)
    throw UsageError("topology file '" + file + "' is larger than a status request (" +
                     std::to_string(daemon::kMaxStatusRequest / 1024) +
                     " KiB): put it at the nodes' topology.file and send SIGHUP "
                     "(systemctl reload)");
  std::vector<std::pair<std::string, std::string>> nodes;  // id, status socket
  if (!target.socket.empty() || !target.config.empty()) {
    nodes.emplace_back("", target.path());
  } else {
    for (const topology::NodeSpec& node : graph.nodes())
      nodes.emplace_back(
          node.id, node.status.empty() ? "/run/consensusd/" + node.id + ".sock" : node.status);
  }
  // A node answers once between rounds: a round can take up to a peer timeout.
  constexpr auto kAnswerWithin = std::chrono::seconds(120);
  int code = kExitOk;
  nlohmann::json answers = nlohmann::json::array();
  for (const auto& [id, path] : nodes) {
    nlohmann::json answer;
    try {
      answer = askDaemon(path, request, kAnswerWithin);
    } catch (const std::exception& e) {
      if (nodes.size() == 1) throw;
      answer = {{"ok", false}, {"not_running", true}, {"error", e.what()}};
    }
    answer["node"] = id.empty() ? answer.value("node", path) : id;
    answers.push_back(answer);
    const std::string who = answer["node"].get<std::string>();
    if (answer.value("not_running", false)) {
      if (!target.json)
        std::cout << who << ": not running (it reads its topology.file when it starts)\n";
      continue;
    }
    if (!answer.value("ok", false)) {
      code = answer.value("exit", 0) == schema::kExitConfig ? schema::kExitConfig : 1;
      if (!target.json)
        std::cerr << who << ": " << answer.value("error", std::string("refused")) << "\n";
      continue;
    }
    if (target.json) continue;
    if (!answer.value("changed", false)) {
      std::cout << who << ": already runs this graph\n";
      continue;
    }
    std::cout << who << ": applied at round " << answer.value("round", 0LL) << ", degree "
              << answer.value("degree", 0) << ", neighbours added "
              << answer.value("added", nlohmann::json::array()).dump() << ", removed "
              << answer.value("removed", nlohmann::json::array()).dump() << "\n";
  }
  if (target.json) std::cout << answers.dump(2) << "\n";
  return code;
}

}  // namespace

void addStatusCommands(CLI::App& parent, std::function<int()>& action) {
  const auto addTarget = [](CLI::App* command, const std::shared_ptr<Target>& target) {
    command->add_option("--socket", target->socket, "Status socket of the daemon");
    command->add_option("--config", target->config, "The daemon's config (its status.socket)");
    command->add_flag("--json", target->json, "Machine-readable output");
  };
  struct Simple {
    const char* name;
    const char* help;
    std::function<void(const nlohmann::json&)> human;
  };
  const std::vector<Simple> commands{
      {"status", "Round, policy, loss, accuracy, rejects of one node", printStatus},
      {"neighbors", "Per-neighbour state and counters",
       [](const nlohmann::json& a) { printNeighbors(a["neighbors"]); }},
      {"history", "The last rounds' records (JSON lines)",
       [](const nlohmann::json& a) {
         for (const auto& r : a["history"]) std::cout << r.dump() << "\n";
       }},
      {"checkpoint", "Write a checkpoint now",
       [](const nlohmann::json& a) { std::cout << "checkpoint " << a.value("path", "") << "\n"; }},
      {"pause", "Stop starting rounds (keeps answering)",
       [](const nlohmann::json&) { std::cout << "paused\n"; }},
      {"resume", "Start rounds again", [](const nlohmann::json&) { std::cout << "resumed\n"; }},
      {"stop", "Checkpoint and exit", [](const nlohmann::json&) { std::cout << "stopping\n"; }},
  };
  for (const Simple& simpleCommand : commands) {
    auto target = std::make_shared<Target>();
    CLI::App* command = parent.add_subcommand(simpleCommand.name, simpleCommand.help);
    addTarget(command, target);
    command->callback(
        [target, &action, name = std::string(simpleCommand.name), human = simpleCommand.human] {
          action = [target, name, human] { return simple(*target, {{"cmd", name}}, human); };
        });
  }

  auto policyTarget = std::make_shared<Target>();
  auto policy = std::make_shared<nlohmann::json>(nlohmann::json::object());
  auto policyName = std::make_shared<std::string>();
  auto backups = std::make_shared<std::optional<std::int64_t>>();
  auto timeoutMs = std::make_shared<std::optional<double>>();
  auto quantile = std::make_shared<std::optional<double>>();
  CLI::App* setPolicy =
      parent.add_subcommand("set-policy", "Change the wait policy from the next round");
  setPolicy->add_option("policy", *policyName, "all | static | timeout | quantile | dynamic")
      ->required();
  setPolicy->add_option("--backups", *backups, "static: b");
  setPolicy->add_option("--timeout-ms", *timeoutMs, "timeout: the cut-off");
  setPolicy->add_option("--quantile", *quantile, "quantile: q");
  addTarget(setPolicy, policyTarget);
  setPolicy->callback([=, &action] {
    action = [=] {
      nlohmann::json request = {{"cmd", "set-policy"}, {"policy", *policyName}};
      if (*backups) request["backups"] = **backups;
      if (*timeoutMs) request["timeout_ms"] = **timeoutMs;
      if (*quantile) request["quantile"] = **quantile;
      return simple(*policyTarget, request, [](const nlohmann::json& a) {
        std::cout << "policy " << a.value("policy", "") << "\n";
      });
    };
  });

  auto applyTarget = std::make_shared<Target>();
  auto applyFile = std::make_shared<std::string>();
  CLI::App* apply = parent.add_subcommand(
      "apply",
      "Change the graph of running nodes: one (--socket, --config) or every node the file lists");
  apply->add_option("topology", *applyFile, "The new topology file")->required();
  addTarget(apply, applyTarget);
  apply->callback([=, &action] { action = [=] { return runApply(*applyFile, *applyTarget); }; });

  auto watchTarget = std::make_shared<Target>();
  auto watchInterval = std::make_shared<double>(1.0);
  CLI::App* watch = parent.add_subcommand("watch", "Live status of one node");
  addTarget(watch, watchTarget);
  watch->add_option("--interval", *watchInterval, "Seconds between refreshes")
      ->capture_default_str();
  watch->callback([=, &action] {
    action = [=] {
      for (;;) {
        const nlohmann::json s = askDaemon(watchTarget->path(), {{"cmd", "status"}});
        if (watchTarget->json) {
          std::cout << s.dump() << std::endl;
        } else {
          std::cout << "\033[H\033[2J";
          printStatus(s);
          printNeighbors(s["neighbors"]);
          std::cout << std::flush;
        }
        std::this_thread::sleep_for(std::chrono::duration<double>(*watchInterval));
      }
      return kExitOk;
    };
  });

  auto top = std::make_shared<TopOptions>();
  CLI::App* topCommand = parent.add_subcommand("top", "Every node of a topology in one live table");
  topCommand->add_option("topology", top->topology, "Topology file (status paths from its nodes)")
      ->required();
  topCommand->add_option("--interval", top->interval, "Seconds between refreshes")
      ->capture_default_str();
  topCommand->add_flag("--once", top->once, "One table, then exit");
  topCommand->add_flag("--json", top->json, "One JSON array per refresh");
  topCommand->callback([top, &action] { action = [top] { return runTop(*top); }; });
}

}  // namespace consensusd::cli
