// Element conversions (pagedkv/numeric.h) shared by the CPU reference and the kernels.
#include "pagedkv/numeric.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace pagedkv {
namespace {

TEST_CASE("every fp16 and bf16 value round-trips through fp32 bit for bit", "[numeric]") {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float h = to_float(Half{bits});
    const float bf = to_float(BFloat16{bits});
    if (std::isnan(h)) {
      CHECK(std::isnan(to_float(from_float<Half>(h))));
    } else if (from_float<Half>(h).bits != bits) {
      FAIL("fp16 bits " << b);
    }
    if (std::isnan(bf)) {
      CHECK(std::isnan(to_float(from_float<BFloat16>(bf))));
    } else if (from_float<BFloat16>(bf).bits != bits) {
      FAIL("bf16 bits " << b);
    }
  }
  CHECK(to_float(Half{0x3c00}) == 1.0f);
  CHECK(to_float(Half{0x0001}) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(std::isinf(to_float(Half{0x7c00})));
  CHECK(to_float(BFloat16{0x3f80}) == 1.0f);
}

TEST_CASE("every fp8 e4m3 value round-trips, 448 is the largest, NaN stays NaN", "[numeric]") {
  for (uint32_t b = 0; b < 0x100; ++b) {
    const float x = to_float(Fp8E4M3{static_cast<uint8_t>(b)});
    if ((b & 0x7f) == 0x7f) {
      CHECK(std::isnan(x));
      CHECK(std::isnan(to_float(from_float<Fp8E4M3>(x))));
      continue;
    }
    CHECK(from_float<Fp8E4M3>(x).bits == b);
  }
  CHECK(to_float(Fp8E4M3{0x7e}) == 448.0f);
  CHECK(to_float(Fp8E4M3{0x01}) == std::ldexp(1.0f, -9));
  CHECK(from_float<Fp8E4M3>(1000.0f).bits == 0x7e);  // saturates
  CHECK(from_float<Fp8E4M3>(-1e30f).bits == 0xfe);
  CHECK(from_float<Fp8E4M3>(INFINITY).bits == 0x7e);
}

TEST_CASE("conversions round to nearest, ties to even", "[numeric]") {
  // fp16: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 -> 1 (even).
  CHECK(from_float<Half>(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00);
  CHECK(from_float<Half>(1.0f + 3 * std::ldexp(1.0f, -11)).bits == 0x3c02);
  CHECK(from_float<Half>(65520.0f).bits == 0x7c00);  // rounds to Inf
  CHECK(from_float<Half>(65519.0f).bits == 0x7bff);
  CHECK(from_float<Half>(std::ldexp(1.5f, -24)).bits == 0x0002);  // subnormal tie -> even
  // bf16: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> 1.
  CHECK(from_float<BFloat16>(1.0f + std::ldexp(1.0f, -8)).bits == 0x3f80);
  CHECK(from_float<BFloat16>(1.0f + 3 * std::ldexp(1.0f, -8)).bits == 0x3f82);
  // fp8: 1.0625 is halfway between 1 and 1.125 -> 1; 1.1875 -> 1.25.
  CHECK(to_float(from_float<Fp8E4M3>(1.0625f)) == 1.0f);
  CHECK(to_float(from_float<Fp8E4M3>(1.1875f)) == 1.25f);
  CHECK(to_float(from_float<Fp8E4M3>(464.0f)) == 448.0f);
  CHECK(to_float(from_float<Fp8E4M3>(std::ldexp(1.5f, -9))) == std::ldexp(2.0f, -9));
  CHECK(to_float(from_float<Fp8E4M3>(std::ldexp(0.5f, -9))) == 0.0f);
}

}  // namespace
}  // namespace pagedkv
