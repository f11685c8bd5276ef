// The attention kernels of cpu_kernels.cc's list (empo2_cached_attention, one query a row, and
// empo2_prefill_attention, a prefill chunk's queries): each reads one layer of the
// [L, B', Kh, S, hd] cache in place, 64-slot chunks of a (row, KV head)'s keys and values at a
// time, shared by the group's query heads.

#include <string>
#include <vector>

#include "cpu_kernels.h"

namespace {

using namespace empo2;

constexpr int64_t kChunk = 64;  // slots whose keys (or values) stay in L1 across a group's heads

// q . k_s for one query (qv: its 8 * NV floats) and key row ks.
template <int NV>
inline __m256 DotVec(const __m256* qv, const float* ks) {
  __m256 a = _mm256_mul_ps(qv[0], _mm256_loadu_ps(ks));
  for (int v = 1; v < NV; ++v) a = _mm256_fmadd_ps(qv[v], _mm256_loadu_ps(ks + 8 * v), a);
  return a;
}

// Scores of one query against key rows [s0, s1) of kh (head_dim 8 * NV) into sc[s0:s1], times
// scale: eight slots at a time, their sums in one vector.
template <int NV>
inline void ScoreRange(const __m256* qv, const float* kh, int64_t s0, int64_t s1, float scale,
                       float* sc) {
  constexpr int64_t hd = 8 * NV;
  int64_t s = s0;
  for (; s + 8 <= s1; s += 8) {
    __m256 acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = DotVec<NV>(qv, kh + (s + j) * hd);
    _mm256_storeu_ps(sc + s, _mm256_mul_ps(Sum8x8(acc), _mm256_set1_ps(scale)));
  }
  for (; s < s1; ++s) sc[s] = HorizontalSum(DotVec<NV>(qv, kh + s * hd)) * scale;
}

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
      ScoreRange<NV>(qv, kh, c0, c1, scale, scores.data() + h * n8);
    }
  }
  for (int64_t h = 0; h < g; ++h) {
    float* sc = scores.data() + h * n8;
    float best = -INFINITY;
    for (int64_t s = 0; s < n; ++s) {
      if (mask[s] <= 0) sc[s] = -INFINITY;
      best = MaxKeepNaN(best, sc[s]);
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
      best = MaxKeepNaN(best, sc[s]);
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

// The cache arguments both kernels take, checked against q's batch b, KV heads kvh and head size
// hd: empty if they fit, else what is wrong.
std::string CheckCache(const ffi::Buffer<ffi::F32>& k, const ffi::Buffer<ffi::F32>& v,
                       const ffi::Buffer<ffi::S32>& layer, const ffi::Buffer<ffi::S32>& rows,
                       const ffi::Buffer<ffi::S32>& mask, int64_t b, int64_t kvh, int64_t hd) {
  auto kd = k.dimensions(), vd = v.dimensions(), md = mask.dimensions();
  if (kd.size() != 5 || vd.size() != 5 || !std::equal(kd.begin(), kd.end(), vd.begin()) ||
      kd[2] != kvh || kd[4] != hd || md.size() != 2 || md[0] != b || md[1] != kd[3] ||
      layer.element_count() != 1 || static_cast<int64_t>(rows.element_count()) != b)
    return "need k/v [L, B', Kh, S, hd], layer [], rows [B] and mask [B, S], as q's B, Kh, hd";
  const int64_t li = layer.typed_data()[0];
  if (li < 0 || li >= kd[0]) return "the layer index is out of range";
  const int32_t* rp = rows.typed_data();
  for (int64_t i = 0; i < b; ++i)
    if (rp[i] < 0 || rp[i] >= kd[1]) return "a row index is out of range";
  return "";
}

ffi::Error CachedAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                           ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> layer,
                           ffi::Buffer<ffi::S32> rows,
                           ffi::Buffer<ffi::S32> last, ffi::Buffer<ffi::S32> mask,
                           ffi::ResultBuffer<ffi::F32> out) {
  auto qd = q.dimensions(), kd = k.dimensions();
  if (qd.size() != 4 || static_cast<int64_t>(last.element_count()) != qd[0])
    return ffi::Error::InvalidArgument("empo2_cached_attention: need q [B, Kh, G, hd], last [B]");
  const std::string bad = CheckCache(k, v, layer, rows, mask, qd[0], qd[1], qd[3]);
  if (!bad.empty()) return ffi::Error::InvalidArgument("empo2_cached_attention: " + bad);
  const int64_t b = qd[0], kvh = qd[1], g = qd[2], hd = qd[3], b_all = kd[1], s = kd[3];
  const int64_t li = layer.typed_data()[0];
  const float* qp = q.typed_data();
  const float* kp = k.typed_data();
  const float* vp = v.typed_data();
  const int32_t* rp = rows.typed_data();
  const int32_t* lp = last.typed_data();
  const int32_t* mp = mask.typed_data();
  float* op = out->typed_data();
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
      ScoreRange<NV>(qv, kh + c0 * hd, 0, len, 1.f, si);
      for (int64_t s = len; s < kChunk; ++s) si[s] = -INFINITY;
      for (int64_t s = 0; s < len; ++s)
        if (c0 + s > last || mask[c0 + s] <= 0) si[s] = -INFINITY;
    }
    for (int64_t i = 0; i < nq; ++i) {
      float* si = sc + i * kChunk;
      float best = m[i];
      for (int64_t s = 0; s < len; ++s) best = MaxKeepNaN(best, si[s]);
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
    const float inv = l[i] == 0.f ? 0.f : 1.f / l[i];  // l = 0: the query saw no slot, zeros
    for (int64_t d = 0; d < hd; ++d) o[d] *= inv;
  }
}

constexpr int64_t kTileTokens = 8;  // prefill query tokens per task (times G query heads)

ffi::Error PrefillAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                            ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> layer,
                            ffi::Buffer<ffi::S32> rows, ffi::Buffer<ffi::S32> slots,
                            ffi::Buffer<ffi::S32> mask, ffi::ResultBuffer<ffi::F32> out) {
  auto qd = q.dimensions(), kd = k.dimensions(), sd = slots.dimensions();
  if (qd.size() != 5 || (qd[4] != 64 && qd[4] != 128) || sd.size() != 2 || sd[0] != qd[0] ||
      sd[1] != qd[1])
    return ffi::Error::InvalidArgument(
        "empo2_prefill_attention: need q [B, T, Kh, G, hd] with hd 64 or 128, slots [B, T]");
  const std::string bad = CheckCache(k, v, layer, rows, mask, qd[0], qd[2], qd[4]);
  if (!bad.empty()) return ffi::Error::InvalidArgument("empo2_prefill_attention: " + bad);
  const int64_t b = qd[0], t = qd[1], kvh = qd[2], g = qd[3], hd = qd[4], b_all = kd[1],
                s = kd[3];
  const int64_t li = layer.typed_data()[0];
  const float* qp = q.typed_data();
  const float* kp = k.typed_data();
  const float* vp = v.typed_data();
  const int32_t* rp = rows.typed_data();
  const int32_t* sp = slots.typed_data();
  const int32_t* mp = mask.typed_data();
  float* op = out->typed_data();
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
