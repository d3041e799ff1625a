// The trainer endpoint on its own: a raw Unix-socket client speaks the line
// protocol, maps the region it is handed and writes updates into it.

#include "trainer/trainer_endpoint.hpp"

#include <doctest/doctest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "process.hpp"

using namespace consensusd;
using consensusd::daemon::TrainerEndpoint;
using consensusd::daemon::TrainerUpdate;
using consensusd::testing::TempDir;
using json = nlohmann::json;

namespace {

constexpr std::size_t kDimension = 4;

struct Client {
  int fd = -1;
  int regionFd = -1;
  float* region = nullptr;
  std::string pending;

  explicit Client(const std::string& path) {
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
    REQUIRE(::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
  }
  ~Client() {
    if (region != nullptr) ::munmap(region, 3 * kDimension * sizeof(float));
    if (regionFd >= 0) ::close(regionFd);
    ::close(fd);
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  void send(const json& message) const {
    const std::string line = message.dump() + "\n";
    REQUIRE(::send(fd, line.data(), line.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(line.size()));
  }
  // One line, and a descriptor if one came with it (the region).
  json receive(TrainerEndpoint& endpoint) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (pending.find('\n') == std::string::npos) {
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      serve(endpoint);
      std::array<char, 512> buffer{};
      iovec io{buffer.data(), buffer.size()};
      alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int))> control{};
      msghdr message{};
      message.msg_iov = &io;
      message.msg_iovlen = 1;
      message.msg_control = control.data();
      message.msg_controllen = control.size();
      const ssize_t got = ::recvmsg(fd, &message, MSG_DONTWAIT);
      if (got <= 0) continue;
      if (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr)
        std::memcpy(&regionFd, CMSG_DATA(header), sizeof(int));
      pending.append(buffer.data(), static_cast<std::size_t>(got));
    }
    const std::string line = pending.substr(0, pending.find('\n'));
    pending.erase(0, line.size() + 1);
    return json::parse(line);
  }
  // The hello of a float32 trainer of kDimension parameters, and the answer.
  json hello(TrainerEndpoint& endpoint) {
    send({{"type", "hello"}, {"dimension", kDimension}, {"dtype", "float32"}});
    return receive(endpoint);
  }
  std::optional<TrainerUpdate> serve(TrainerEndpoint& endpoint) const {
    std::vector<zmq::pollitem_t> items;
    endpoint.append(items);
    zmq::poll(items, std::chrono::milliseconds(10));
    return endpoint.serve(items);
  }
  void map() {
    REQUIRE(regionFd >= 0);
    void* mapped = ::mmap(nullptr, 3 * kDimension * sizeof(float), PROT_READ | PROT_WRITE,
                          MAP_SHARED, regionFd, 0);
    REQUIRE(mapped != MAP_FAILED);
    region = static_cast<float*>(mapped);
  }
};

daemon::TrainerOptions options(const TempDir& dir) {
  daemon::TrainerOptions o;
  o.socket = dir.path() + "/t.sock";
  o.dimension = kDimension;
  return o;
}

std::span<const std::byte> bytesOf(const std::vector<float>& v) {
  return std::as_bytes(std::span(v));
}

// Serves until an update comes (or five seconds pass).
std::optional<TrainerUpdate> nextUpdate(const Client& client, TrainerEndpoint& endpoint) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline)
    if (auto update = client.serve(endpoint)) return update;
  return std::nullopt;
}

}  // namespace

TEST_CASE("trainer endpoint: x_k through the region, the update back, NaN refused") {
  TempDir dir;
  TrainerEndpoint endpoint(options(dir));
  endpoint.expectInitialParams();
  Client client(dir.path() + "/t.sock");
  client.send({{"type", "hello"}, {"dimension", kDimension}, {"dtype", "float32"}});
  const json welcome = client.receive(endpoint);
  CHECK(welcome["type"] == "welcome");
  CHECK(welcome["fresh"] == true);
  CHECK(welcome["region_bytes"] == 3 * kDimension * sizeof(float));
  client.map();

  // A fresh start: the trainer's x_0 is taken once.
  for (std::size_t k = 0; k < kDimension; ++k) client.region[k] = 0.5f;
  client.send({{"type", "init"}});
  std::optional<std::vector<std::byte>> initial;
  for (int i = 0; i < 500 && !initial; ++i) {
    client.serve(endpoint);
    initial = endpoint.takeInitialParams();
  }
  REQUIRE(initial.has_value());
  CHECK(initial->size() == kDimension * sizeof(float));
  CHECK_FALSE(endpoint.takeInitialParams().has_value());

  endpoint.publish(3, bytesOf({1, 2, 3, 4}));
  CHECK(client.receive(endpoint) == json({{"type", "round"}, {"round", 3}}));
  CHECK(client.region[2] == 3.0f);  // x_3, shared

  for (std::size_t k = 0; k < kDimension; ++k) client.region[kDimension + k] = -1.0f;
  client.region[kDimension + 1] = std::numeric_limits<float>::quiet_NaN();
  client.send({{"type", "update"}, {"round", 3}, {"kind", "gradient"}, {"loss", 1.5}});
  CHECK(client.receive(endpoint) == json({{"type", "rejected"}, {"reason", "non_finite"}}));
  client.send({{"type", "update"}, {"round", 2}, {"kind", "gradient"}, {"loss", 1.5}});
  CHECK(client.receive(endpoint)["type"] == "rejected");  // not the round it was given

  client.region[kDimension + 1] = -1.0f;
  client.send(
      {{"type", "update"}, {"round", 3}, {"kind", "delta"}, {"loss", 1.5}, {"accuracy", 0.25}});
  const auto update = nextUpdate(client, endpoint);
  REQUIRE(update.has_value());
  CHECK(update->round == 3);
  CHECK(update->kind == consensus::UpdateKind::Delta);
  CHECK(update->loss == 1.5);
  CHECK(update->accuracy == std::optional<double>(0.25));
  CHECK(reinterpret_cast<const float*>(update->values.data())[1] == -1.0f);
  const auto status = endpoint.status();
  CHECK(status.attached);
  CHECK(status.pid == ::getpid());
  CHECK(status.updates == 1);
  CHECK(status.rejectedUpdates == 2);
}

TEST_CASE("trainer endpoint: one trainer at a time, and it must match the node") {
  TempDir dir;
  TrainerEndpoint endpoint(options(dir));
  Client first(dir.path() + "/t.sock");
  first.send({{"type", "hello"}, {"dimension", kDimension}, {"dtype", "float32"}});
  CHECK(first.receive(endpoint)["fresh"] == false);  // nothing to initialise: not asked

  Client second(dir.path() + "/t.sock");
  const json refused = second.receive(endpoint);
  CHECK(refused["type"] == "error");
  CHECK(refused["message"].get<std::string>().find("another trainer") != std::string::npos);

  ::shutdown(first.fd, SHUT_RDWR);  // gone: the next may attach
  for (int i = 0; i < 50 && endpoint.status().attached; ++i) first.serve(endpoint);
  CHECK_FALSE(endpoint.status().attached);
  Client wrong(dir.path() + "/t.sock");
  wrong.send({{"type", "hello"}, {"dimension", kDimension}, {"dtype", "float64"}});
  const json mismatch = wrong.receive(endpoint);
  CHECK(mismatch["message"] == "this node trains 4 float32 parameters; the trainer has 4 float64");
  CHECK(endpoint.status().refused == 2);
}

TEST_CASE("trainer endpoint: a trainer replacing one that just died is taken, not refused") {
  // A restarted trainer (torchrun, systemd) connects as soon as the old one
  // is gone: the old connection's end must count before the new one knocks.
  TempDir dir;
  TrainerEndpoint endpoint(options(dir));
  auto first = std::make_unique<Client>(dir.path() + "/t.sock");
  CHECK(first->hello(endpoint)["type"] == "welcome");
  first.reset();  // closed, not yet served
  Client second(dir.path() + "/t.sock");
  CHECK(second.hello(endpoint)["type"] == "welcome");
  CHECK(endpoint.status().attached);
  CHECK(endpoint.status().refused == 0);
}

TEST_CASE("trainer endpoint: a trainer found gone by a send leaves the round for the next one") {
  // A trainer killed between two rounds: the daemon learns it when the next
  // round's announcement fails, and that round must still go to its successor.
  TempDir dir;
  TrainerEndpoint endpoint(options(dir));
  auto first = std::make_unique<Client>(dir.path() + "/t.sock");
  CHECK(first->hello(endpoint)["type"] == "welcome");
  first.reset();
  endpoint.publish(5, bytesOf({1, 2, 3, 4}));  // its send fails: detached here
  CHECK_FALSE(endpoint.status().attached);
  Client second(dir.path() + "/t.sock");
  CHECK(second.hello(endpoint)["type"] == "welcome");
  const json round = second.receive(endpoint);
  CHECK(round["type"] == "round");
  CHECK(round["round"] == 5);
}

TEST_CASE("trainer endpoint: fields of the wrong type or out of range are rejected, not thrown") {
  TempDir dir;
  TrainerEndpoint endpoint(options(dir));
  {
    Client typed(dir.path() + "/t.sock");  // a hello whose type is not a string
    typed.send({{"type", 5}, {"dimension", kDimension}});
    char byte = 0;  // served until the endpoint closes the connection (recv reads EOF)
    for (int i = 0; i < 100 && ::recv(typed.fd, &byte, 1, MSG_DONTWAIT) != 0; ++i)
      typed.serve(endpoint);
    CHECK(::recv(typed.fd, &byte, 1, MSG_DONTWAIT) == 0);
    CHECK_FALSE(endpoint.status().attached);
  }
  Client client(dir.path() + "/t.sock");
  client.send({{"type", "hello"}, {"dimension", kDimension}, {"dtype", "float32"}});
  REQUIRE(client.receive(endpoint)["type"] == "welcome");
  client.map();
  endpoint.publish(7, bytesOf({1, 2, 3, 4}));
  REQUIRE(client.receive(endpoint)["type"] == "round");
  for (std::size_t k = 0; k < kDimension; ++k) client.region[kDimension + k] = 0.25f;

  const json base = {{"type", "update"}, {"round", 7}, {"kind", "gradient"}, {"loss", 0.5}};
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{
           {"round", "7"},
           {"loss", json::array({1})},
           {"kind", 3},
           {"accuracy", "high"},
           {"accuracy", 1.5},
           {"accuracy", -0.1},
           {"test_loss", -1.0},
           {"grad_variance", -1.0},
           {"samples", -1},
           {"samples", 2.5},
           {"samples", 1e12},
           {"gradient", true}}) {  // a gradient beside a gradient: only a delta has one
    json message = base;
    message[key] = value;
    client.send(message);
    const json answer = client.receive(endpoint);
    CAPTURE(message.dump());
    CHECK(answer["type"] == "rejected");
  }
  // A number too large for a double parses as infinity.
  const std::string line =
      R"({"type":"update","round":7,"kind":"gradient","loss":0.5,"test_loss":1e400})"
      "\n";
  REQUIRE(::send(client.fd, line.data(), line.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(line.size()));
  CHECK(client.receive(endpoint)["type"] == "rejected");
  // Not JSON (a bare NaN, as Python's json.dumps writes one): said so, with the parser's words.
  const std::string bare = R"({"type":"update","round":7,"kind":"gradient","loss":NaN})"
                           "\n";
  REQUIRE(::send(client.fd, bare.data(), bare.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(bare.size()));
  const json malformed = client.receive(endpoint);
  CHECK(malformed["type"] == "rejected");
  const std::string reason = malformed["reason"];
  CHECK(reason.rfind("malformed message: ", 0) == 0);
  CHECK(reason.find("parse error") != std::string::npos);
  CHECK(endpoint.status().rejectedUpdates == 14);

  json good = base;
  good["test_loss"] = 0.4;
  good["accuracy"] = 0.9;
  good["kind"] = "delta";
  good["gradient"] = true;  // slot 2: the gradient at x_k
  good["grad_variance"] = 2.5;
  good["samples"] = 128;
  client.region[2 * kDimension + 3] = std::numeric_limits<float>::infinity();
  client.send(good);
  CHECK(client.receive(endpoint) == json({{"type", "rejected"}, {"reason", "non_finite"}}));
  client.region[2 * kDimension + 3] = 7.0f;
  client.send(good);
  const auto update = nextUpdate(client, endpoint);
  REQUIRE(update.has_value());
  CHECK(update->testLoss == std::optional<double>(0.4));
  CHECK(update->accuracy == std::optional<double>(0.9));
  CHECK(update->gradVariance == 2.5);
  CHECK(update->samples == std::optional<std::uint64_t>(128));
  REQUIRE(update->gradient.size() == kDimension * sizeof(float));
  CHECK(reinterpret_cast<const float*>(update->gradient.data())[3] == 7.0f);
  CHECK(endpoint.status().attached);
}

TEST_CASE("trainer endpoint: an auto shape is the first trainer's, and its welcome waits") {
  TempDir dir;
  daemon::TrainerOptions o = options(dir);
  o.dimension = 0;
  o.dtype.reset();
  TrainerEndpoint endpoint(o);
  CHECK_FALSE(endpoint.shape().has_value());
  {
    Client odd(dir.path() + "/t.sock");  // no usable shape: refused, still open
    odd.send({{"type", "hello"}, {"dimension", 0}, {"dtype", "float32"}});
    CHECK(odd.receive(endpoint)["message"] ==
          "this node trains parameters of the first trainer's shape; the trainer has 0 float32");
    CHECK_FALSE(endpoint.shape().has_value());
  }
  Client client(dir.path() + "/t.sock");
  client.send({{"type", "hello"}, {"dimension", kDimension}, {"dtype", "float32"}});
  for (int i = 0; i < 100 && !endpoint.shape(); ++i) client.serve(endpoint);
  REQUIRE(endpoint.shape().has_value());
  CHECK(endpoint.shape()->dimension == kDimension);
  CHECK(endpoint.shape()->dtype == wire::Dtype::Float32);
  for (int i = 0; i < 10; ++i) client.serve(endpoint);
  char peek = 0;
  CHECK(::recv(client.fd, &peek, 1, MSG_DONTWAIT | MSG_PEEK) < 0);  // no welcome yet

  endpoint.expectInitialParams();  // the daemon resumed: a fresh start
  endpoint.welcomeHeld();
  const json welcome = client.receive(endpoint);
  CHECK(welcome["type"] == "welcome");
  CHECK(welcome["fresh"] == true);
  CHECK(endpoint.status().attached);

  ::shutdown(client.fd, SHUT_RDWR);
  for (int i = 0; i < 50 && endpoint.status().attached; ++i) client.serve(endpoint);
  Client other(dir.path() + "/t.sock");  // the shape is fixed now
  other.send({{"type", "hello"}, {"dimension", kDimension + 1}, {"dtype", "float32"}});
  CHECK(other.receive(endpoint)["message"] ==
        "this node trains 4 float32 parameters; the trainer has 5 float32");
}

TEST_CASE("trainer endpoint: the end of training puts the final parameters in the x slot") {
  TempDir dir;
  TrainerEndpoint endpoint(options(dir));
  Client client(dir.path() + "/t.sock");
  REQUIRE(client.hello(endpoint)["type"] == "welcome");
  client.map();
  endpoint.publish(7, bytesOf({1, 2, 3, 4}));
  REQUIRE(client.receive(endpoint)["type"] == "round");
  endpoint.end(9, bytesOf({5, 6, 7, 8}), "rounds");
  CHECK(client.receive(endpoint) == json({{"type", "end"}, {"round", 9}, {"reason", "rounds"}}));
  CHECK(std::vector<float>(client.region, client.region + kDimension) ==
        std::vector<float>{5, 6, 7, 8});
}

TEST_CASE("trainer endpoint: p95 of the update times counts the slowest of a few") {
  TempDir dir;
  TrainerEndpoint endpoint(options(dir));
  Client client(dir.path() + "/t.sock");
  REQUIRE(client.hello(endpoint)["type"] == "welcome");
  client.map();
  // Eleven updates, one of them 50 ms after its round was given: the 95th
  // percentile of eleven (nearest rank: the 11th) is that one.
  for (std::int64_t round = 0; round < 11; ++round) {
    endpoint.publish(round, bytesOf({1, 2, 3, 4}));
    REQUIRE(client.receive(endpoint)["type"] == "round");
    if (round == 4) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // its compute
    client.send({{"type", "update"}, {"round", round}, {"kind", "gradient"}, {"loss", 0.5}});
    REQUIRE(nextUpdate(client, endpoint).has_value());
  }
  const auto status = endpoint.status();
  CHECK(status.p95UpdateMs >= 50.0);
  CHECK(status.p95UpdateMs >= status.meanUpdateMs);
}
