#pragma once
// An enum's names in config files, spelled once, next to the enum: parsing,
// printing and the config schema's list of choices all read the same table.

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace consensusd::data {

template <class Enum>
struct Named {
  Enum value;
  std::string_view name;
};

template <class Enum, std::size_t N>
using NameTable = std::array<Named<Enum>, N>;

template <class Enum, std::size_t N>
constexpr std::optional<Enum> parseName(const NameTable<Enum, N>& table, std::string_view text) {
  for (const Named<Enum>& entry : table)
    if (entry.name == text) return entry.value;
  return std::nullopt;
}

template <class Enum, std::size_t N>
constexpr std::string_view nameOf(const NameTable<Enum, N>& table, Enum value) {
  for (const Named<Enum>& entry : table)
    if (entry.value == value) return entry.name;
  return "?";
}

template <class Enum, std::size_t N>
std::vector<std::string> namesOf(const NameTable<Enum, N>& table) {
  std::vector<std::string> names;
  for (const Named<Enum>& entry : table) names.emplace_back(entry.name);
  return names;
}

}  // namespace consensusd::data
