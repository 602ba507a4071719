// Internal assertion levels. Each compiles away unless its level is enabled:
//   PAGEDKV_DCHECK(cond)            O(1) checks; on when NDEBUG is not defined.
//   PAGEDKV_CHECK_INVARIANTS_ON_EXIT()  in a mutating call of BlockPool or KvCacheManager:
//                                   check_invariants() when the call returns, aborting with
//                                   its message if broken; on with
//                                   -DPAGEDKV_EXPENSIVE_CHECKS=ON (an O(n) walk per call).
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
namespace pagedkv::internal {

// Checks its owner's invariants when the scope that made it ends, on every return path.
template <typename Owner>
class InvariantsOnExit {
 public:
  explicit InvariantsOnExit(const Owner& owner) : owner_(owner) {}
  InvariantsOnExit(const InvariantsOnExit&) = delete;
  InvariantsOnExit& operator=(const InvariantsOnExit&) = delete;
  ~InvariantsOnExit() {
    const auto status = owner_.check_invariants();
    if (status.ok()) return;
    std::fprintf(stderr, "pagedkv: invariant broken after a call: %s\n", status.ToString().c_str());
    std::abort();
  }

 private:
  const Owner& owner_;
};

}  // namespace pagedkv::internal
#define PAGEDKV_CHECK_INVARIANTS_ON_EXIT() \
  const ::pagedkv::internal::InvariantsOnExit pagedkv_invariants_on_exit(*this)
#else
#define PAGEDKV_CHECK_INVARIANTS_ON_EXIT() static_cast<void>(0)
#endif

#endif  // PAGEDKV_COMMON_CHECK_H_
