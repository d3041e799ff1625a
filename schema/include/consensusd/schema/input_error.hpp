#pragma once
// Bad input (config, topology, command-line overrides) as one typed exception
// that says where and what: `FILE:LINE:COL: what is wrong (key path)`.

#include <stdexcept>
#include <string>

namespace consensusd::schema {

// 1-based line and column. Whole-file problems (cannot open, too large)
// point at the start of the file.
struct Position {
  int line = 1;
  int column = 1;
};

// Exit code for bad configuration (sysexits.h EX_CONFIG).
inline constexpr int kExitConfig = 78;

class InputError : public std::runtime_error {
 public:
  InputError(std::string file, Position position, std::string message, std::string keyPath = {});

  const std::string& file() const { return file_; }
  Position position() const { return position_; }
  const std::string& message() const { return message_; }
  const std::string& keyPath() const { return keyPath_; }

 private:
  std::string file_;
  Position position_;
  std::string message_;
  std::string keyPath_;
};

}  // namespace consensusd::schema
