// Fuzz target: one status-socket request line, from a trusted and an
// untrusted peer. Every request gets an answer or none; nothing throws.
#include <cstddef>
#include <cstdint>
#include <string>

#include "status_server.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace consensusd;
  static const daemon::StatusSnapshot snapshot = [] {
    daemon::StatusSnapshot s;
    s.node = "n0";
    s.configYaml = "node:\n  id: n0\n";
    return s;
  }();
  const std::string line(reinterpret_cast<const char*>(data), size);
  for (const bool trusted : {false, true}) {
    daemon::Command command;
    [[maybe_unused]] const auto answer = daemon::answerRequest(line, &snapshot, trusted, command);
  }
  return 0;
}
