// consensusd: one node of a decentralized training cluster (docs/design.md §1-2).

#include <malloc.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>

#include "consensusd/config/load.hpp"
#include "consensusd/config/params.hpp"
#include "consensusd/daemon/command_line.hpp"
#include "consensusd/daemon/curve.hpp"
#include "consensusd/daemon/status_server.hpp"
#include "consensusd/data/dataset.hpp"
#include "node/node.hpp"

namespace {

// SIGTERM/SIGINT (stop) and SIGHUP (re-read the topology file) blocked in
// every thread and read from a signalfd by the engine loop: neither runs in
// a signal handler.
int blockSignals() {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return ::signalfd(-1, &stop, SFD_CLOEXEC | SFD_NONBLOCK);
}

// Model-sized buffers (each received estimate, each round's snapshot) come
// and go every round. glibc maps blocks from 128 KiB with mmap and returns
// them on free, so every round faulted its pages in afresh (zeroed by the
// kernel: a quarter of the cycles at 64 MiB). No block is mmap'd (glibc caps
// the threshold at 32 MiB, so only M_MMAP_MAX = 0 covers larger models):
// freed blocks stay in the heap and are reused warm, and the heap's top is
// given back only beyond 1 GiB free. One arena: ZeroMQ's I/O thread
// allocates the messages the engine thread frees, and a thread's own arena
// (64 MiB heaps, shrunk when free) would give their pages back each round too.
void keepLargeBuffersWarm() {
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

// Model-sized buffers are touched page by page the first time: 4 KiB pages
// cost a fault each (on a virtual machine here ~15 us, 3.6 s per GB: a
// first round of a 1.2 GB model stalled the engine thread long enough for
// its neighbour to be marked suspect). With transparent huge pages (the
// kernel's default mode, `madvise`) one fault maps 2 MiB. glibc advises
// its heap only when told at start (the tunable glibc.malloc.hugetlb),
// so the daemon starts itself again once with the tunable added; if that
// fails it runs on as it is. It starts its own file by name, not as
// /proc/self/exe: the process's name (ps, top, pgrep) is the file's.
void adviseHugePages(char** argv) {
  constexpr const char* kTunable = "glibc.malloc.hugetlb=1";
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::strstr(tunables, "glibc.malloc.hugetlb") != nullptr) return;
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return;
  const std::string value =
      tunables != nullptr && *tunables != '\0' ? std::string(tunables) + ":" + kTunable : kTunable;
  if (::setenv("GLIBC_TUNABLES", value.c_str(), 1) != 0) return;
  ::execv(self.c_str(), argv);
}

int runDaemon(const consensusd::config::LoadedConfig& loaded) {
  const auto& cfg = loaded.config;
  keepLargeBuffersWarm();
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e " + cfg.node.id + " %^%l%$ %v");
  spdlog::set_level(spdlog::level::from_str(cfg.log.level));
  const int signalFd = blockSignals();
  const int wakeFd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  consensusd::daemon::StatusBoard board;
  try {
    const consensusd::daemon::StatusServer status(cfg.status.socket, cfg.status.http, board,
                                                  wakeFd);
    spdlog::info("status socket {}{}", cfg.status.socket,
                 cfg.status.http.empty() ? "" : ", HTTP " + cfg.status.http);
    const int code = consensusd::daemon::runNode(loaded, board, signalFd, wakeFd);
    ::close(wakeFd);
    ::close(signalFd);
    return code;
  } catch (const consensusd::data::DataError& e) {
    spdlog::error("{}", e.what());
    return consensusd::cli::kExitData;
  } catch (const consensusd::daemon::Unavailable& e) {
    spdlog::error("{}", e.what());
    return consensusd::cli::kExitUnavailable;
  } catch (const std::exception& e) {
    spdlog::critical("internal error: {}", e.what());
    return consensusd::cli::kExitSoftware;
  }
}

}  // namespace

// cli::run maps every exception to an exit code; only CLI11 set-up could throw.
int main(int argc, char** argv) {  // NOLINT(bugprone-exception-escape)
  adviseHugePages(argv);
  CLI::App app("consensusd: a node of decentralized training with backup neighbours", "consensusd");
  consensusd::cli::addVersionFlag(app);
  std::string configFile;
  std::vector<std::string> overrides;
  bool checkOnly = false;
  bool printConfig = false;
  bool printSchema = false;
  app.add_flag("--print-schema", printSchema, "Print every config key (Markdown table) and exit");
  app.add_option("-c,--config", configFile, "Node config file (config/README.md)");
  app.add_option("--set", overrides, "Override a key: --set train.batch_size=64 (repeatable)")
      ->type_name("KEY=VALUE")
      ->take_all();
  app.add_flag("--check", checkOnly,
               "Validate config, topology and data files, bind nothing: exit 0, 78 or 65");
  app.add_flag("--print-config", printConfig,
               "Print the effective config (defaults included) and exit");

  return consensusd::cli::run(app, argc, argv, [&] {
    if (printSchema) {
      std::cout << consensusd::config::schemaTable();
      return consensusd::cli::kExitOk;
    }
    if (configFile.empty()) {
      std::cerr << "consensusd: --config is required (see --help)\n";
      return consensusd::cli::kExitUsage;
    }
    const consensusd::config::LoadedConfig loaded =
        consensusd::config::loadConfig(configFile, overrides);
    if (printConfig) {
      std::cout << consensusd::config::toYaml(loaded.config);
      return consensusd::cli::kExitOk;
    }
    const auto& graph = loaded.topology;
    if (const auto& keys = loaded.curve) {
      // Never run in the clear, or with a key pair that cannot work, when the operator asked for
      // CURVE.
      const std::string& keyFile = loaded.config.security.secretKeyFile;
      if (!consensusd::daemon::curve::available()) {
        std::cerr << configFile
                  << ": security.curve: this libzmq was built without CURVE; refusing to start\n";
        return consensusd::schema::kExitConfig;
      }
      if (consensusd::daemon::curve::publicKeyOf(keys->secretKey) != keys->publicKey) {
        std::cerr << keyFile
                  << ": secret_key does not belong to public_key (security.secret_key_file)\n";
        return consensusd::schema::kExitConfig;
      }
    }
    if (checkOnly) {
      // Data files are read as the daemon would: a bad one is exit 65 here, not at start.
      consensusd::data::load(consensusd::config::dataSource(loaded.config));
      std::cout << configFile << ": ok (node " << loaded.config.node.id << " of " << graph.name()
                << ", " << graph.size() << " nodes, degree "
                << graph.inNeighbors(loaded.nodeIndex).size() << ", topology hash "
                << graph.hashHex() << ")\n";
      return consensusd::cli::kExitOk;
    }
    return runDaemon(loaded);
  });
}
