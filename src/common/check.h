// Internal assertion levels. Each compiles away unless its level is enabled:
//   PAGEDKV_DCHECK(cond)            O(1) checks; on when NDEBUG is not defined.
//   PAGEDKV_DCHECK_EXPENSIVE(cond)  O(n) walks; on with -DPAGEDKV_EXPENSIVE_CHECKS=ON.
// Release builds pay nothing. Recoverable errors never use these: they return a Status.
#ifndef PAGEDKV_COMMON_CHECK_H_
#define PAGEDKV_COMMON_CHECK_H_

#include <cstdio>
#include <cstdlib>

namespace pagedkv::internal {

[[noreturn]] inline void check_failed(const char* condition, const char* file, int line) {
  std::fprintf(stderr, "pagedkv: check failed at %s:%d: %s\n", file, line, condition);
  std::abort();
}

}  // namespace pagedkv::internal

#define PAGEDKV_CHECK(cond) \
  ((cond) ? static_cast<void>(0) : ::pagedkv::internal::check_failed(#cond, __FILE__, __LINE__))

#ifndef NDEBUG
#define PAGEDKV_DCHECK(cond) PAGEDKV_CHECK(cond)
#else
#define PAGEDKV_DCHECK(cond) static_cast<void>(0)
#endif

#ifdef PAGEDKV_EXPENSIVE_CHECKS
#define PAGEDKV_DCHECK_EXPENSIVE(cond) PAGEDKV_CHECK(cond)
#else
#define PAGEDKV_DCHECK_EXPENSIVE(cond) static_cast<void>(0)
#endif

#endif  // PAGEDKV_COMMON_CHECK_H_
