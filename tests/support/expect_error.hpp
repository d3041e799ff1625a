#pragma once
// The message of the exception `body` throws, for tests that assert exact
// error texts: "no error" when it throws nothing.

#include <string>

namespace consensusd::testing {

template <class Error, class Body>
std::string errorText(Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace consensusd::testing
