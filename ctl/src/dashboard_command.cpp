#include "dashboard_command.hpp"

#include <signal.h>

#include <algorithm>
#include <array>
#include <boost/asio/ip/address.hpp>
#include <chrono>
#include <ctime>
#include <iostream>
#include <mutex>
#include <optional>
#include <string_view>

#include "consensusd/ctl/status_client.hpp"
#include "consensusd/daemon/command_line.hpp"
#include "consensusd/topology/yaml_io.hpp"
#include "dashboard_assets.hpp"
#include "dashboard_server.hpp"
#include "dashboard_view.hpp"

namespace consensusd::cli {
namespace {

// What the view and the page read of a node's status: a third of a full
// answer (of each neighbour only these, no class histogram), less for each
// daemon to send and for the poll to parse.
constexpr std::array kPolledFields{"round",
                                   "phase",
                                   "policy",
                                   "target",
                                   "backups",
                                   "degree",
                                   "responders",
                                   "suspects",
                                   "cutoffs",
                                   "loss",
                                   "accuracy",
                                   "consensus_distance",
                                   "rounds_per_s",
                                   "last_checkpoint_round",
                                   "topology",
                                   "topology_hash",
                                   "uptime_s",
                                   "version",
                                   "rejects",
                                   "discarded",
                                   "bytes_sent",
                                   "bytes_received",
                                   "sent_bytes_per_sample",
                                   "trainer",
                                   "neighbors.id",
                                   "neighbors.state",
                                   "neighbors.last_round",
                                   "neighbors.median_arrival_ms",
                                   "neighbors.on_time",
                                   "neighbors.late",
                                   "neighbors.rejected",
                                   "neighbors.bytes_per_s"};

struct DashboardOptions {
  std::string topology;
  std::string listen = "127.0.0.1:8080";
  bool remote = false;
  int refreshMs = 1000;
  double keepS = 300;
};

// The number after "since=" in a target's query, or -1.
double sinceOf(const std::string& target) {
  const std::size_t at = target.find("since=");
  if (at == std::string::npos) return -1;
  try {
    return std::stod(target.substr(at + 6));
  } catch (const std::exception&) {
    return -1;
  }
}

bool loopback(const std::string& listen) {
  boost::system::error_code error;
  const auto address = boost::asio::ip::make_address(listenHost(listen), error);
  return !error && address.is_loopback();
}

int runDashboard(const DashboardOptions& o) {
  if (o.refreshMs < 200 || o.refreshMs > 60000)
    throw UsageError("--refresh-ms: " + std::to_string(o.refreshMs) + " is not in [200, 60000]");
  if (!loopback(o.listen) && !o.remote) {
    throw UsageError("--listen " + o.listen +
                     ": not a loopback address; the page shows every node's status to whoever "
                     "reaches it: add --remote to mean it");
  }
  const topology::Topology graph = topology::loadTopology(o.topology);
  // SIGINT and SIGTERM end the poll loop's wait (blocked before any thread starts).
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  std::mutex mutex;
  ClusterView view(graph, o.keepS, o.refreshMs);
  std::optional<DashboardServer> server;
  try {
    server.emplace(o.listen, [&](const std::string& target) -> HttpAnswer {
      const std::string path = target.substr(0, target.find('?'));
      if (path == "/" || path == "/index.html")
        return {200, "text/html; charset=utf-8", std::string(kDashboardHtml)};
      if (path == "/dashboard.js")
        return {200, "text/javascript; charset=utf-8", std::string(kDashboardJs)};
      if (path == "/dashboard.css")
        return {200, "text/css; charset=utf-8", std::string(kDashboardCss)};
      if (path == "/api/cluster") {
        const std::lock_guard lock(mutex);
        return {200, "application/json", view.toJson(sinceOf(target))};
      }
      return {404, "text/plain", "not found: try / or /api/cluster\n"};
    });
  } catch (const std::runtime_error& e) {
    std::cerr << "consensusctl dashboard: " << e.what() << "\n";
    return kExitUnavailable;
  }
  const std::string host = o.listen.substr(0, o.listen.rfind(':'));
  std::cout << "dashboard of " << graph.name() << " (" << graph.size() << " nodes) at http://"
            << host << ":" << server->port() << "/" << std::endl;

  const nlohmann::json poll = {{"cmd", "status"}, {"fields", kPolledFields}};
  // One connection per node, kept from poll to poll.
  std::vector<StatusConnection> nodes;
  for (std::size_t i = 0; i < graph.size(); ++i) {
    const topology::NodeSpec& node = graph.node(i);
    nodes.emplace_back(node.status.empty() ? "/run/consensusd/" + node.id + ".sock" : node.status);
  }
  // All nodes are asked at once; on a busy machine, answers can take a while.
  const auto answerWithin = std::chrono::milliseconds(std::max(500, o.refreshMs / 2));
  const auto started = std::chrono::steady_clock::now();
  for (;;) {
    const auto pollStart = std::chrono::steady_clock::now();
    // A node that is not running, or not answering, has none: the view shows it so.
    std::vector<std::optional<std::string>> statuses = askEach(nodes, poll, answerWithin);
    {
      const std::lock_guard lock(mutex);
      view.update(
          std::move(statuses),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    }
    const auto next = pollStart + std::chrono::milliseconds(o.refreshMs);
    const auto wait = std::max(next - std::chrono::steady_clock::now(),
                               std::chrono::steady_clock::duration::zero());
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count();
    const timespec timeout{static_cast<std::time_t>(ns / 1'000'000'000),
                           static_cast<long>(ns % 1'000'000'000)};
    if (sigtimedwait(&stop, nullptr, &timeout) > 0) return kExitOk;
  }
}

}  // namespace

void addDashboardCommand(CLI::App& parent, std::function<int()>& action) {
  auto o = std::make_shared<DashboardOptions>();
  CLI::App* cmd = parent.add_subcommand(
      "dashboard", "A live web page of every node of a topology (read-only; docs/dashboard.md)");
  cmd->add_option("topology", o->topology, "Topology file (status paths from its nodes)")
      ->required();
  cmd->add_option("--listen", o->listen, "HOST:PORT to serve the page on (port 0: any free one)")
      ->capture_default_str();
  cmd->add_flag("--remote", o->remote, "Allow a --listen address other than loopback");
  cmd->add_option("--refresh-ms", o->refreshMs, "Milliseconds between polls of the nodes")
      ->capture_default_str();
  cmd->add_option("--keep-s", o->keepS, "Seconds of time series kept")
      ->capture_default_str()
      ->check(CLI::Range(10.0, 86400.0));
  cmd->callback([o, &action] { action = [o] { return runDashboard(*o); }; });
}

}  // namespace consensusd::cli
