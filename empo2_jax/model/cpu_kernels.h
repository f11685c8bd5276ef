// What the CPU kernels (cpu_kernels.cc, cpu_attention.cc) share: the thread-pool loop and AVX2
// helpers. Header only; everything is inline or a template.

#pragma once

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace empo2 {

namespace ffi = xla::ffi;

// Pause-spins a waiting caller makes before it yields its core at each check (a busy machine:
// env workers, a second job): about 0.1 ms on current x86 cores.
constexpr int kSpinsBeforeYield = 2048;

// Runs fn(begin, end) over [0, n) in `chunks` pieces on the pool and the calling thread; returns
// when every piece is done. A piece is claimed by whoever gets to it first, so the call finishes
// even if no pool thread ever starts (a task that starts late finds nothing left and returns
// without touching fn's data). The caller waits for the last pieces spinning a bounded while, then
// yielding between checks.
template <typename F>
inline void ParallelFor(ffi::ThreadPool& pool, int64_t n, int64_t chunks, F fn) {
  chunks = std::max<int64_t>(1, std::min(chunks, n));
  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  auto state = std::make_shared<State>();
  auto work = [state, n, chunks, fn]() {
    for (;;) {
      int64_t c = state->next.fetch_add(1);
      if (c >= chunks) return;
      fn(n * c / chunks, n * (c + 1) / chunks);
      state->done.fetch_add(1, std::memory_order_release);
    }
  };
  int64_t helpers = std::min<int64_t>(pool.num_threads(), chunks) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([work]() { work(); });
  work();
  for (int spins = 0; state->done.load(std::memory_order_acquire) != chunks; ++spins) {
    if (spins < kSpinsBeforeYield)
      _mm_pause();
    else
      std::this_thread::yield();
  }
}

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x) for eight floats: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by a degree-7 polynomial
// (Cephes' expf coefficients; relative error ~1e-7 over float's range), times 2^n built in the
// exponent bits. Inputs below -87.3 give 0 (and -inf, a masked slot, gives 0); NaN gives NaN.
inline __m256 Exp8(__m256 x) {
  const __m256 nan_mask = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256 x_in = x;
  const __m256 lo = _mm256_set1_ps(-87.3f);
  const __m256 zero_mask = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_floor_ps(
      _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_blendv_ps(_mm256_andnot_ps(zero_mask, y), x_in, nan_mask);
}

// The running maximum of a softmax: max(best, s), except that a NaN score makes it NaN for good
// (std::max would skip it), so the softmax's weights come out NaN as in XLA's path.
inline float MaxKeepNaN(float best, float s) { return std::isnan(s) ? s : std::max(best, s); }

// [sum(a[0]), ..., sum(a[7])] as one vector.
inline __m256 Sum8x8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

}  // namespace empo2
