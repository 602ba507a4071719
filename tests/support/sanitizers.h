// File: tests/support/sanitizers.h
//
// kSanitized: true when the tests are built with AddressSanitizer (GCC defines
// __SANITIZE_ADDRESS__, clang answers __has_feature). Slow tests scale down or skip their
// largest cases there; the unsanitized build runs them in full.
#ifndef PAGEDKV_TESTS_SUPPORT_SANITIZERS_H_
#define PAGEDKV_TESTS_SUPPORT_SANITIZERS_H_

namespace pagedkv::testing {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace pagedkv::testing

#endif  // PAGEDKV_TESTS_SUPPORT_SANITIZERS_H_
