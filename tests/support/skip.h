// Test cases that cannot run on this machine (no usable CUDA device, a trace file absent)
// report themselves skipped: report_skip() prints a marker that CTest counts as a skip
// (SKIP_REGULAR_EXPRESSION, cmake/PagedkvTesting.cmake), so the summary never counts them
// as passed. The caller returns right after it, asserting nothing.
#ifndef PAGEDKV_TESTS_SUPPORT_SKIP_H_
#define PAGEDKV_TESTS_SUPPORT_SKIP_H_

#include <catch2/catch.hpp>

#include <string>

namespace pagedkv::testing {

inline void report_skip(const std::string& reason) { WARN("PAGEDKV_SKIPPED: " << reason); }

// A whole-workload run (a simulator quick run, a trace replay) makes millions of allocator
// calls; with PAGEDKV_EXPENSIVE_CHECKS each ends with an O(pool) invariant check, which
// takes hours. Such cases report themselves skipped there: the release build runs them,
// and the property tests and fuzzers drive the checked calls.
inline bool skipped_under_expensive_checks() {
#ifdef PAGEDKV_EXPENSIVE_CHECKS
  report_skip(
      "whole-workload run with an invariant check after every call (release build runs it)");
  return true;
#else
  return false;
#endif
}

}  // namespace pagedkv::testing

#endif  // PAGEDKV_TESTS_SUPPORT_SKIP_H_
