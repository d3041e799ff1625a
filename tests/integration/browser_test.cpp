// consensusctl dashboard in a real browser (Debian's chromium, headless)
// over a live 4-node cluster: the page loads without console messages,
// shows every node and edge with the values the nodes' status sockets
// give, turns a stopped node to its stopped state, and renders (a
// screenshot, dashboard-4-nodes.png in the test's folder).

#include <doctest/doctest.h>
#include <signal.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "cluster.hpp"
#include "cluster_status.hpp"

using consensusd::testing::answers;
using consensusd::testing::ask;
using consensusd::testing::Child;
using consensusd::testing::Cluster;
using consensusd::testing::kFast;
using consensusd::testing::readText;
using consensusd::testing::runProcess;
using consensusd::testing::waitFor;
using consensusd::testing::with;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

const char* const kChromium = "/usr/bin/chromium";

struct Page {
  std::string dom;
  std::string console;  // every console line chromium logged
};

// Loads `url` in a headless chromium and lets its scripts run for a few
// seconds of virtual time; with `screenshot`, writes one there instead.
Page load(const Cluster& cluster, const std::string& url, const std::string& screenshot = {}) {
  std::vector<std::string> argv{kChromium,
                                "--headless",
                                "--no-sandbox",  // root in CI; the page is ours
                                "--disable-gpu",
                                "--user-data-dir=" + cluster.path("chromium"),
                                "--enable-logging=stderr",
                                "--v=0",
                                "--window-size=1400,1300",
                                "--virtual-time-budget=5000"};
  argv.push_back(screenshot.empty() ? "--dump-dom" : "--screenshot=" + screenshot);
  argv.push_back(url);
  const auto result = runProcess(argv, "", 120s);
  INFO(result.err);
  REQUIRE(result.exitCode == 0);
  Page page{result.out, ""};
  std::istringstream err(result.err);
  for (std::string line; std::getline(err, line);)
    if (line.find(":CONSOLE") != std::string::npos) page.console += line + "\n";
  return page;
}

// The value of `attribute` on the graph's node `id` in the DOM ("" if none).
std::string nodeAttribute(const std::string& dom, const std::string& id,
                          const std::string& attribute) {
  const std::regex element("<g [^>]*data-node=\"" + id + "\"[^>]*>");
  std::smatch found;
  if (!std::regex_search(dom, found, element)) return "";
  const std::regex value(attribute + "=\"([^\"]*)\"");
  std::smatch v;
  const std::string tag = found.str();
  return std::regex_search(tag, v, value) ? v[1].str() : "";
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("the dashboard in chromium: every node and edge, the nodes' values, a stopped node") {
  if (!std::filesystem::exists(kChromium)) {
    MESSAGE("skipped: chromium is missing (scripts/bootstrap installs it)");
    return;
  }
  Cluster cluster(4, with(kFast, {"train.rounds=0", "train.eval_every_rounds=100"}));
  cluster.startAll();
  REQUIRE(waitFor(
      [&] {
        for (std::size_t i = 0; i < 4; ++i)
          if (!answers(cluster, i)) return false;
        return true;
      },
      60s));
  Child dashboard({CONSENSUSCTL, "dashboard", cluster.path("topology.yaml"), "--listen",
                   "127.0.0.1:0", "--refresh-ms", "300"},
                  cluster.path("dashboard.log"));
  std::string url;
  REQUIRE(waitFor(
      [&] {
        std::smatch found;
        const std::string log = readText(cluster.path("dashboard.log"));
        if (!std::regex_search(log, found, std::regex("at (http://127\\.0\\.0\\.1:[0-9]+/)")))
          return false;
        url = found[1];
        return true;
      },
      30s));
  INFO(readText(cluster.path("dashboard.log")));

  // Paused, the nodes' figures hold still: the page must show exactly what
  // `consensusctl status` says, once the dashboard has polled since the
  // pause (a loaded machine may take a few of its 300 ms polls).
  for (std::size_t i = 0; i < 4; ++i) REQUIRE(ask(cluster, i, {{"cmd", "pause"}})["ok"] == true);
  REQUIRE(waitFor(
      [&] {
        for (std::size_t i = 0; i < 4; ++i)
          if (ask(cluster, i, {{"cmd", "status"}})["phase"] != "paused") return false;
        return true;
      },
      30s));
  Page paused;
  REQUIRE(waitFor(
      [&] {
        paused = load(cluster, url);
        for (std::size_t i = 0; i < 4; ++i)
          if (nodeAttribute(paused.dom, Cluster::id(i), "data-state") != "paused") return false;
        return count(paused.dom, "<polyline") > 0;  // two polls or more: a series to draw
      },
      60s));
  CHECK_MESSAGE(paused.console.empty(), paused.console);
  CHECK(paused.dom.find("4 nodes") != std::string::npos);
  for (std::size_t i = 0; i < 4; ++i) {
    const std::string id = Cluster::id(i);
    CAPTURE(id);
    const auto status =
        runProcess({CONSENSUSCTL, "status", "--socket", cluster.socket(i), "--json"});
    REQUIRE(status.exitCode == 0);
    const json s = json::parse(status.out);
    CHECK(nodeAttribute(paused.dom, id, "data-round") ==
          std::to_string(s["round"].get<std::int64_t>()));
    CHECK(paused.dom.find("<tr data-node=\"" + id + "\"") != std::string::npos);
  }
  CHECK(count(paused.dom, "data-from=\"n") == 8);  // 4 edges, each way

  // Training again, one node stopped: shown as stopped, the rest go on.
  for (std::size_t i = 0; i < 4; ++i) REQUIRE(ask(cluster, i, {{"cmd", "resume"}})["ok"] == true);
  cluster.child(2).signal(SIGTERM);
  REQUIRE(cluster.child(2).wait(30s).has_value());
  Page stopped;
  REQUIRE(waitFor(
      [&] {
        stopped = load(cluster, url);
        return nodeAttribute(stopped.dom, "n2", "data-state") == "stopped";
      },
      60s));
  CHECK_MESSAGE(stopped.console.empty(), stopped.console);
  CHECK(nodeAttribute(stopped.dom, "n0", "data-state") != "stopped");

  // It renders: a screenshot of real content (a blank page compresses to a few kB).
  const std::string screenshot = std::filesystem::absolute("dashboard-4-nodes.png").string();
  std::filesystem::remove(screenshot);
  load(cluster, url, screenshot);
  REQUIRE(std::filesystem::exists(screenshot));
  CHECK(std::filesystem::file_size(screenshot) > 30000);
  MESSAGE("screenshot: " << screenshot << " (" << std::filesystem::file_size(screenshot)
                         << " bytes)");
  dashboard.signal(SIGTERM);
  CHECK(dashboard.wait(10s) == 0);
}
