#include "consensusd/schema/yaml_tree.hpp"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>

namespace consensusd::schema {
namespace {

Position toPosition(const YAML::Mark& mark) {
  return {mark.line + 1, mark.column + 1};
}

// Builds a YamlNode tree from parser events, enforcing the limits as it goes:
// the depth check runs before yaml-cpp recurses further, the node count
// bounds memory, and aliases are refused outright.
class TreeBuilder : public YAML::EventHandler {
 public:
  TreeBuilder(const std::string& fileName, const YamlLimits& limits)
      : fileName_(fileName), limits_(limits) {}

  std::optional<YamlNode> takeRoot() { return std::move(root_); }

  void OnDocumentStart(const YAML::Mark& /*mark*/) override {}
  void OnDocumentEnd() override {}

  void OnNull(const YAML::Mark& mark, YAML::anchor_t /*anchor*/) override {
    YamlNode node;
    node.position = toPosition(mark);
    add(std::move(node));
  }

  void OnAlias(const YAML::Mark& mark, YAML::anchor_t /*anchor*/) override {
    throw InputError(fileName_, toPosition(mark), "YAML aliases (*name) are not supported");
  }

  void OnScalar(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t /*anchor*/,
                const std::string& value) override {
    YamlNode node;
    node.kind = NodeKind::Scalar;
    node.scalar = value;
    node.quoted = tag == "!";  // yaml-cpp tags non-plain scalars "!"
    node.position = toPosition(mark);
    add(std::move(node));
  }

  void OnSequenceStart(const YAML::Mark& mark, const std::string& /*tag*/,
                       YAML::anchor_t /*anchor*/, YAML::EmitterStyle::value /*style*/) override {
    open(NodeKind::Sequence, mark);
  }
  void OnSequenceEnd() override { close(); }

  void OnMapStart(const YAML::Mark& mark, const std::string& /*tag*/, YAML::anchor_t /*anchor*/,
                  YAML::EmitterStyle::value /*style*/) override {
    open(NodeKind::Map, mark);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Frame {
    YamlNode node;
    std::optional<YamlNode> pendingKey;
  };

  void open(NodeKind kind, const YAML::Mark& mark) {
    if (static_cast<int>(stack_.size()) >= limits_.maxDepth) {
      throw InputError(fileName_, toPosition(mark),
                       "nesting deeper than " + std::to_string(limits_.maxDepth) + " levels");
    }
    Frame frame;
    frame.node.kind = kind;
    frame.node.position = toPosition(mark);
    stack_.push_back(std::move(frame));
  }

  void close() {
    YamlNode node = std::move(stack_.back().node);
    stack_.pop_back();
    add(std::move(node));
  }

  void add(YamlNode node) {
    if (++count_ > limits_.maxNodes) {
      throw InputError(fileName_, node.position,
                       "more than " + std::to_string(limits_.maxNodes) + " YAML nodes");
    }
    if (stack_.empty()) {
      root_ = std::move(node);
      return;
    }
    Frame& top = stack_.back();
    if (top.node.kind == NodeKind::Sequence) {
      top.node.items.push_back(std::move(node));
    } else if (!top.pendingKey) {
      top.pendingKey = std::move(node);
    } else {
      top.node.entries.push_back({std::move(*top.pendingKey), std::move(node)});
      top.pendingKey.reset();
    }
  }

  const std::string& fileName_;
  const YamlLimits& limits_;
  std::vector<Frame> stack_;
  std::optional<YamlNode> root_;
  std::size_t count_ = 0;
};

std::string readAll(std::istream& in, const std::string& fileName, const YamlLimits& limits) {
  std::string text;
  char buffer[1 << 16];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    text.append(buffer, static_cast<std::size_t>(in.gcount()));
    if (text.size() > limits.maxBytes) {
      throw InputError(fileName, {},
                       "file is larger than " + std::to_string(limits.maxBytes) + " bytes");
    }
  }
  return text;
}

}  // namespace

YamlNode parseYaml(std::string_view text, const std::string& fileName, const YamlLimits& limits) {
  if (text.size() > limits.maxBytes) {
    throw InputError(fileName, {},
                     "file is larger than " + std::to_string(limits.maxBytes) + " bytes");
  }
  std::istringstream stream{std::string(text)};
  TreeBuilder builder(fileName, limits);
  try {
    YAML::Parser parser(stream);
    if (!parser.HandleNextDocument(builder)) return YamlNode{};
    std::optional<YamlNode> root = builder.takeRoot();
    TreeBuilder rest(fileName, limits);
    if (parser.HandleNextDocument(rest)) {
      std::optional<YamlNode> second = rest.takeRoot();
      throw InputError(fileName, second ? second->position : Position{},
                       "more than one YAML document in the file");
    }
    return root ? std::move(*root) : YamlNode{};
  } catch (const YAML::Exception& e) {
    throw InputError(fileName, toPosition(e.mark), "YAML syntax error: " + e.msg);
  }
}

std::string readYamlText(const std::string& path, const YamlLimits& limits) {
  if (path == "-") return readAll(std::cin, "<stdin>", limits);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, {}, "cannot open file");
  return readAll(in, path, limits);
}

YamlNode loadYamlFile(const std::string& path, const YamlLimits& limits) {
  return parseYaml(readYamlText(path, limits), path == "-" ? "<stdin>" : path, limits);
}

}  // namespace consensusd::schema
