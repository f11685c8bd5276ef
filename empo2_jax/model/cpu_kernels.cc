// CPU kernels for the sampler's decode step and prefill attention, called from JAX through the
// XLA FFI (empo2_jax/model/cpu_kernels.py builds this file and registers the handlers).
//
// A decode step multiplies a few rows (one token per sampled row) by every weight matrix and
// attends over the filled part of the KV cache. Both are passes over memory: the products read
// each weight once, the attention reads each row's keys and values once. XLA:CPU runs the few-row
// products at a fraction of the bandwidth and copies every dynamically sliced cache block before
// its product; these kernels read the weights and the cache in place, in one pass, on XLA's
// intra-op thread pool.
//
//   empo2_rows_matmul_nt  x [M, K] @ w [N, K]^T -> [M, N]: a transposed weight copy, or a tied
//                         embedding as stored (the [K, N] layout as stored is read strided:
//                         5-7 GB/s here, so the sampler keeps transposed copies instead)
//   empo2_cached_attention  q [B, Kh, G, hd], k/v [L, B', Kh, S, hd] (the whole cache), layer []
//                         (which of the L to read), rows [B] (the cache row of each batch row),
//                         last [B] (the query's slot), mask [B, S] -> [B, Kh, G, hd]: softmax
//                         over the slots s <= last[b] with mask[b, s] > 0 of (q . k_s) / sqrt(hd),
//                         times v; zeros if none.
//   empo2_prefill_attention  q [B, T, Kh, G, hd] (hd 64 or 128), the cache as above, layer [],
//                         rows [B], slots [B, T] (each query's slot), mask [B, S]: the same for
//                         each of a prefill chunk's T queries. XLA's blocked attention writes and
//                         rereads each [B, Kh, G, T, block] score block several times (scores,
//                         mask, exp); here a tile of 8 tokens x G heads keeps its scores in L1.
// All float32, accumulation in float32.

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Runs fn(begin, end) over [0, n) in `chunks` pieces on the pool and the calling thread; returns
// when every piece is done. A piece is claimed by whoever gets to it first, so the call finishes
// even if no pool thread ever starts (a task that starts late finds nothing left and returns
// without touching fn's data).
template <typename F>
void ParallelFor(ffi::ThreadPool& pool, int64_t n, int64_t chunks, F fn) {
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
  while (state->done.load(std::memory_order_acquire) != chunks) _mm_pause();
}

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// How far ahead (floats) a weight row's stream is prefetched: 512 (2 KiB, about one 576-wide row)
// gave 28-30 ms against 30-32 without for SmolLM2-135M's decode products on 2 cores.
constexpr int64_t kPrefetch = 512;

// out[r0:r0+R, j] for weight row j of w [N, K]: R dot products of length K at once, the weight
// row streamed from memory once (R accumulators; x's rows come from L1).
template <int R>
inline void DotRows(const float* x, const float* w, float* out, int64_t k, int64_t n, int64_t r0,
                    int64_t j) {
  const int64_t kv = k / 8 * 8;
  const float* wr = w + j * k;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < kv; i += 8) {
    _mm_prefetch(reinterpret_cast<const char*>(wr + i + kPrefetch), _MM_HINT_T0);
    const __m256 wv = _mm256_loadu_ps(wr + i);
    for (int r = 0; r < R; ++r)
      acc[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + (r0 + r) * k + i), acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    float s = HorizontalSum(acc[r]);
    for (int64_t i = kv; i < k; ++i) s += x[(r0 + r) * k + i] * wr[i];
    out[(r0 + r) * n + j] = s;
  }
}

// out[:, n0:n1] = x @ w[n0:n1, :]^T, w [N, K]: each weight row is dotted with eight rows of x at
// a time (then four, then one). Of the tiles tried on 2 cores (rows x weight rows: 8x1, 4x3, 2x4,
// 8x2, 4x2) 8x1 was fastest: 30 ms for the 135M model's products against 37-41.
void MatmulRowsNT(const float* x, const float* w, float* out, int64_t m, int64_t k, int64_t n,
                  int64_t n0, int64_t n1) {
  for (int64_t j = n0; j < n1; ++j) {
    int64_t r0 = 0;
    for (; r0 + 8 <= m; r0 += 8) DotRows<8>(x, w, out, k, n, r0, j);
    for (; r0 + 4 <= m; r0 += 4) DotRows<4>(x, w, out, k, n, r0, j);
    for (; r0 < m; ++r0) DotRows<1>(x, w, out, k, n, r0, j);
  }
}

int64_t Chunks(ffi::ThreadPool& pool, int64_t n, int64_t grain) {
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  return std::max<int64_t>(1, std::min(n / grain, 16 * threads));
}

ffi::Error RowsMatmulNT(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                        ffi::ResultBuffer<ffi::F32> out) {
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1])
    return ffi::Error::InvalidArgument("empo2_rows_matmul_nt: need x [M, K] and w [N, K]");
  const int64_t m = xd[0], k = xd[1], n = wd[0];
  const float* xp = x.typed_data();
  const float* wp = w.typed_data();
  float* op = out->typed_data();
  ParallelFor(pool, n, Chunks(pool, n, 16),
              [=](int64_t a, int64_t b) { MatmulRowsNT(xp, wp, op, m, k, n, a, b); });
  return ffi::Error::Success();
}

// exp(x) for eight floats: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by a degree-7 polynomial
// (Cephes' expf coefficients; relative error ~1e-7 over float's range), times 2^n built in the
// exponent bits. Inputs below -87.3 give 0 (and -inf, a masked slot, gives 0).
inline __m256 Exp8(__m256 x) {
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
  return _mm256_andnot_ps(zero_mask, y);
}

// [sum(a[0]), ..., sum(a[7])] as one vector.
inline __m256 Sum8x8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

constexpr int64_t kChunk = 64;  // slots whose keys (or values) stay in L1 across a group's heads

// One (batch row, KV head) with head_dim = 8 * NV: the G query heads of the group over that head's
// keys and values [S, hd], slots 0..n-1. Scores chunk by chunk (each chunk's keys read once for
// all G heads), a softmax per head, then the values chunk by chunk the same way.
template <int NV>
void AttendVec(const float* q, const float* kh, const float* vh, const int32_t* mask, int64_t n,
               int64_t g, float* out, std::vector<float>& scores) {
  constexpr int64_t hd = 8 * NV;
  const int64_t n8 = (n + 7) / 8 * 8;  // scores padded to whole vectors (pad slots get -inf)
  scores.assign(g * n8, -INFINITY);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t c1 = std::min(n, c0 + kChunk);
    for (int64_t h = 0; h < g; ++h) {
      __m256 qv[NV];
      for (int v = 0; v < NV; ++v) qv[v] = _mm256_loadu_ps(q + h * hd + 8 * v);
      float* sc = scores.data() + h * n8;
      int64_t s = c0;
      for (; s + 8 <= c1; s += 8) {
        __m256 acc[8];
        for (int j = 0; j < 8; ++j) {
          const float* ks = kh + (s + j) * hd;
          __m256 a = _mm256_mul_ps(qv[0], _mm256_loadu_ps(ks));
          for (int v = 1; v < NV; ++v) a = _mm256_fmadd_ps(qv[v], _mm256_loadu_ps(ks + 8 * v), a);
          acc[j] = a;
        }
        _mm256_storeu_ps(sc + s, _mm256_mul_ps(Sum8x8(acc), _mm256_set1_ps(scale)));
      }
      for (; s < c1; ++s) {
        const float* ks = kh + s * hd;
        __m256 a = _mm256_mul_ps(qv[0], _mm256_loadu_ps(ks));
        for (int v = 1; v < NV; ++v) a = _mm256_fmadd_ps(qv[v], _mm256_loadu_ps(ks + 8 * v), a);
        sc[s] = HorizontalSum(a) * scale;
      }
    }
  }
  for (int64_t h = 0; h < g; ++h) {
    float* sc = scores.data() + h * n8;
    float best = -INFINITY;
    for (int64_t s = 0; s < n; ++s) {
      if (mask[s] <= 0) sc[s] = -INFINITY;
      best = std::max(best, sc[s]);
    }
    float* o = out + h * hd;
    std::fill(o, o + hd, 0.f);
    if (best == -INFINITY) {  // no slot seen: zeros, and no weight on any value
      std::fill(sc, sc + n8, 0.f);
      continue;
    }
    __m256 total = _mm256_setzero_ps();
    const __m256 m = _mm256_set1_ps(best);
    for (int64_t s = 0; s < n8; s += 8) {
      const __m256 p = Exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + s), m));
      _mm256_storeu_ps(sc + s, p);
      total = _mm256_add_ps(total, p);
    }
    const __m256 inv = _mm256_set1_ps(1.0f / HorizontalSum(total));
    for (int64_t s = 0; s < n8; s += 8)
      _mm256_storeu_ps(sc + s, _mm256_mul_ps(_mm256_loadu_ps(sc + s), inv));
  }
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t c1 = std::min(n, c0 + kChunk);
    for (int64_t h = 0; h < g; ++h) {
      const float* p = scores.data() + h * n8;
      float* o = out + h * hd;
      __m256 acc[NV];
      for (int v = 0; v < NV; ++v) acc[v] = _mm256_loadu_ps(o + 8 * v);
      for (int64_t s = c0; s < c1; ++s) {
        if (p[s] == 0.f) continue;  // masked (or negligible) slots: their values are never read
        const __m256 b = _mm256_set1_ps(p[s]);
        const float* vs = vh + s * hd;
        for (int v = 0; v < NV; ++v)
          acc[v] = _mm256_fmadd_ps(b, _mm256_loadu_ps(vs + 8 * v), acc[v]);
      }
      for (int v = 0; v < NV; ++v) _mm256_storeu_ps(o + 8 * v, acc[v]);
    }
  }
}

// Any head_dim: the same computation with scalar loops.
void AttendScalar(const float* q, const float* kh, const float* vh, const int32_t* mask, int64_t n,
                  int64_t g, int64_t hd, float* out, std::vector<float>& scores) {
  scores.assign(g * n, -INFINITY);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t h = 0; h < g; ++h) {
    float* sc = scores.data() + h * n;
    float best = -INFINITY;
    for (int64_t s = 0; s < n; ++s) {
      if (mask[s] <= 0) continue;
      float d = 0.f;
      for (int64_t i = 0; i < hd; ++i) d += q[h * hd + i] * kh[s * hd + i];
      sc[s] = d * scale;
      best = std::max(best, sc[s]);
    }
    float* o = out + h * hd;
    std::fill(o, o + hd, 0.f);
    if (best == -INFINITY) continue;
    float total = 0.f;
    for (int64_t s = 0; s < n; ++s) total += sc[s] = mask[s] > 0 ? std::exp(sc[s] - best) : 0.f;
    for (int64_t s = 0; s < n; ++s)
      for (int64_t i = 0; i < hd; ++i) o[i] += sc[s] / total * vh[s * hd + i];
  }
}

void AttendOne(const float* q, const float* kh, const float* vh, const int32_t* mask, int64_t last,
               int64_t g, int64_t hd, float* out, std::vector<float>& scores) {
  if (hd == 64) return AttendVec<8>(q, kh, vh, mask, last + 1, g, out, scores);
  if (hd == 128) return AttendVec<16>(q, kh, vh, mask, last + 1, g, out, scores);
  AttendScalar(q, kh, vh, mask, last + 1, g, hd, out, scores);
}

ffi::Error CachedAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                           ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> layer,
                           ffi::Buffer<ffi::S32> rows,
                           ffi::Buffer<ffi::S32> last, ffi::Buffer<ffi::S32> mask,
                           ffi::ResultBuffer<ffi::F32> out) {
  auto qd = q.dimensions(), kd = k.dimensions(), md = mask.dimensions();
  if (qd.size() != 4 || kd.size() != 5 || md.size() != 2 || qd[1] != kd[2] || qd[3] != kd[4] ||
      md[0] != qd[0] || md[1] != kd[3] || layer.element_count() != 1 ||
      rows.element_count() != qd[0] || last.element_count() != qd[0])
    return ffi::Error::InvalidArgument(
        "empo2_cached_attention: need q [B, Kh, G, hd], k/v [L, B', Kh, S, hd], layer [], rows "
        "[B], last [B], mask [B, S]");
  const int64_t b = qd[0], kvh = qd[1], g = qd[2], hd = qd[3], b_all = kd[1], s = kd[3];
  const int64_t li = layer.typed_data()[0];
  if (li < 0 || li >= kd[0])
    return ffi::Error::InvalidArgument("empo2_cached_attention: the layer index is out of range");
  const float* qp = q.typed_data();
  const float* kp = k.typed_data();
  const float* vp = v.typed_data();
  const int32_t* rp = rows.typed_data();
  const int32_t* lp = last.typed_data();
  const int32_t* mp = mask.typed_data();
  float* op = out->typed_data();
  for (int64_t i = 0; i < b; ++i)
    if (rp[i] < 0 || rp[i] >= b_all)
      return ffi::Error::InvalidArgument("empo2_cached_attention: a row index is out of range");
  ParallelFor(pool, b * kvh, b * kvh, [=](int64_t a, int64_t e) {
    std::vector<float> scores;
    for (int64_t t = a; t < e; ++t) {
      const int64_t bi = t / kvh, h = t % kvh;
      const int64_t last_slot = std::min<int64_t>(lp[bi], s - 1);
      const int64_t off = ((li * b_all + rp[bi]) * kvh + h) * s * hd;
      float* o = op + (bi * kvh + h) * g * hd;
      if (last_slot < 0) {
        std::fill(o, o + g * hd, 0.f);
        continue;
      }
      AttendOne(qp + (bi * kvh + h) * g * hd, kp + off, vp + off, mp + bi * s, last_slot, g, hd, o,
                scores);
    }
  });
  return ffi::Error::Success();
}


// A tile of prefill queries of one (batch row, KV head): nq = tq tokens x G heads, q [nq, hd]
// scaled by 1 / sqrt(hd), query i of token i / G seeing slot s when s <= slot[i / G] and
// mask[s] > 0. Keys and values are read kChunk slots at a time, once for the whole tile, with an
// online softmax (running max m, sum l and weighted values per query). out [nq, hd].
template <int NV>
void AttendTile(const float* q, const int32_t* slot, int64_t nq, int64_t g, const float* kh,
                const float* vh, const int32_t* mask, int64_t n, float* out,
                std::vector<float>& scratch) {
  constexpr int64_t hd = 8 * NV;
  scratch.assign(nq * (kChunk + 2), 0.f);
  float* sc = scratch.data();                // [nq, kChunk] this chunk's scores, then weights
  float* m = sc + nq * kChunk;               // [nq] running max
  float* l = m + nq;                         // [nq] running sum
  std::fill(m, m + nq, -INFINITY);
  std::fill(out, out + nq * hd, 0.f);
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t c1 = std::min(n, c0 + kChunk), len = c1 - c0;
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t last = slot[i / g];
      float* si = sc + i * kChunk;
      if (last < c0) {  // the whole chunk lies past this query
        std::fill(si, si + kChunk, -INFINITY);
        continue;
      }
      __m256 qv[NV];
      for (int v = 0; v < NV; ++v) qv[v] = _mm256_loadu_ps(q + i * hd + 8 * v);
      int64_t s = 0;
      for (; s + 8 <= len; s += 8) {
        __m256 acc[8];
        for (int j = 0; j < 8; ++j) {
          const float* ks = kh + (c0 + s + j) * hd;
          __m256 a = _mm256_mul_ps(qv[0], _mm256_loadu_ps(ks));
          for (int v = 1; v < NV; ++v) a = _mm256_fmadd_ps(qv[v], _mm256_loadu_ps(ks + 8 * v), a);
          acc[j] = a;
        }
        _mm256_storeu_ps(si + s, Sum8x8(acc));
      }
      for (; s < len; ++s) {
        const float* ks = kh + (c0 + s) * hd;
        __m256 a = _mm256_mul_ps(qv[0], _mm256_loadu_ps(ks));
        for (int v = 1; v < NV; ++v) a = _mm256_fmadd_ps(qv[v], _mm256_loadu_ps(ks + 8 * v), a);
        si[s] = HorizontalSum(a);
      }
      for (s = len; s < kChunk; ++s) si[s] = -INFINITY;
      for (s = 0; s < len; ++s)
        if (c0 + s > last || mask[c0 + s] <= 0) si[s] = -INFINITY;
    }
    for (int64_t i = 0; i < nq; ++i) {
      float* si = sc + i * kChunk;
      float best = m[i];
      for (int64_t s = 0; s < len; ++s) best = std::max(best, si[s]);
      if (best == -INFINITY) {  // nothing seen yet: no weight on any value
        std::fill(si, si + kChunk, 0.f);
        continue;
      }
      const float scale = m[i] == -INFINITY ? 0.f : std::exp(m[i] - best);
      m[i] = best;
      __m256 total = _mm256_setzero_ps();
      const __m256 mv = _mm256_set1_ps(best);
      for (int64_t s = 0; s < kChunk; s += 8) {
        const __m256 p = Exp8(_mm256_sub_ps(_mm256_loadu_ps(si + s), mv));
        _mm256_storeu_ps(si + s, p);
        total = _mm256_add_ps(total, p);
      }
      l[i] = l[i] * scale + HorizontalSum(total);
      float* o = out + i * hd;
      __m256 acc[NV];
      const __m256 sv = _mm256_set1_ps(scale);
      for (int v = 0; v < NV; ++v) acc[v] = _mm256_mul_ps(sv, _mm256_loadu_ps(o + 8 * v));
      for (int64_t s = 0; s < len; ++s) {
        if (si[s] == 0.f) continue;  // masked (or negligible) slots: their values are never read
        const __m256 b = _mm256_set1_ps(si[s]);
        const float* vs = vh + (c0 + s) * hd;
        for (int v = 0; v < NV; ++v)
          acc[v] = _mm256_fmadd_ps(b, _mm256_loadu_ps(vs + 8 * v), acc[v]);
      }
      for (int v = 0; v < NV; ++v) _mm256_storeu_ps(o + 8 * v, acc[v]);
    }
  }
  for (int64_t i = 0; i < nq; ++i) {
    float* o = out + i * hd;
    const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;  // l = 0: the query saw no slot, zeros
    for (int64_t d = 0; d < hd; ++d) o[d] *= inv;
  }
}

constexpr int64_t kTileTokens = 8;  // prefill query tokens per task (times G query heads)

ffi::Error PrefillAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                            ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> layer,
                            ffi::Buffer<ffi::S32> rows, ffi::Buffer<ffi::S32> slots,
                            ffi::Buffer<ffi::S32> mask, ffi::ResultBuffer<ffi::F32> out) {
  auto qd = q.dimensions(), kd = k.dimensions(), md = mask.dimensions(), sd = slots.dimensions();
  if (qd.size() != 5 || kd.size() != 5 || md.size() != 2 || sd.size() != 2 || qd[2] != kd[2] ||
      qd[4] != kd[4] || md[0] != qd[0] || md[1] != kd[3] || sd[0] != qd[0] || sd[1] != qd[1] ||
      layer.element_count() != 1 || rows.element_count() != qd[0] ||
      (qd[4] != 64 && qd[4] != 128))
    return ffi::Error::InvalidArgument(
        "empo2_prefill_attention: need q [B, T, Kh, G, hd] with hd 64 or 128, k/v [L, B', Kh, S, "
        "hd], layer [], rows [B], slots [B, T], mask [B, S]");
  const int64_t b = qd[0], t = qd[1], kvh = qd[2], g = qd[3], hd = qd[4], b_all = kd[1],
                s = kd[3];
  const int64_t li = layer.typed_data()[0];
  if (li < 0 || li >= kd[0])
    return ffi::Error::InvalidArgument("empo2_prefill_attention: the layer index is out of range");
  const float* qp = q.typed_data();
  const float* kp = k.typed_data();
  const float* vp = v.typed_data();
  const int32_t* rp = rows.typed_data();
  const int32_t* sp = slots.typed_data();
  const int32_t* mp = mask.typed_data();
  float* op = out->typed_data();
  for (int64_t i = 0; i < b; ++i)
    if (rp[i] < 0 || rp[i] >= b_all)
      return ffi::Error::InvalidArgument("empo2_prefill_attention: a row index is out of range");
  const int64_t tiles = (t + kTileTokens - 1) / kTileTokens, tasks = b * kvh * tiles;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  ParallelFor(pool, tasks, tasks, [=](int64_t a, int64_t e) {
    std::vector<float> qt, ot, scratch;
    for (int64_t task = a; task < e; ++task) {
      const int64_t bi = task / (kvh * tiles), h = task / tiles % kvh;
      const int64_t t0 = task % tiles * kTileTokens;
      const int64_t tq = std::min(kTileTokens, t - t0), nq = tq * g;
      const int32_t* slot = sp + bi * t + t0;
      int64_t n = 0;
      for (int64_t i = 0; i < tq; ++i)
        n = std::max<int64_t>(n, std::min<int64_t>(slot[i], s - 1) + 1);
      qt.resize(nq * hd);
      ot.resize(nq * hd);
      for (int64_t i = 0; i < tq; ++i)
        for (int64_t j = 0; j < g * hd; ++j)
          qt[i * g * hd + j] = qp[((bi * t + t0 + i) * kvh + h) * g * hd + j] * scale;
      const int64_t off = ((li * b_all + rp[bi]) * kvh + h) * s * hd;
      const float *kh = kp + off, *vh = vp + off;
      if (hd == 64)
        AttendTile<8>(qt.data(), slot, nq, g, kh, vh, mp + bi * s, n, ot.data(), scratch);
      else
        AttendTile<16>(qt.data(), slot, nq, g, kh, vh, mp + bi * s, n, ot.data(), scratch);
      for (int64_t i = 0; i < tq; ++i)
        std::copy(ot.data() + i * g * hd, ot.data() + (i + 1) * g * hd,
                  op + ((bi * t + t0 + i) * kvh + h) * g * hd);
    }
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(Empo2RowsMatmulNT, RowsMatmulNT,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(Empo2CachedAttention, CachedAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(Empo2PrefillAttention, PrefillAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
