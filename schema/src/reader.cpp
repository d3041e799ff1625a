#include "consensusd/schema/reader.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>

namespace consensusd::schema {
namespace {

std::size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      const std::size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({above + 1, row[j - 1] + 1, substitute});
      diagonal = above;
    }
  }
  return row[b.size()];
}

bool isPlainScalar(const YamlNode& node) {
  return node.kind == NodeKind::Scalar && !node.quoted;
}

bool isBoolText(std::string_view text) {
  return text == "true" || text == "false" || text == "True" || text == "False" || text == "TRUE" ||
         text == "FALSE";
}

bool parseDouble(const std::string& text, double& out) {
  if (text.empty()) return false;
  if (text == ".inf" || text == "+.inf" || text == "-.inf" || text == ".nan" || text == ".NaN") {
    out = text == ".nan" || text == ".NaN" ? std::nan("") : (text[0] == '-' ? -HUGE_VAL : HUGE_VAL);
    return true;
  }
  char* end = nullptr;
  errno = 0;
  out = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && errno != ERANGE;
}

std::string formatNumber(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

}  // namespace

void fail(const Source& source, const YamlNode& at, std::string message, std::string keyPath) {
  throw InputError(source.file, at.position, std::move(message), std::move(keyPath));
}

std::string describe(const YamlNode& node) {
  switch (node.kind) {
    case NodeKind::Null:
      return "null";
    case NodeKind::Sequence:
      return "a list";
    case NodeKind::Map:
      return "a mapping";
    case NodeKind::Scalar:
      break;
  }
  if (node.quoted) return "a string";
  double number = 0;
  if (parseDouble(node.scalar, number)) return "a number";
  if (isBoolText(node.scalar)) return "a boolean";
  return "a string";
}

std::string closestMatch(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t bestDistance = std::max<std::size_t>(2, word.size() / 3) + 1;
  for (const std::string& candidate : candidates) {
    const std::size_t distance = editDistance(word, candidate);
    if (distance < bestDistance) {
      bestDistance = distance;
      best = candidate;
    }
  }
  return best;
}

std::string joinPath(std::string_view parent, std::string_view key) {
  if (parent.empty()) return std::string(key);
  return std::string(parent) + "." + std::string(key);
}

std::string readString(const Source& source, const YamlNode& node, const std::string& path) {
  if (node.kind != NodeKind::Scalar)
    fail(source, node, "expected a string, got " + describe(node), path);
  return node.scalar;
}

bool readBool(const Source& source, const YamlNode& node, const std::string& path) {
  if (!isPlainScalar(node) || !isBoolText(node.scalar)) {
    fail(source, node, "expected true or false, got " + describe(node), path);
  }
  return node.scalar[0] == 't' || node.scalar[0] == 'T';
}

std::int64_t readInt(const Source& source, const YamlNode& node, const std::string& path,
                     std::int64_t min, std::int64_t max) {
  std::int64_t value = 0;
  const std::string& text = node.scalar;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (!isPlainScalar(node) || error != std::errc{} || end != text.data() + text.size()) {
    fail(source, node, "expected an integer, got " + describe(node), path);
  }
  if (value < min || value > max) {
    fail(source, node,
         "value " + text + " is out of range [" + std::to_string(min) + ", " + std::to_string(max) +
             "]",
         path);
  }
  return value;
}

double readDouble(const Source& source, const YamlNode& node, const std::string& path, double min,
                  double max) {
  double value = 0;
  if (!isPlainScalar(node) || !parseDouble(node.scalar, value)) {
    fail(source, node, "expected a number, got " + describe(node), path);
  }
  if (!std::isfinite(value)) fail(source, node, "value must be finite", path);
  if (value < min || value > max) {
    fail(source, node,
         "value " + node.scalar + " is out of range [" + formatNumber(min) + ", " +
             formatNumber(max) + "]",
         path);
  }
  return value;
}

std::string readChoice(const Source& source, const YamlNode& node, const std::string& path,
                       const std::vector<std::string>& choices) {
  std::string value = readString(source, node, path);
  if (std::find(choices.begin(), choices.end(), value) != choices.end()) return value;
  std::string message = "unknown value '" + value + "'";
  if (const std::string close = closestMatch(value, choices); !close.empty()) {
    message += ", did you mean '" + close + "'?";
  }
  message += " (one of:";
  for (const std::string& choice : choices) message += " " + choice;
  message += ")";
  fail(source, node, message, path);
}

MapReader::MapReader(const Source& source, const YamlNode& node, std::string path)
    : source_(&source), node_(&node), path_(std::move(path)) {
  if (node.kind != NodeKind::Map) {
    fail(source, node, "expected a mapping, got " + describe(node), path_);
  }
  std::set<std::string_view> seen;
  for (const auto& [key, value] : node.entries) {
    if (key.kind != NodeKind::Scalar)
      fail(source, key, "keys must be strings, got " + describe(key), path_);
    if (!seen.insert(key.scalar).second) {
      fail(source, key, "duplicate key '" + key.scalar + "'", childPath(key.scalar));
    }
  }
}

const YamlNode* MapReader::find(std::string_view key) const {
  for (const auto& [k, value] : node_->entries) {
    if (k.scalar == key) return &value;
  }
  return nullptr;
}

const YamlNode& MapReader::require(std::string_view key) const {
  if (const YamlNode* value = find(key)) return *value;
  fail(*source_, *node_, "missing key '" + std::string(key) + "'", childPath(key));
}

void MapReader::rejectUnknown(const std::vector<std::string>& allowed) const {
  for (const auto& [key, value] : node_->entries) {
    if (std::find(allowed.begin(), allowed.end(), key.scalar) != allowed.end()) continue;
    std::string message = "unknown key '" + key.scalar + "'";
    if (const std::string close = closestMatch(key.scalar, allowed); !close.empty()) {
      message += ", did you mean '" + close + "'?";
    }
    fail(*source_, key, message, childPath(key.scalar));
  }
}

}  // namespace consensusd::schema
