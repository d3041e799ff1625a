#pragma once
// Engine-owned objects are touched only from the thread that made them
// (tensorpipe's TP_DCHECK(inLoop()) habit): a promise in comments becomes a
// check in builds with assertions (dev, debug, sanitizers), and costs
// nothing in release.

#include <cassert>
#include <thread>

namespace consensusd::daemon {

class OwnerThread {
 public:
  void check() const { assert(std::this_thread::get_id() == owner_ && "wrong thread"); }

 private:
  std::thread::id owner_ = std::this_thread::get_id();
};

}  // namespace consensusd::daemon
