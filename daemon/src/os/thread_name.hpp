#pragma once
// Names the calling thread as `top -H`, `ps -L`, /proc/PID/task/*/comm and
// gdb show it, so an operator can tell the daemon's threads apart.

#include <pthread.h>

namespace consensusd::daemon {

// `name` has at most 15 characters (the kernel's limit).
inline void nameThisThread(const char* name) {
  pthread_setname_np(pthread_self(), name);
}

}  // namespace consensusd::daemon
