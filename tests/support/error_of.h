// Runs a callable that must throw hybridflow::Error and returns the message, so tests can assert
// on what the user would read. Records a test failure when nothing (or something else) is thrown.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "hybridflow/core/error.h"

namespace hybridflow::testing {

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected hybridflow::Error";
  return "";
}

}  // namespace hybridflow::testing
