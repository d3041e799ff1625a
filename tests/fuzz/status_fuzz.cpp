// Fuzz target: one status-socket request line, from a trusted and an
// untrusted peer. Every request gets an answer or none, and the answer
// serialises as the server sends it; nothing throws. A
// set-policy request goes on through the config schema, as in the engine,
// where only schema::InputError may come out.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "consensusd/config/load.hpp"
#include "consensusd/config/params.hpp"
#include "consensusd/daemon/status_server.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace consensusd;
  static const daemon::StatusSnapshot snapshot = [] {
    daemon::StatusSnapshot s;
    s.node = "n0";
    s.configYaml = "node:\n  id: n0\n";
    for (int round = 0; round < 3; ++round)
      s.history.push_back(std::make_shared<const nlohmann::json>(nlohmann::json{{"round", round}}));
    return s;
  }();
  const std::string line(reinterpret_cast<const char*>(data), size);
  for (const bool trusted : {false, true}) {
    daemon::Command command;
    const auto answer = daemon::answerRequest(line, &snapshot, trusted, command);
    if (answer) [[maybe_unused]]
      const std::string text = daemon::serialize(*answer);
    if (command.name != "set-policy") continue;
    try {
      const config::NodeConfig updated =
          config::readConfig("node: {id: n0}\ntopology: {file: t.yaml}\n", "<running config>",
                             daemon::setPolicyOverrides(command.args));
      [[maybe_unused]] const auto policy = config::policySpec(updated);
    } catch (const schema::InputError&) {
    }
  }
  return 0;
}
