// The dashboard's parts without a cluster: the graph layout, the view fed
// status answers by hand, and the HTTP server under hostile clients.

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "consensusd/topology/generators.hpp"
#include "dashboard_layout.hpp"
#include "dashboard_server.hpp"
#include "dashboard_view.hpp"
#include "process.hpp"

using consensusd::cli::ClusterView;
using consensusd::cli::DashboardServer;
using consensusd::cli::HttpAnswer;
using consensusd::cli::layoutGraph;
using consensusd::testing::waitFor;
using nlohmann::json;
namespace topology = consensusd::topology;
using namespace std::chrono_literals;

namespace {

topology::Topology generated(const std::string& kind, std::size_t nodes, std::size_t rows = 0) {
  topology::GeneratorOptions o;
  o.kind = kind;
  o.nodes = nodes;
  o.degree = 3;
  if (rows > 0) {
    o.rows = rows;
    o.cols = nodes / rows;
  }
  return topology::Topology::fromSpec(topology::generate(o), "<test>");
}

double distance(const consensusd::cli::Layout& l, std::size_t a, std::size_t b) {
  return std::hypot(l.x[a] - l.x[b], l.y[a] - l.y[b]);
}

// A status answer as a node gives it, with only what the view reads.
json status(const std::string& id, std::int64_t round, const std::string& phase = "waiting") {
  return {{"ok", true},
          {"node", id},
          {"round", round},
          {"phase", phase},
          {"accuracy", 0.5},
          {"loss", 1.0},
          {"target", 1},
          {"rounds_per_s", 10.0},
          {"bytes_sent", 0},
          {"bytes_received", 0},
          {"cutoffs", json::object()},
          {"neighbors", json::array()}};
}

json neighbor(const std::string& id, const std::string& state, std::uint64_t onTime,
              std::uint64_t late) {
  return {{"id", id}, {"state", state}, {"on_time", onTime}, {"late", late}};
}

// The answer lines of one poll, as the sockets gave them.
std::vector<std::optional<std::string>> lines(std::initializer_list<std::optional<json>> statuses) {
  std::vector<std::optional<std::string>> out;
  for (const std::optional<json>& s : statuses)
    out.push_back(s ? std::optional(s->dump() + "\n") : std::nullopt);
  return out;
}

json pageOf(const ClusterView& view, double since) {
  return json::parse(view.toJson(since));
}

json nodeOf(const json& data, const std::string& id) {
  for (const json& n : data["nodes"])
    if (n["id"] == id) return n;
  return {};
}

// One raw HTTP exchange: sends `request`, returns all the server sends back.
std::string exchange(std::uint16_t port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  std::size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may close early (a head too large)
    sent += static_cast<std::size_t>(n);
  }
  std::string answer;
  char buffer[4096];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;)
    answer.append(buffer, static_cast<std::size_t>(n));
  ::close(fd);
  return answer;
}

int connectIdle(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  return fd;
}

HttpAnswer hello(const std::string& target) {
  return {200, "text/plain", "hello " + target + "\n"};
}

}  // namespace

TEST_CASE("layout: a ring is a circle in its cycle order, whatever the node order") {
  // A ring written out of order: n0 - n2 - n1 - n3 - n0.
  topology::TopologySpec spec;
  spec.name = "shuffled";
  for (int i = 0; i < 4; ++i) {
    topology::NodeSpec node;
    node.id = "n" + std::to_string(i);
    node.endpoint = "tcp://127.0.0.1:" + std::to_string(7000 + i);
    spec.nodes.push_back(node);
  }
  for (const auto& [a, b] : {std::pair{"n0", "n2"}, {"n2", "n1"}, {"n1", "n3"}, {"n3", "n0"}}) {
    topology::EdgeSpec edge;
    edge.from = a;
    edge.to = b;
    spec.edges.push_back(edge);
  }
  const auto layout = layoutGraph(topology::Topology::fromSpec(spec, "<test>"));
  CHECK(layout.kind == "ring");
  for (std::size_t i = 0; i < 4; ++i)
    CHECK(std::hypot(layout.x[i] - 0.5, layout.y[i] - 0.5) == doctest::Approx(0.45));
  // Neighbours on the ring are next to each other; n0 and n1 are opposite.
  CHECK(distance(layout, 0, 2) == doctest::Approx(distance(layout, 2, 1)));
  CHECK(distance(layout, 0, 1) == doctest::Approx(0.9));
  CHECK(layout.x[0] == doctest::Approx(0.5));  // the first node at the top
  CHECK(layout.y[0] == doctest::Approx(0.05));
}

TEST_CASE("layout: a torus is a grid, anything else a force layout inside the square") {
  const auto grid = layoutGraph(generated("torus", 12, 3));
  CHECK(grid.kind == "grid");
  CHECK(grid.x[1] > grid.x[0]);
  CHECK(grid.y[1] == doctest::Approx(grid.y[0]));
  CHECK(grid.y[4] > grid.y[0]);  // row 1 below row 0 (4 columns)
  CHECK(grid.x[4] == doctest::Approx(grid.x[0]));

  const topology::Topology random = generated("random-regular", 16);
  const auto force = layoutGraph(random);
  CHECK(force.kind == "force");
  std::set<std::pair<double, double>> places;
  for (std::size_t i = 0; i < random.size(); ++i) {
    CHECK(force.x[i] >= 0.05 - 1e-9);
    CHECK(force.x[i] <= 0.95 + 1e-9);
    CHECK(force.y[i] >= 0.05 - 1e-9);
    CHECK(force.y[i] <= 0.95 + 1e-9);
    places.insert({std::round(force.x[i] * 100), std::round(force.y[i] * 100)});
  }
  CHECK(places.size() == random.size());  // no two nodes on one spot
  // Neighbours end closer than the average pair.
  double edges = 0;
  for (const topology::Edge& e : random.edges()) edges += distance(force, e.from, e.to);
  edges /= static_cast<double>(random.edges().size());
  double pairs = 0;
  std::size_t count = 0;
  for (std::size_t a = 0; a < random.size(); ++a)
    for (std::size_t b = a + 1; b < random.size(); ++b, ++count) pairs += distance(force, a, b);
  CHECK(edges < 0.8 * pairs / static_cast<double>(count));
  // The same graph, the same picture.
  const auto again = layoutGraph(random);
  CHECK(again.x == force.x);
  CHECK(again.y == force.y);
}

TEST_CASE("view: never started, stopped, suspect and training nodes, and their lag") {
  const topology::Topology ring = generated("ring", 4);
  ClusterView view(ring, 300);
  json n0 = status("n0", 100);
  n0["neighbors"] = {neighbor("n1", "fresh", 5, 0), neighbor("n3", "suspect", 0, 0)};
  view.update(lines({n0, status("n1", 98, "idle"), status("n2", 90, "paused"), std::nullopt}), 1.0);
  json data = pageOf(view, -1);
  CHECK(data["newest_round"] == 100);
  CHECK(data["layout"] == "ring");
  CHECK(nodeOf(data, "n0")["state"] == "waiting");
  CHECK(nodeOf(data, "n1")["state"] == "training");
  CHECK(nodeOf(data, "n1")["lag"] == 2);
  CHECK(nodeOf(data, "n2")["state"] == "paused");
  CHECK(nodeOf(data, "n3")["state"] == "not started");
  CHECK(nodeOf(data, "n3")["status"].is_null());

  // n3 answers once, then not: stopped. n1 is reported suspect by n0.
  view.update(lines({n0, status("n1", 98), status("n2", 90), status("n3", 99)}), 2.0);
  n0["neighbors"] = {neighbor("n1", "suspect", 5, 0), neighbor("n3", "fresh", 0, 0)};
  view.update(lines({n0, status("n1", 98), status("n2", 90), std::nullopt}), 3.0);
  data = pageOf(view, -1);
  CHECK(nodeOf(data, "n3")["state"] == "stopped");
  CHECK(nodeOf(data, "n1")["state"] == "suspect");
  // An error answer counts as none.
  view.update(lines({n0, status("n1", 98), json{{"ok", false}, {"error", "x"}}, std::nullopt}),
              4.0);
  CHECK(nodeOf(pageOf(view, -1), "n2")["state"] == "stopped");
}

TEST_CASE("view: a status socket's answer of any shape is shown as far as it makes sense") {
  // Whatever listens on a status path is trusted for nothing: fields of the
  // wrong type count as absent, and nothing ends the poll loop.
  const topology::Topology ring = generated("ring", 3);
  ClusterView view(ring, 100);
  json n0 = status("n0", 10);
  n0["neighbors"] = {1, "n1", json{{"id", 7}, {"state", "suspect"}},
                     json{{"id", "n2"}, {"state", "suspect"}, {"on_time", "many"}, {"late", -3}}};
  n0["bytes_sent"] = "lots";
  n0["cutoffs"] = {{"count", "x"}, {"timeout", -1}};
  n0["phase"] = 5;
  json n1 = status("n1", 9);
  n1["round"] = "nine";
  n1["ok"] = "yes";  // not true: an error answer
  CHECK_NOTHROW(view.update(lines({n0, json::array({1, 2}), json("status")}), 1.0));
  CHECK_NOTHROW(view.update(lines({n0, n1, json{{"neighbors", "none"}}}), 2.0));
  const json data = pageOf(view, -1);
  CHECK(nodeOf(data, "n0")["state"] == "");  // no phase it knows
  CHECK(nodeOf(data, "n1")["state"] == "not started");
  CHECK(nodeOf(data, "n1")["status"].is_null());
  CHECK(nodeOf(data, "n2")["state"] == "suspect");  // n0's entry for it says so
  CHECK(nodeOf(data, "n2")["lag"].is_null());       // no round: no lag
  CHECK(data["newest_round"] == 10);
}

TEST_CASE("view: the page carries each status as the node sent it, one page a poll for all") {
  const topology::Topology ring = generated("ring", 3);
  ClusterView view(ring, 100, 2000);
  json n0 = status("n0", 7);
  n0["note"] = "caf\u00e9 \"quoted\" \\ <b>";
  n0["rounds_per_s"] = 1e-7;
  // Lines that are not a status object: not JSON, cut short, a number.
  view.update({n0.dump() + "\r\n", std::string("not json\n"), std::string("{\"ok\":true\n")}, 1.0);
  view.update({n0.dump() + "\n", std::string("42\n"), std::nullopt}, 2.0);
  const std::string text = view.toJson(-1);
  const json data = json::parse(text);
  CHECK(nodeOf(data, "n0")["status"] == n0);
  CHECK(nodeOf(data, "n1")["state"] == "not started");
  CHECK(nodeOf(data, "n2")["state"] == "not started");
  CHECK(data["refresh_ms"] == 2000);
  CHECK(data["keep_s"] == 100);
  CHECK(nodeOf(data, "n0")["series"]["t"] == json{1.0, 2.0});
  CHECK(nodeOf(data, "n0")["series"]["rounds_per_s"][1] == 1e-7);
  // Asked again with the same `since` before the next poll: the same page.
  CHECK(view.toJson(-1) == text);
  CHECK(nodeOf(pageOf(view, 1), "n0")["series"]["t"] == json{2.0});
  CHECK(view.toJson(-1) == text);
  view.update({n0.dump() + "\n", std::nullopt, std::nullopt}, 3.0);
  CHECK(nodeOf(pageOf(view, -1), "n0")["series"]["t"] == json{1.0, 2.0, 3.0});
}

TEST_CASE("view: edges' share in time over the last minute, series since a time") {
  const topology::Topology ring = generated("ring", 3);
  ClusterView view(ring, 100);
  const auto poll = [&](double t, std::uint64_t onTime, std::uint64_t late, double bytes,
                        std::uint64_t byCount, std::uint64_t byTimeout) {
    json n0 = status("n0", static_cast<std::int64_t>(t));
    n0["neighbors"] = {neighbor("n1", "fresh", onTime, late), neighbor("n2", "fresh", 0, 0)};
    n0["bytes_sent"] = bytes;
    n0["cutoffs"] = {{"count", byCount}, {"timeout", byTimeout}};
    view.update(lines({n0, status("n1", 1), status("n2", 1)}), t);
  };
  poll(0, 10, 0, 0, 10, 0);
  poll(30, 40, 10, 3000, 30, 10);  // since t=0: 30 on time, 10 late; 30 rounds, 10 by timeout
  json data = pageOf(view, -1);
  for (const json& e : data["edges"]) {
    if (e["from"] == "n1" && e["to"] == "n0") CHECK(e["in_time"] == doctest::Approx(0.75));
    if (e["from"] == "n2" && e["to"] == "n0") CHECK(e["in_time"].is_null());  // nothing came
    if (e["to"] == "n1") CHECK(e["in_time"].is_null());                       // n1 says nothing
  }
  json series = nodeOf(data, "n0")["series"];
  CHECK(series["t"] == json{0.0, 30.0});
  CHECK(series["bytes_per_s"][0].is_null());
  CHECK(series["bytes_per_s"][1] == doctest::Approx(100.0));
  CHECK(series["timeout_share"][1] == doctest::Approx(1.0 / 3));
  // Only the points after `since`; after a minute the old counts leave the window.
  poll(95, 140, 10, 3000, 30, 10);
  data = pageOf(view, 30);
  CHECK(nodeOf(data, "n0")["series"]["t"] == json{95.0});
  for (const json& e : data["edges"])
    if (e["from"] == "n1" && e["to"] == "n0") CHECK(e["in_time"].is_null());  // one point left
  // Points older than the kept 100 s go.
  poll(150, 150, 10, 3000, 30, 10);
  CHECK(nodeOf(pageOf(view, -1), "n0")["series"]["t"] == json{95.0, 150.0});
}

TEST_CASE("dashboard server: GET answers, anything else is refused") {
  DashboardServer server("127.0.0.1:0", hello);
  const std::string ok =
      exchange(server.port(), "GET /api/cluster?since=1 HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(ok.rfind("HTTP/1.1 200 OK", 0) == 0);
  CHECK(ok.find("hello /api/cluster?since=1") != std::string::npos);
  const std::string post =
      exchange(server.port(), "POST /api/cluster HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
  CHECK(post.rfind("HTTP/1.1 405", 0) == 0);
  // A body, or a head past 8 KiB: refused, not read.
  const std::string body =
      exchange(server.port(), "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
  CHECK(body.rfind("HTTP/1.1 400", 0) == 0);
  const std::string huge = exchange(
      server.port(), "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n");
  CHECK(huge.rfind("HTTP/1.1 431", 0) == 0);
  CHECK(exchange(server.port(), "not http at all\r\n\r\n").rfind("HTTP/1.1 400", 0) == 0);
  // A handler that throws answers 500; the server goes on.
  DashboardServer failing(
      "127.0.0.1:0", [](const std::string&) -> HttpAnswer { throw std::runtime_error("broken"); });
  CHECK(exchange(failing.port(), "GET / HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 500", 0) == 0);
  CHECK(exchange(failing.port(), "GET / HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 500", 0) == 0);
  CHECK_THROWS_AS(DashboardServer("127.0.0.1:" + std::to_string(server.port()), hello),
                  std::runtime_error);  // taken
  CHECK_THROWS_AS(DashboardServer("nowhere", hello), std::runtime_error);
}

TEST_CASE("dashboard server: slow clients are cut off, many connections cost no service") {
  DashboardServer::Limits limits;
  limits.timeout = 300ms;
  limits.connections = 50;
  DashboardServer server("127.0.0.1:0", hello, limits);
  // A client that sends half a request and stalls: closed after the timeout.
  const int slow = connectIdle(server.port());
  REQUIRE(::send(slow, "GET / HT", 8, MSG_NOSIGNAL) == 8);
  char byte;
  CHECK(::recv(slow, &byte, 1, 0) == 0);  // blocks until the server closes it
  ::close(slow);
  // 40 idle connections: the server still answers.
  std::vector<int> idle;
  for (int i = 0; i < 40; ++i) idle.push_back(connectIdle(server.port()));
  CHECK(exchange(server.port(), "GET / HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200", 0) == 0);
  // 100 more than it keeps: those past the limit are closed at once and counted.
  for (int i = 0; i < 100; ++i) idle.push_back(connectIdle(server.port()));
  CHECK(waitFor([&] { return server.refused() > 0; }, 5s));
  for (const int fd : idle) ::close(fd);
  // Once they are gone (or timed out), it serves again.
  CHECK(waitFor(
      [&] {
        return exchange(server.port(), "GET / HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200", 0) == 0;
      },
      5s));
}
