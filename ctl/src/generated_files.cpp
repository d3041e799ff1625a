#include "generated_files.hpp"

#include <fstream>
#include <stdexcept>

#include "consensusd/config/load.hpp"

namespace consensusd::cli {

YAML::Node str(const std::string& text) {
  YAML::Node node(text);
  node.SetTag("!");
  return node;
}

namespace {

void write(YAML::Emitter& out, const YAML::Node& node) {
  if (node.Style() == YAML::EmitterStyle::Flow) out << YAML::Flow;
  switch (node.Type()) {
    case YAML::NodeType::Map:
      out << YAML::BeginMap;
      for (const auto& entry : node) {
        out << YAML::Key;
        write(out, entry.first);
        out << YAML::Value;
        write(out, entry.second);
      }
      out << YAML::EndMap;
      break;
    case YAML::NodeType::Sequence:
      out << YAML::BeginSeq;
      for (const auto& item : node) write(out, item);
      out << YAML::EndSeq;
      break;
    case YAML::NodeType::Scalar:
      if (node.Tag() == "!") out << YAML::DoubleQuoted;
      out << node.Scalar();
      break;
    default:
      out << YAML::Null;
  }
}

}  // namespace

std::string emit(const YAML::Node& node) {
  YAML::Emitter out;
  write(out, node);
  return std::string(out.c_str()) + "\n";
}

YAML::Node withOverrides(YAML::Node doc, const std::vector<std::string>& overrides) {
  for (const std::string& override : overrides) {
    const std::size_t equals = override.find('=');
    const std::string key = override.substr(0, equals);
    const std::string value = equals == std::string::npos ? "" : override.substr(equals + 1);
    YAML::Node node = doc;
    std::size_t start = 0;
    for (std::size_t dot; (dot = key.find('.', start)) != std::string::npos; start = dot + 1) {
      YAML::Node child = node[key.substr(start, dot - start)];  // a handle, not a copy
      node.reset(child);
    }
    node[key.substr(start)] = value.empty() ? YAML::Node(std::string()) : YAML::Load(value);
  }
  return doc;
}

std::string writeNodeConfig(const std::filesystem::path& path, const std::string& header,
                            const std::string& base, const std::vector<std::string>& overrides,
                            const std::vector<std::string>& loadOverrides) {
  config::readConfig(base, path.string(), overrides);
  const std::string text = header + emit(withOverrides(YAML::Load(base), overrides));
  writeFile(path, text);
  config::loadConfig(path.string(), loadOverrides);
  return text;
}

void writeFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream file(path, std::ios::trunc);
  file << text;
  file.close();
  if (!file) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace consensusd::cli
