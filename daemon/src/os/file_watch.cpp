#include "os/file_watch.hpp"

#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

namespace consensusd::daemon {

namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

}  // namespace

FileWatch::FileWatch(const std::string& path) : fd_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
  if (fd_ < 0) fail("inotify_init1");
  std::filesystem::path folder = std::filesystem::path(path).parent_path();
  if (folder.empty()) folder = ".";
  // Not IN_CREATE or IN_MODIFY: a file is read once it is whole (closed
  // after writing, or renamed into place), not while it is being written.
  if (::inotify_add_watch(fd_, folder.c_str(), IN_CLOSE_WRITE | IN_MOVED_TO) < 0) {
    const int error = errno;
    ::close(fd_);
    errno = error;
    fail("watching " + folder.string());
  }
}

FileWatch::~FileWatch() {
  ::close(fd_);
}

bool FileWatch::changed() {
  alignas(inotify_event) char buffer[4096];
  bool any = false;
  for (;;) {
    const ssize_t n = ::read(fd_, buffer, sizeof buffer);
    if (n <= 0) return any;  // EAGAIN: drained
    // Only the events asked for arrive, and IN_Q_OVERFLOW means some were
    // lost: either way, read the file again.
    any = true;
  }
}

}  // namespace consensusd::daemon
