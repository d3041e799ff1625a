#include "consensusd/schema/input_error.hpp"

#include <utility>

namespace consensusd::schema {
namespace {

std::string formatLine(const std::string& file, Position position, const std::string& message,
                       const std::string& keyPath) {
  std::string line = file.empty() ? std::string("<input>") : file;
  line += ':' + std::to_string(position.line) + ':' + std::to_string(position.column) + ": ";
  line += message;
  if (!keyPath.empty()) line += " (" + keyPath + ")";
  return line;
}

}  // namespace

InputError::InputError(std::string file, Position position, std::string message,
                       std::string keyPath)
    : std::runtime_error(formatLine(file, position, message, keyPath)),
      file_(std::move(file)),
      position_(position),
      message_(std::move(message)),
      keyPath_(std::move(keyPath)) {}

}  // namespace consensusd::schema
