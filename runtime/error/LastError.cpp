//===- LastError.cpp - the calling thread's last nsa error ----------------===//
//
// NSA-c/Error.h: one thread-local message for every nsa C library.
//
//===----------------------------------------------------------------------===//

#include "NSA-c/Error.h"

#include <string>

namespace {
thread_local std::string lastError;
} // namespace

extern "C" const char *nsaGetLastError(void) { return lastError.c_str(); }

extern "C" void nsaSetLastError(const char *message) {
  if (message)
    lastError = message;
  else
    lastError.clear();
}
