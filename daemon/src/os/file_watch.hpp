#pragma once
// Tells the engine loop that a file may have changed, by watching its
// folder with inotify: editors and tools replace a file by renaming a new
// one over it, and a Kubernetes ConfigMap volume swaps its `..data` symlink,
// so the folder, not the file, sees the change. A change is a hint to read
// the file again; what it holds decides whether anything changes.

#include <string>

namespace consensusd::daemon {

class FileWatch {
 public:
  // Throws std::system_error if the folder of `path` cannot be watched.
  explicit FileWatch(const std::string& path);
  ~FileWatch();
  FileWatch(const FileWatch&) = delete;
  FileWatch& operator=(const FileWatch&) = delete;

  // Readable (for poll) when events are waiting.
  int fd() const { return fd_; }
  // Drains the waiting events; true if any was a write closed or a name
  // moved into the folder (a file complete where it is read).
  bool changed();

 private:
  int fd_;
};

}  // namespace consensusd::daemon
