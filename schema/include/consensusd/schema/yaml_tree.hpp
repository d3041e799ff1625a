#pragma once
// A YAML document as a plain tree where every node remembers its position.
// Parsing is hardened for hostile files: size, depth and node-count limits,
// no aliases (so no alias bombs), one document per file. Every failure is an
// InputError naming file, line and column; nothing crashes or hangs.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "consensusd/schema/input_error.hpp"

namespace consensusd::schema {

enum class NodeKind { Null, Scalar, Sequence, Map };

struct YamlEntry;

struct YamlNode {
  NodeKind kind = NodeKind::Null;
  std::string scalar;   // Scalar only
  bool quoted = false;  // Scalar written quoted or as a block: always a string
  Position position;
  std::vector<YamlNode> items;     // Sequence
  std::vector<YamlEntry> entries;  // Map, in file order
};

struct YamlEntry {
  YamlNode key;
  YamlNode value;
};

struct YamlLimits {
  std::size_t maxBytes = 16u << 20;
  int maxDepth = 64;
  std::size_t maxNodes = 2'000'000;
};

// `fileName` is only used in error messages.
YamlNode parseYaml(std::string_view text, const std::string& fileName,
                   const YamlLimits& limits = {});

// The text of `path` (or standard input for "-"), at most limits.maxBytes;
// InputError if it cannot be opened or is larger.
std::string readYamlText(const std::string& path, const YamlLimits& limits = {});

// Reads `path` (or standard input for "-") under the same limits.
YamlNode loadYamlFile(const std::string& path, const YamlLimits& limits = {});

}  // namespace consensusd::schema
