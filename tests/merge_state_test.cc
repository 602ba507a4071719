// MergeState (pagedkv/merge_state.h): the log-sum-exp merge of softmax partials.
#include "pagedkv/merge_state.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

namespace pagedkv {
namespace {

// A partial over scores `s` (base 2) with values `v`: state and unnormalized o.
struct Partial {
  MergeState state;
  std::vector<float> o;
};

Partial make_partial(const std::vector<float>& s, const std::vector<std::vector<float>>& v) {
  Partial p{MergeState{}, std::vector<float>(v.empty() ? 2 : v[0].size(), 0.0f)};
  for (float x : s) p.state.m = std::max(p.state.m, x);
  for (size_t j = 0; j < s.size(); ++j) {
    const float e = std::exp2(s[j] - p.state.m);
    p.state.l += e;
    for (size_t d = 0; d < p.o.size(); ++d) p.o[d] += e * v[j][d];
  }
  return p;
}

Partial merged(Partial a, const Partial& b) {
  const MergeScales s = merge_into(a.state, b.state);
  for (size_t d = 0; d < a.o.size(); ++d) a.o[d] = a.o[d] * s.self + b.o[d] * s.other;
  return a;
}

std::vector<float> output(const Partial& p) {
  std::vector<float> out(p.o);
  for (float& x : out) x *= inv_sum(p.state);
  return out;
}

TEST_CASE("merging partials equals softmax over their union", "[merge_state]") {
  const std::vector<float> s1 = {0.5f, -3.0f, 2.0f}, s2 = {7.0f, -1.0f};
  const std::vector<std::vector<float>> v1 = {{1, 2}, {3, 4}, {5, 6}}, v2 = {{-1, 0}, {2, 2}};
  std::vector<float> s_all = s1;
  s_all.insert(s_all.end(), s2.begin(), s2.end());
  auto v_all = v1;
  v_all.insert(v_all.end(), v2.begin(), v2.end());
  const Partial whole = make_partial(s_all, v_all);
  const Partial m = merged(make_partial(s1, v1), make_partial(s2, v2));
  CHECK(m.state.m == whole.state.m);
  CHECK(m.state.l == Approx(whole.state.l).epsilon(1e-6));
  const std::vector<float> a = output(m), b = output(whole);
  for (size_t d = 0; d < a.size(); ++d) CHECK(a[d] == Approx(b[d]).epsilon(1e-6));
  CHECK(natural_lse(m.state) == Approx(natural_lse(whole.state)).epsilon(1e-6));
}

TEST_CASE("merge is commutative (exactly) and associative (to rounding)", "[merge_state]") {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uni(-8.0f, 8.0f);
  for (int trial = 0; trial < 50; ++trial) {
    Partial p[3];
    for (Partial& x : p) {
      std::vector<float> s(1 + rng() % 5);
      std::vector<std::vector<float>> v(s.size(), std::vector<float>(4));
      for (size_t j = 0; j < s.size(); ++j) {
        s[j] = uni(rng);
        for (float& e : v[j]) e = uni(rng);
      }
      x = make_partial(s, v);
    }
    const Partial ab = merged(p[0], p[1]), ba = merged(p[1], p[0]);
    CHECK(ab.state.m == ba.state.m);
    CHECK(ab.state.l == ba.state.l);
    CHECK(ab.o == ba.o);
    const Partial left = merged(merged(p[0], p[1]), p[2]);
    const Partial right = merged(p[0], merged(p[1], p[2]));
    CHECK(left.state.m == right.state.m);
    CHECK(left.state.l == Approx(right.state.l).epsilon(1e-5));
    const std::vector<float> a = output(left), b = output(right);
    for (size_t d = 0; d < a.size(); ++d) CHECK(a[d] == Approx(b[d]).epsilon(1e-5).margin(1e-6));
  }
}

TEST_CASE("an empty partial merges as an exact no-op", "[merge_state]") {
  const Partial p = make_partial({1.5f, -2.0f}, {{1, -1}, {0.25f, 4}});
  const Partial empty{MergeState{}, {0.0f, 0.0f}};
  for (const Partial& m : {merged(p, empty), merged(empty, p)}) {
    CHECK(m.state.m == p.state.m);
    CHECK(m.state.l == p.state.l);
    CHECK(m.o == p.o);
  }
}

TEST_CASE("two empty partials merge to empty: zeros and lse -inf, never NaN", "[merge_state]") {
  const Partial empty{MergeState{}, {0.0f, 0.0f}};
  const Partial m = merged(empty, empty);
  CHECK(m.state.m == -INFINITY);
  CHECK(m.state.l == 0.0f);
  CHECK(inv_sum(m.state) == 0.0f);
  for (float x : output(m)) CHECK(x == 0.0f);
  CHECK(std::isinf(natural_lse(m.state)));
  CHECK(natural_lse(m.state) < 0);
}

TEST_CASE("raise_max rescales, and is a no-op for -inf or a lower max", "[merge_state]") {
  MergeState s;
  CHECK(raise_max(s, -INFINITY) == 1.0f);  // still empty, no NaN from -inf - -inf
  CHECK(s.m == -INFINITY);
  CHECK(raise_max(s, 3.0f) == 0.0f);  // empty state: old vector (zeros) scaled by 0
  s.l = 1.0f;
  CHECK(raise_max(s, 1.0f) == 1.0f);
  CHECK(raise_max(s, 5.0f) == 0.25f);
  CHECK(s.m == 5.0f);
  CHECK(s.l == 0.25f);
  CHECK(natural_lse(s) == Approx((5.0 + std::log2(0.25)) * std::log(2.0)));
}

}  // namespace
}  // namespace pagedkv
