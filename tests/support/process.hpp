#pragma once
// Runs a real binary as a child process for integration tests: feeds stdin,
// collects stdout/stderr, and kills it (SIGKILL) if it outlives its deadline.
// The child is always reaped before runProcess returns.

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace consensusd::testing {

struct ProcessResult {
  int exitCode = -1;  // -1 when killed by a signal
  int signal = 0;     // the signal that ended it, 0 if it exited
  bool timedOut = false;
  std::string out;
  std::string err;
};

ProcessResult runProcess(const std::vector<std::string>& argv, const std::string& input = {},
                         std::chrono::milliseconds timeout = std::chrono::seconds(30));

// A long-running child (a daemon under test): output goes to `logFile`; the
// destructor SIGKILLs and reaps it if it is still running.
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::string& logFile);
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  int pid() const { return pid_; }
  void signal(int number) const;
  // The exit code once it has exited within `timeout` (-signal if killed), else none.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  bool running();

 private:
  int pid_ = -1;
  std::optional<int> status_;
};

// The whole file ("" if it cannot be read).
std::string readText(const std::string& path);

// Polls `condition` every 20 ms until it holds or `timeout` passes.
bool waitFor(const std::function<bool()>& condition, std::chrono::milliseconds timeout);

// A fresh folder under $TMPDIR, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // Writes `text` to path()/name and returns the full path.
  std::string write(const std::string& name, const std::string& text) const;

 private:
  std::string path_;
};

}  // namespace consensusd::testing
