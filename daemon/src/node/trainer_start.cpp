#include "node/trainer_start.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>

#include "node/part_options.hpp"
#include "os/event_fd.hpp"

namespace consensusd::daemon {

// model.dimension/dtype: auto: binds the trainer socket and waits for the
// first trainer, whose parameters decide the node's, before the node binds
// its port or joins its neighbours. Null when stopped (SIGTERM/SIGINT) first.
std::unique_ptr<TrainerEndpoint> awaitTrainerShape(const config::LoadedConfig& loaded, int signalFd,
                                                   ServiceNotifier& service) {
  auto endpoint = std::make_unique<TrainerEndpoint>(trainerOptions(loaded.config, loaded));
  spdlog::info("waiting for a trainer at {}: its parameters decide the node's",
               loaded.config.trainer.socket);
  service.status("waiting for a trainer at " + loaded.config.trainer.socket);
  std::vector<zmq::pollitem_t> items;
  while (!endpoint->shape()) {
    service.extendStart(60);  // waiting for the trainer is not a hung start
    items = {{nullptr, signalFd, ZMQ_POLLIN, 0}};
    endpoint->append(items);
    zmq::poll(items, std::chrono::seconds(20));
    if ((items[0].revents & ZMQ_POLLIN) && readSignal(signalFd) != SIGHUP) {
      spdlog::info("stopped before a trainer attached");
      return nullptr;
    }
    endpoint->serve(std::span(items).subspan(1));
  }
  return endpoint;
}

}  // namespace consensusd::daemon
