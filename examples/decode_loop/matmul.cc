// The example model's matrix product (declared in model.h), in a file of its own so that
// sanitizer builds can leave it uninstrumented (CMakeLists.txt).
#include <cstddef>
#include <cstdint>

#include "model.h"

namespace decode_loop {
namespace {

// Rows of x per pass over a weight column; each row's arithmetic is the same for any R.
template <int R>
void matmul_rows(const float* x, const float* wt, float* y, int32_t in, int32_t out) {
  for (int32_t j = 0; j < out; ++j) {
    const float* wj = wt + static_cast<size_t>(j) * in;
    float acc[R][8] = {};
    for (int32_t k = 0; k < in; k += 8) {
      for (int r = 0; r < R; ++r) {
        const float* xr = x + static_cast<size_t>(r) * in + k;
        for (int l = 0; l < 8; ++l) acc[r][l] += xr[l] * wj[k + l];
      }
    }
    for (int r = 0; r < R; ++r) {
      const float* a = acc[r];
      y[static_cast<size_t>(r) * out + j] =
          ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    }
  }
}

}  // namespace

// w is stored transposed, [out, in]; `in` is a multiple of 8 (checked by Model).
void matmul(const float* x, const float* wt, float* y, int32_t n, int32_t in, int32_t out) {
  int32_t r = 0;
  for (; r + 4 <= n; r += 4) {
    matmul_rows<4>(x + static_cast<size_t>(r) * in, wt, y + static_cast<size_t>(r) * out, in, out);
  }
  for (; r < n; ++r) {
    matmul_rows<1>(x + static_cast<size_t>(r) * in, wt, y + static_cast<size_t>(r) * out, in, out);
  }
}

}  // namespace decode_loop
