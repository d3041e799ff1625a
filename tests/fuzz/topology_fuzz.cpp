// Fuzz target: topology files. Bad input must end in schema::InputError.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "consensusd/topology/yaml_io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    consensusd::topology::parseTopology(std::string_view(reinterpret_cast<const char*>(data), size),
                                        "fuzz.yaml");
  } catch (const consensusd::schema::InputError&) {
  }
  return 0;
}
