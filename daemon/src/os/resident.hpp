#pragma once
// Model-sized buffers made resident before the node joins its neighbours.
// A fresh page costs a fault on first touch (about 1 s per GB on a virtual
// machine even with huge pages), and zeroing does not always touch: the
// compiler may turn malloc + memset into calloc, which leaves fresh pages
// untouched. A first round that faulted in a few GB stalled the engine
// thread for seconds, long enough for neighbours to time out.

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace consensusd::daemon {

inline void makeResident(std::span<std::byte> buffer) {
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif
  if (buffer.empty()) return;
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(buffer.data());
  const std::uintptr_t first = (begin + page - 1) / page * page;
  const std::uintptr_t last = (begin + buffer.size()) / page * page;
  // Populated writable by the kernel in one call; else a write per page
  // (a byte written back as it was: the contents stay).
  if (last > first &&
      ::madvise(reinterpret_cast<void*>(first), last - first, MADV_POPULATE_WRITE) == 0)
    return;
  volatile std::byte* bytes = buffer.data();
  for (std::size_t at = 0; at < buffer.size(); at += page) bytes[at] = bytes[at];
}

}  // namespace consensusd::daemon
