// CPU kernels for the sampler's decode step and prefill attention, called from JAX through the
// XLA FFI (empo2_jax/model/cpu_kernels.py builds this file with cpu_attention.cc into one library
// and registers the handlers). This file: the products; cpu_attention.cc: both attention kernels;
// cpu_kernels.h: what they share.
//
// A decode step multiplies a few rows (one token per sampled row) by every weight matrix and
// attends over the filled part of the KV cache. Both are passes over memory: the products read
// each weight once, the attention reads each row's keys and values once. XLA:CPU runs the few-row
// products at a fraction of the bandwidth and copies every dynamically sliced cache block before
// its product; these kernels read the weights and the cache in place, in one pass, on XLA's
// intra-op thread pool.
//
//   empo2_rows_matmul_nt  x [M, K] @ w [N, K]^T -> [M, N]: a transposed weight copy, or a tied
//                         embedding as stored (the [K, N] layout as stored would be read
//                         strided, so the sampler keeps transposed copies instead)
//   empo2_cached_attention  q [B, Kh, G, hd], k/v [L, B', Kh, S, hd] (the whole cache), layer []
//                         (which of the L to read), rows [B] (the cache row of each batch row),
//                         last [B] (the query's slot), mask [B, S] -> [B, Kh, G, hd]: softmax
//                         over the slots s <= last[b] with mask[b, s] > 0 of (q . k_s) / sqrt(hd),
//                         times v; zeros if none.
//   empo2_prefill_attention  q [B, T, Kh, G, hd] (hd 64 or 128), the cache as above, layer [],
//                         rows [B], slots [B, T] (each query's slot), mask [B, S]: the same for
//                         each of a prefill chunk's T queries. XLA's blocked attention writes and
//                         rereads each [B, Kh, G, T, block] score block several times (scores,
//                         mask, exp); in the kernel a tile of 8 tokens x G heads keeps its
//                         scores in L1.
// All float32, accumulation in float32. A NaN in the inputs gives NaN where XLA's path gives it.
// Tile sizes and the prefetch distance were chosen by timing (docs/records/benchmarks.md).

#include "cpu_kernels.h"

namespace {

using namespace empo2;

// How far ahead (floats) a weight row's stream is prefetched: 512 (2 KiB, about one 576-wide row).
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
// a time (then four, then one).
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

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(Empo2RowsMatmulNT, RowsMatmulNT,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
