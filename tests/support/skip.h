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

}  // namespace pagedkv::testing

#endif  // PAGEDKV_TESTS_SUPPORT_SKIP_H_
