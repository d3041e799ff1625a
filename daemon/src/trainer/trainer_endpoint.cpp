#include "trainer/trainer_endpoint.hpp"

#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "consensusd/daemon/status_server.hpp"

namespace consensusd::daemon {
namespace {

constexpr std::size_t kMaxLine = 4096;               // every message is a short JSON line
constexpr std::size_t kWindow = 100;                 // update times kept for mean and p95
constexpr std::uint64_t kMaxDimension = 1ULL << 31;  // as model.dimension's range
// The region's slots: x_k, the update, and (optional) the gradient a delta came from.
constexpr std::size_t kSlots = 3;

// An optional numeric field: absent or null is none; another type throws
// (handle() turns that into a rejected message).
std::optional<double> optionalNumber(const nlohmann::json& message, const char* key) {
  const auto it = message.find(key);
  if (it == message.end() || it->is_null()) return std::nullopt;
  return it->get<double>();
}

constexpr double kMaxSamples = 1 << 30;  // per update: any real batch, never an overflow

// Whether the process behind `fd` has `group`, as its primary group or one
// of its supplementary groups (a user added with `usermod -aG`).
bool peerInGroup(int fd, gid_t primary, gid_t group) {
  if (primary == group) return true;
  std::vector<gid_t> groups(64);
  for (;;) {
    auto length = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &length) == 0) {
      groups.resize(length / sizeof(gid_t));
      return std::find(groups.begin(), groups.end(), group) != groups.end();
    }
    if (errno != ERANGE || length / sizeof(gid_t) <= groups.size()) return false;
    groups.resize(length / sizeof(gid_t));  // the length it needs
  }
}

const char* dtypeName(wire::Dtype dtype) {
  return dtype == wire::Dtype::Float64 ? "float64" : "float32";
}

}  // namespace

TrainerEndpoint::TrainerEndpoint(TrainerOptions options) : options_(std::move(options)) {
  const std::string& path = options_.socket;
  sockaddr_un address{};
  if (path.size() >= sizeof address.sun_path)
    throw Unavailable("trainer socket path too long: " + path);
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  listenFd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listenFd_ < 0) throw Unavailable("trainer socket: " + std::string(std::strerror(errno)));
  // A socket file left by a daemon that died: nobody listens on it.
  if (::connect(listenFd_, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0) {
    ::close(listenFd_);
    throw Unavailable("trainer socket " + path + " is served by a running daemon");
  }
  ::close(listenFd_);
  listenFd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  ::unlink(path.c_str());
  if (::bind(listenFd_, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0 ||
      ::chmod(path.c_str(), 0660) != 0 || ::listen(listenFd_, 4) != 0) {
    const std::string why = std::strerror(errno);
    ::close(listenFd_);
    throw Unavailable("cannot bind trainer socket " + path + ": " + why);
  }
  // The group's members reach it through the file's group permission.
  if (options_.group && ::chown(path.c_str(), static_cast<uid_t>(-1), *options_.group) != 0) {
    const std::string why = std::strerror(errno);
    ::close(listenFd_);
    ::unlink(path.c_str());
    throw Unavailable("cannot give trainer socket " + path + " to group " +
                      std::to_string(*options_.group) + " (trainer.group): " + why +
                      "; the daemon's user must be a member");
  }
  if (shape()) {
    createRegion();
    spdlog::info("trainer socket {} ({} parameters, {})", path, options_.dimension,
                 dtypeName(*options_.dtype));
  } else {
    spdlog::info("trainer socket {}: the node trains as many parameters as its first trainer has",
                 path);
  }
}

void TrainerEndpoint::createRegion() {
  slotBytes_ = options_.dimension * wire::bytesPer(*options_.dtype);
  regionFd_ = ::memfd_create("consensusd-trainer", MFD_CLOEXEC);
  const auto bytes = static_cast<off_t>(kSlots * slotBytes_);
  void* mapped = MAP_FAILED;
  if (regionFd_ >= 0 && ::ftruncate(regionFd_, bytes) == 0)
    mapped = ::mmap(nullptr, kSlots * slotBytes_, PROT_READ | PROT_WRITE, MAP_SHARED, regionFd_, 0);
  if (mapped == MAP_FAILED) {
    const std::string why = std::strerror(errno);
    if (regionFd_ >= 0) ::close(regionFd_);
    regionFd_ = -1;
    throw Unavailable("trainer region of " + std::to_string(kSlots * slotBytes_) +
                      " bytes: " + why);
  }
  region_ = static_cast<std::byte*>(mapped);
}

std::optional<TrainerShape> TrainerEndpoint::shape() const {
  if (options_.dimension == 0 || !options_.dtype) return std::nullopt;
  return TrainerShape{options_.dimension, *options_.dtype};
}

TrainerEndpoint::~TrainerEndpoint() {
  if (trainerFd_ >= 0) ::close(trainerFd_);
  if (region_ != nullptr) ::munmap(region_, kSlots * slotBytes_);
  if (regionFd_ >= 0) ::close(regionFd_);
  if (listenFd_ >= 0) {
    ::close(listenFd_);
    ::unlink(options_.socket.c_str());
  }
}

std::span<std::byte> TrainerEndpoint::slot(std::size_t index) const {
  return {region_ + index * slotBytes_, slotBytes_};
}

void TrainerEndpoint::publish(std::int64_t round, std::span<const std::byte> params) {
  owner_.check();
  std::memcpy(slot(0).data(), params.data(), std::min(params.size(), slotBytes_));
  round_ = round;
  announced_ = false;
  publishedAt_ = std::chrono::steady_clock::now();
  announce();
}

void TrainerEndpoint::end(std::int64_t round, std::span<const std::byte> params,
                          const std::string& reason) {
  owner_.check();
  if (trainerFd_ < 0 || !welcomed_ || holdWelcome_) return;
  std::memcpy(slot(0).data(), params.data(), std::min(params.size(), slotBytes_));
  send(nlohmann::json({{"type", "end"}, {"round", round}, {"reason", reason}}).dump());
}

std::optional<std::vector<std::byte>> TrainerEndpoint::takeInitialParams() {
  owner_.check();
  std::optional<std::vector<std::byte>> out;
  out.swap(initial_);
  return out;
}

void TrainerEndpoint::welcome() {
  const bool fresh = wantInit_ && !initial_;
  send(nlohmann::json({{"type", "welcome"},
                       {"dimension", options_.dimension},
                       {"dtype", dtypeName(*options_.dtype)},
                       {"region_bytes", kSlots * slotBytes_},
                       {"fresh", fresh}})
           .dump(),
       regionFd_);
  spdlog::info("trainer attached (pid {}){}", trainerPid_,
               fresh ? ": waiting for its initial parameters" : "");
  announce();
}

void TrainerEndpoint::welcomeHeld() {
  owner_.check();
  if (!holdWelcome_) return;
  holdWelcome_ = false;
  if (trainerFd_ >= 0 && welcomed_) welcome();
}

void TrainerEndpoint::announce() {
  if (trainerFd_ < 0 || !welcomed_ || holdWelcome_ || !round_ || announced_) return;
  send(nlohmann::json({{"type", "round"}, {"round", *round_}}).dump());
  announced_ = trainerFd_ >= 0;  // a failed send detached it: the next trainer gets the round
}

void TrainerEndpoint::append(std::vector<zmq::pollitem_t>& items) {
  owner_.check();
  items.push_back({nullptr, listenFd_, ZMQ_POLLIN, 0});
  items.push_back({nullptr, trainerFd_, static_cast<short>(trainerFd_ >= 0 ? ZMQ_POLLIN : 0), 0});
}

std::optional<TrainerUpdate> TrainerEndpoint::serve(std::span<const zmq::pollitem_t> items) {
  owner_.check();
  // The attached trainer first, to its end: a replacement knocking in the
  // same poll (a restarted trainer) then finds the place free, not taken.
  std::optional<TrainerUpdate> update;
  if (trainerFd_ >= 0 && (items[1].revents & (ZMQ_POLLIN | ZMQ_POLLERR)) != 0) update = read();
  if (items[0].revents & ZMQ_POLLIN) accept();
  return update;
}

std::optional<TrainerUpdate> TrainerEndpoint::read() {
  std::array<char, 4096> buffer{};
  std::optional<TrainerUpdate> update;
  // A few reads at most: the lines each brought are handled before the
  // next, which may find the trainer's end right behind its last line.
  for (int reads = 0; reads < 4 && trainerFd_ >= 0; ++reads) {
    const ssize_t got = ::recv(trainerFd_, buffer.data(), buffer.size(), MSG_DONTWAIT);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
      detach(got == 0 ? "closed the connection" : std::strerror(errno));
      break;
    }
    if (got < 0) break;
    input_.append(buffer.data(), static_cast<std::size_t>(got));
    for (std::size_t end = input_.find('\n'); end != std::string::npos && trainerFd_ >= 0;
         end = input_.find('\n')) {
      const std::string line = input_.substr(0, end);
      input_.erase(0, end + 1);
      if (auto taken = handle(line)) update = taken;
    }
    if (trainerFd_ >= 0 && input_.size() > kMaxLine) detach("sent a line longer than 4096 bytes");
  }
  return update;
}

void TrainerEndpoint::accept() {
  const int fd = ::accept4(listenFd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) return;  // EAGAIN, or out of descriptors: the trainer retries
  ucred peer{};
  socklen_t length = sizeof peer;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0) {
    refuse(fd, 0, "cannot read the peer's credentials");
    return;
  }
  const bool allowed =
      peer.uid == ::geteuid() || (options_.group && peerInGroup(fd, peer.gid, *options_.group));
  if (!allowed) {
    refuse(fd, peer.pid,
           "uid " + std::to_string(peer.uid) +
               " may not attach: only the daemon's user or trainer.group");
    return;
  }
  if (trainerFd_ >= 0) {
    refuse(fd, peer.pid, "another trainer (pid " + std::to_string(trainerPid_) + ") is attached");
    return;
  }
  trainerFd_ = fd;
  trainerPid_ = peer.pid;
  welcomed_ = false;
  input_.clear();
}

void TrainerEndpoint::refuse(int fd, pid_t pid, const std::string& why) {
  ++counts_.refused;
  spdlog::warn("trainer (pid {}) refused: {}", pid, why);
  const std::string line = nlohmann::json({{"type", "error"}, {"message", why}}).dump() + "\n";
  [[maybe_unused]] const ssize_t n = ::send(fd, line.data(), line.size(), MSG_NOSIGNAL);
  ::close(fd);
}

void TrainerEndpoint::refuseAttached(const std::string& why) {
  ++counts_.refused;
  send(nlohmann::json({{"type", "error"}, {"message", why}}).dump());
  detach(why, "refused");
}

void TrainerEndpoint::detach(const std::string& why, const char* verb) {
  if (trainerFd_ < 0) return;
  spdlog::warn("trainer (pid {}) {}: {}", trainerPid_, verb, why);
  ::close(trainerFd_);
  trainerFd_ = -1;
  trainerPid_ = 0;
  welcomed_ = false;
  announced_ = false;  // the next trainer gets the current round
  input_.clear();
}

void TrainerEndpoint::send(const std::string& line, int passFd) {
  const std::string text = line + "\n";
  iovec io{const_cast<char*>(text.data()), text.size()};  // NOLINT(*-const-cast): sendmsg's type
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int))> control{};
  if (passFd >= 0) {
    message.msg_control = control.data();
    message.msg_controllen = control.size();
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(header), &passFd, sizeof(int));
  }
  // Lines are short: a socket buffer too full for one is a trainer that stopped reading.
  const ssize_t sent = ::sendmsg(trainerFd_, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (sent < 0 && errno != EAGAIN)
    detach(std::strerror(errno));  // gone: EPIPE, ECONNRESET
  else if (sent != static_cast<ssize_t>(text.size()))
    detach("does not read its socket");
}

bool TrainerEndpoint::finite(std::span<const std::byte> values) const {
  // The wire's pass over the exponent bits (vectorised): a trainer hands in
  // a model-sized vector or two every round.
  return wire::exponentsAllClear(values, options_.dtype == wire::Dtype::Float64);
}

// A line is untrusted input: a field of the wrong JSON type is a rejected
// message (or, before the hello, the end of the connection), never an
// exception out of the engine loop.
std::optional<TrainerUpdate> TrainerEndpoint::handle(const std::string& line) {
  try {
    return handleMessage(nlohmann::json::parse(line));  // not JSON: the parser's words
  } catch (const nlohmann::json::exception& e) {
    if (!welcomed_)
      detach(std::string("a malformed hello: ") + e.what());
    else
      reject(std::string("malformed message: ") + e.what());
    return std::nullopt;
  }
}

void TrainerEndpoint::reject(const std::string& reason) {
  ++counts_.rejectedUpdates;
  spdlog::warn("trainer update rejected: {}", reason);
  send(nlohmann::json({{"type", "rejected"}, {"reason", reason}}).dump());
}

std::optional<TrainerUpdate> TrainerEndpoint::handleMessage(const nlohmann::json& message) {
  const std::string type =
      message.is_object() ? message.value("type", std::string()) : std::string();
  if (!welcomed_) {
    if (type != "hello") {
      detach("the first message must be a hello");
    } else if (acceptHello(message)) {
      welcomed_ = true;
      ++counts_.attaches;
      if (!holdWelcome_) welcome();
    }
    return std::nullopt;
  }
  if (type == "init") {
    takeInit();
    return std::nullopt;
  }
  if (type != "update") {
    reject("unknown message type '" + type + "'");
    return std::nullopt;
  }
  return takeUpdate(message);
}

// A trainer's hello: its shape becomes the node's (model.dimension/dtype:
// auto, the first trainer) or must match it; else it is refused.
bool TrainerEndpoint::acceptHello(const nlohmann::json& message) {
  const auto dimension = message.value("dimension", std::uint64_t{0});
  const std::string dtype = message.value("dtype", std::string());
  const bool learn = !shape();
  if (learn && dimension >= 1 && dimension <= kMaxDimension &&
      (dtype == "float32" || dtype == "float64")) {
    // model.dimension/dtype: auto: this trainer's shape becomes the node's.
    const TrainerOptions configured = options_;
    if (options_.dimension == 0) options_.dimension = dimension;
    if (!options_.dtype)
      options_.dtype = dtype == "float64" ? wire::Dtype::Float64 : wire::Dtype::Float32;
    try {
      createRegion();
    } catch (const Unavailable& e) {  // out of memory for it: refuse, stay open
      options_ = configured;
      refuseAttached(e.what());
      return false;
    }
    spdlog::info("the node trains {} {} parameters, as its first trainer (pid {})",
                 options_.dimension, dtypeName(*options_.dtype), trainerPid_);
    holdWelcome_ = true;
  }
  if (!shape() || dimension != options_.dimension || dtype != dtypeName(*options_.dtype)) {
    const std::string ours = shape() ? std::to_string(options_.dimension) + " " +
                                           dtypeName(*options_.dtype) + " parameters"
                                     : "parameters of the first trainer's shape";
    const std::string why =
        "this node trains " + ours + "; the trainer has " + std::to_string(dimension) + " " + dtype;
    refuseAttached(why);
    return false;
  }
  return true;
}

// A fresh start's initial parameters in slot 0, once.
void TrainerEndpoint::takeInit() {
  if (!wantInit_) return;  // resumed or already initialised: ours stand
  if (!finite(slot(0))) {
    reject("non_finite initial parameters");
    return;
  }
  initial_.emplace(slot(0).begin(), slot(0).end());
  wantInit_ = false;
}

// An update of the round given, its values in slot 1 (and a delta's gradient in slot 2).
std::optional<TrainerUpdate> TrainerEndpoint::takeUpdate(const nlohmann::json& message) {
  const std::string kind = message.value("kind", std::string("gradient"));
  const auto round = message.value("round", std::int64_t{-1});
  const auto loss = message.value("loss", 0.0);
  if (!round_ || round != *round_) {
    reject("round " + std::to_string(round) + " is not the round given");
    return std::nullopt;
  }
  if (kind != "gradient" && kind != "delta") {
    reject("kind must be gradient or delta, not '" + kind + "'");
    return std::nullopt;
  }
  // A delta may come with the gradient at x_k it was computed from (slot 2).
  const bool withGradient = message.value("gradient", false);
  if (withGradient && kind != "delta") {
    reject("gradient: true goes with kind delta");
    return std::nullopt;
  }
  if (!finite(slot(1)) || !std::isfinite(loss) || (withGradient && !finite(slot(2)))) {
    reject("non_finite");
    return std::nullopt;
  }
  // What the trainer measured on its test data: shown as the node's, so bounded.
  const std::optional<double> accuracy = optionalNumber(message, "accuracy");
  const std::optional<double> testLoss = optionalNumber(message, "test_loss");
  const std::optional<double> variance = optionalNumber(message, "grad_variance");
  if (accuracy && !(*accuracy >= 0 && *accuracy <= 1)) {
    reject("accuracy must be in [0, 1]");
    return std::nullopt;
  }
  if (testLoss && !(std::isfinite(*testLoss) && *testLoss >= 0)) {
    reject("test_loss must be finite and >= 0");
    return std::nullopt;
  }
  if (variance && !(std::isfinite(*variance) && *variance >= 0)) {
    reject("grad_variance must be finite and >= 0");
    return std::nullopt;
  }
  // The training samples behind the update (for bytes per sample).
  const std::optional<double> samples = optionalNumber(message, "samples");
  // 0: a round that only mixes (consensusd.torch.Optimizer's mix_rounds).
  if (samples && !(*samples >= 0 && *samples <= kMaxSamples && std::floor(*samples) == *samples)) {
    reject("samples must be a whole number in [0, 2^30]");
    return std::nullopt;
  }
  TrainerUpdate update;
  update.round = round;
  update.kind = kind == "delta" ? consensus::UpdateKind::Delta : consensus::UpdateKind::Gradient;
  update.loss = loss;
  update.accuracy = accuracy;
  update.testLoss = testLoss;
  update.elapsed = std::chrono::steady_clock::now() - publishedAt_;
  update.values = slot(1);
  if (withGradient) update.gradient = slot(2);
  update.gradVariance = variance.value_or(0.0);
  if (samples) update.samples = static_cast<std::uint64_t>(*samples);
  round_.reset();
  ++counts_.updates;
  updateMs_.push_back(std::chrono::duration<double, std::milli>(update.elapsed).count());
  while (updateMs_.size() > kWindow) updateMs_.pop_front();
  return update;
}

TrainerStatus TrainerEndpoint::status() const {
  owner_.check();
  TrainerStatus status = counts_;
  status.attached = attached();
  status.pid = trainerPid_;
  if (!updateMs_.empty()) {
    status.meanUpdateMs = std::accumulate(updateMs_.begin(), updateMs_.end(), 0.0) /
                          static_cast<double>(updateMs_.size());
    std::vector<double> sorted(updateMs_.begin(), updateMs_.end());
    std::sort(sorted.begin(), sorted.end());
    // Nearest rank: the smallest value with 95% of them at or below it.
    status.p95UpdateMs = sorted[(sorted.size() * 95 + 99) / 100 - 1];
  }
  return status;
}

}  // namespace consensusd::daemon
