#include <doctest/doctest.h>

#include <string>

#include "consensusd/schema/reader.hpp"
#include "consensusd/schema/yaml_tree.hpp"
#include "expect_error.hpp"

using consensusd::schema::InputError;
using consensusd::schema::MapReader;
using consensusd::schema::NodeKind;
using consensusd::schema::parseYaml;
using consensusd::schema::Source;
using consensusd::schema::YamlLimits;

namespace {

std::string errorOf(const std::string& text, const YamlLimits& limits = {}) {
  try {
    parseYaml(text, "f.yaml", limits);
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

template <class F>
std::string errorFrom(F&& body) {
  return consensusd::testing::errorText<InputError>(std::forward<F>(body));
}

}  // namespace

TEST_CASE("the tree keeps kinds, order and 1-based positions") {
  const auto root = parseYaml("a: 1\nb:\n  - x\n  - \"y\"\nc: {d: ~}\n", "f.yaml");
  REQUIRE(root.kind == NodeKind::Map);
  REQUIRE(root.entries.size() == 3);
  CHECK(root.entries[0].key.scalar == "a");
  CHECK(root.entries[0].value.scalar == "1");
  CHECK(root.entries[0].value.position.line == 1);
  CHECK(root.entries[0].value.position.column == 4);
  const auto& list = root.entries[1].value;
  REQUIRE(list.kind == NodeKind::Sequence);
  CHECK(list.items[0].position.line == 3);
  CHECK(list.items[0].position.column == 5);
  CHECK_FALSE(list.items[0].quoted);
  CHECK(list.items[1].quoted);
  CHECK(root.entries[2].value.entries[0].value.kind == NodeKind::Null);
}

TEST_CASE("an empty document is null") {
  CHECK(parseYaml("", "f.yaml").kind == NodeKind::Null);
}

TEST_CASE("hostile input gives one-line errors") {
  CHECK(errorOf("a: [1, 2\n") == "f.yaml:2:1: YAML syntax error: end of sequence flow not found");
  CHECK(errorOf("a: " + std::string(100000, '[')) == "f.yaml:1:36: nesting deeper than 64 levels");
  CHECK(errorOf("a: &x [1, 2]\nb: *x\n") == "f.yaml:2:4: YAML aliases (*name) are not supported");
  CHECK(errorOf("a: 1\n---\nb: 2\n") == "f.yaml:3:1: more than one YAML document in the file");
  YamlLimits small;
  small.maxBytes = 10;
  CHECK(errorOf("a: 12345678901", small) == "f.yaml:1:1: file is larger than 10 bytes");
  small = {};
  small.maxNodes = 5;
  CHECK(errorOf("[1, 2, 3, 4, 5, 6]", small) == "f.yaml:1:17: more than 5 YAML nodes");
}

TEST_CASE("block nesting is bounded too") {
  std::string text;
  for (int i = 0; i < 5000; ++i) text += std::string(static_cast<std::size_t>(i), ' ') + "k:\n";
  CHECK(errorOf(text) == "f.yaml:65:65: nesting deeper than 64 levels");
}

TEST_CASE("typed readers name the key path and the allowed range") {
  const Source source{"f.yaml"};
  const auto root =
      parseYaml("i: 7\nd: 0.5\nb: yes\ns: \"12\"\nc: metropoliss\nl: [1]\n", "f.yaml");
  const MapReader map(source, root, "");
  CHECK(consensusd::schema::readInt(source, map.require("i"), "i", 0, 10) == 7);
  CHECK(errorFrom([&] { consensusd::schema::readInt(source, map.require("i"), "i", 0, 5); }) ==
        "f.yaml:1:4: value 7 is out of range [0, 5] (i)");
  CHECK(errorFrom([&] { consensusd::schema::readInt(source, map.require("d"), "d", 0, 5); }) ==
        "f.yaml:2:4: expected an integer, got a number (d)");
  CHECK(consensusd::schema::readDouble(source, map.require("d"), "d", 0, 1) == 0.5);
  CHECK(errorFrom([&] { consensusd::schema::readDouble(source, map.require("s"), "s", 0, 100); }) ==
        "f.yaml:4:4: expected a number, got a string (s)");
  CHECK(errorFrom([&] { consensusd::schema::readBool(source, map.require("b"), "b"); }) ==
        "f.yaml:3:4: expected true or false, got a string (b)");
  CHECK(errorFrom([&] { consensusd::schema::readString(source, map.require("l"), "l"); }) ==
        "f.yaml:6:4: expected a string, got a list (l)");
  CHECK(errorFrom([&] {
          consensusd::schema::readChoice(source, map.require("c"), "c", {"metropolis", "uniform"});
        }) ==
        "f.yaml:5:4: unknown value 'metropoliss', did you mean 'metropolis'? (one of: metropolis "
        "uniform) (c)");
}

TEST_CASE("non-finite numbers are refused") {
  const Source source{"f.yaml"};
  const auto root = parseYaml("x: .nan\n", "f.yaml");
  CHECK(errorFrom([&] {
          consensusd::schema::readDouble(source, root.entries[0].value, "x", -1e9, 1e9);
        }) == "f.yaml:1:4: value must be finite (x)");
}

TEST_CASE("maps: unknown keys suggest, duplicates and missing keys are errors") {
  const Source source{"f.yaml"};
  const auto root = parseYaml("nodes: []\nedgse: []\n", "f.yaml");
  const MapReader map(source, root, "");
  CHECK(errorFrom([&] {
          map.rejectUnknown({"nodes", "edges"});
        }) == "f.yaml:2:1: unknown key 'edgse', did you mean 'edges'? (edgse)");
  CHECK(errorFrom([&] {
          map.rejectUnknown({"nodes", "completely_different"});
        }) == "f.yaml:2:1: unknown key 'edgse' (edgse)");
  CHECK(errorFrom([&] { map.require("name"); }) == "f.yaml:1:1: missing key 'name' (name)");
  const auto twice = parseYaml("a: 1\na: 2\n", "f.yaml");
  CHECK(errorFrom([&] { MapReader(source, twice, "top"); }) ==
        "f.yaml:2:1: duplicate key 'a' (top.a)");
  const auto list = parseYaml("[1]", "f.yaml");
  CHECK(errorFrom([&] { MapReader(source, list, "top"); }) ==
        "f.yaml:1:1: expected a mapping, got a list (top)");
}

TEST_CASE("closestMatch only suggests close words") {
  CHECK(consensusd::schema::closestMatch("batchsize", {"batch_size", "rounds"}) == "batch_size");
  CHECK(consensusd::schema::closestMatch("xyz", {"batch_size", "rounds"}).empty());
}
