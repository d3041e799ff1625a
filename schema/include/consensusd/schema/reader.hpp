#pragma once
// Typed, strict access to a YamlNode tree. Every accessor names the key path
// in its error and throws InputError at the offending node's position.
//
//   schema::MapReader root(source, tree, "");
//   std::string name = schema::readString(source, root.require("name"), "name");
//   root.rejectUnknown({"name", "nodes"});   // "did you mean" on typos

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "consensusd/schema/yaml_tree.hpp"

namespace consensusd::schema {

// Where a tree came from: used to prefix every error.
struct Source {
  std::string file;
};

[[noreturn]] void fail(const Source& source, const YamlNode& at, std::string message,
                       std::string keyPath);

// "a mapping", "a list", "a string", "a number", "a boolean", "null".
std::string describe(const YamlNode& node);

// The closest candidate within a small edit distance, or "" if none is close.
std::string closestMatch(std::string_view word, const std::vector<std::string>& candidates);

// "a.b" + "c" -> "a.b.c"; "" + "c" -> "c".
std::string joinPath(std::string_view parent, std::string_view key);

std::string readString(const Source& source, const YamlNode& node, const std::string& path);
bool readBool(const Source& source, const YamlNode& node, const std::string& path);
std::int64_t readInt(const Source& source, const YamlNode& node, const std::string& path,
                     std::int64_t min, std::int64_t max);
double readDouble(const Source& source, const YamlNode& node, const std::string& path, double min,
                  double max);
// One of `choices`, with a suggestion when it is close to one.
std::string readChoice(const Source& source, const YamlNode& node, const std::string& path,
                       const std::vector<std::string>& choices);

// A mapping with string keys; duplicate keys are errors.
class MapReader {
 public:
  MapReader(const Source& source, const YamlNode& node, std::string path);

  const YamlNode* find(std::string_view key) const;
  const YamlNode& require(std::string_view key) const;
  const YamlNode& node() const { return *node_; }
  const std::string& path() const { return path_; }
  std::string childPath(std::string_view key) const { return joinPath(path_, key); }

  // Throws on the first key not in `allowed`, suggesting the closest one.
  void rejectUnknown(const std::vector<std::string>& allowed) const;

 private:
  const Source* source_;
  const YamlNode* node_;
  std::string path_;
};

}  // namespace consensusd::schema
