// The linear-scan kernels, written once over the SIMD layer (simd.h) and
// templated on the storage type T (float, double, c64_t, bf16_t, f16_t).
//
//   h[t] = a[t] * h[t-1] + b[t]       (reverse: h[t] = a[t] * h[t+1] + b[t])
//   p[t] = a[t] * p[t-1]              (optional running product of a)
//
// The state is kept in "lanes" (float for f32/bf16/f16/c64, double for f64);
// 16-bit inputs are widened on load and rounded to nearest even on store.
//
// Two kernels, both vectorised across independent sequences (a single
// sequence is a chain of dependent FMAs and cannot be vectorised in time):
//
//  * strided: sequences side by side in memory (the (L, C) layout, scan over
//    axis 0). One vector holds kVW neighbouring channels; a tile of U vectors
//    walks the time steps, so U independent FMA chains hide the FMA latency.
//    Many channels: wide blocks with the state in a stack buffer, so that each
//    step streams one long contiguous run (strided_wide).
//
//  * rows: each sequence contiguous (Mamba's (B, D, L) layout, scan over the
//    last axis). A group of R = kVW rows is read in R x R blocks (R rows x R
//    time steps), transposed in registers so that one vector holds one time
//    step of all R rows, walked step by step, and transposed back for the
//    store. Rows past the end of the group repeat the last row (same values
//    stored twice), time steps past the end are padded with the identity
//    (a = 1, b = 0) so they leave the state unchanged in either direction.
//
// See kernel_api.h for ScanTask (which sequences, where their state lives).
#pragma once

#include <cstdint>

#include "dtypes.h"
#include "kernel_api.h"
#include "simd.h"

namespace jax_selscan {
namespace {
namespace kernels {

using simd::Vec;

// ---- whole-vector load/store of a storage type, in lanes ----------------------
template <class T> struct VecIO;
template <> struct VecIO<float> {
  static Vec<float> load(const float* p) { return simd::load(p); }
  static void store(float* p, Vec<float> v) { simd::store(p, v); }
};
template <> struct VecIO<double> {
  static Vec<double> load(const double* p) { return simd::load(p); }
  static void store(double* p, Vec<double> v) { simd::store(p, v); }
};
template <> struct VecIO<c64_t> {  // interleaved (re, im) lanes
  static Vec<float> load(const c64_t* p) { return simd::load(reinterpret_cast<const float*>(p)); }
  static void store(c64_t* p, Vec<float> v) { simd::store(reinterpret_cast<float*>(p), v); }
};
template <> struct VecIO<bf16_t> {
  static Vec<float> load(const bf16_t* p) { return simd::load_bf16(&p->bits); }
  static void store(bf16_t* p, Vec<float> v) { simd::store_bf16(&p->bits, v); }
};
template <> struct VecIO<f16_t> {
  static Vec<float> load(const f16_t* p) { return simd::load_f16(&p->bits); }
  static void store(f16_t* p, Vec<float> v) { simd::store_f16(&p->bits, v); }
};

inline int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }

template <class T>
struct Scan {
  using Info = ElemInfo<T>;
  using L = typename Info::Lane;
  using V = Vec<L>;
  static constexpr int kPer = Info::kPer;       // lanes per element (2 for complex)
  static constexpr bool kComplex = kPer == 2;
  static constexpr int kLanes = V::kLanes;
  static constexpr int kVW = kLanes / kPer;     // elements per vector
  static constexpr int kR = kVW;                // rows kernel: rows per group = steps per block
  // Strided kernel, narrow channel counts: vectors per register tile, about
  // 128 lanes (enough independent FMA chains to cover latency x throughput;
  // measured 2x faster than 64 lanes in cache). Wide counts use strided_wide.
  // (JSS_STRIDED_U / JSS_WIDE_BYTES: compile-time knobs for tuning experiments.)
#ifdef JSS_STRIDED_U
  static constexpr int kU = JSS_STRIDED_U;
#else
  static constexpr int kU = kLanes >= 16 ? 8 : (kLanes >= 8 ? 16 : 8);
#endif
  static constexpr int kTile = kU * kVW;        // channels per tile

  // ---- arithmetic. `a` is prepared once per load: for complex numbers the
  // real part duplicated into both lanes and the imaginary part duplicated with
  // the sign of the even (real) lane flipped, so that
  //   a*h = are*h + (-aim, aim) * swap(h) = (are*hre - aim*him, are*him + aim*hre).
  struct PA { V x, y; };
  static PA prep(V a) {
    if constexpr (kComplex) return {simd::dup_even(a), simd::neg_even(simd::dup_odd(a))};
    else return {a, a};
  }
  static V advance(const PA& a, V h, V b) {  // a*h + b
    if constexpr (kComplex) return simd::fma(a.x, h, simd::fma(a.y, simd::swap_pairs(h), b));
    else return simd::fma(a.x, h, b);
  }
  static V times(const PA& a, V p) {  // a*p
    if constexpr (kComplex) return simd::fma(a.x, p, simd::mul(a.y, simd::swap_pairs(p)));
    else return simd::mul(a.x, p);
  }

  static L one_lane(int i) { return (kComplex && (i & 1)) ? L(0) : L(1); }

  // n < kVW elements through a stack buffer; the rest is the identity (a = 1, b = 0).
  static V load_part(const T* p, int64_t n, bool is_a) {
    alignas(64) L buf[kLanes];
    Info::to_lanes(p, n, buf);
    for (int i = int(n) * kPer; i < kLanes; ++i) buf[i] = is_a ? one_lane(i) : L(0);
    return simd::load(buf);
  }
  static void store_part(T* p, int64_t n, V v) {
    alignas(64) L buf[kLanes];
    simd::store(buf, v);
    Info::from_lanes(buf, n, p);
  }

  // ---- state of sequences i0 .. i0+cnt-1 (cnt <= kVW) as one vector -----------
  // (the loops clamp cnt to kVW: callers never pass more, and the bound lets GCC see that
  // the stack buffers are not overrun, where it warned at -O3)
  static void init_state(const ScanTask& t, int64_t i0, int64_t cnt, V* h, V* p) {
    alignas(64) L hb[kLanes], pb[kLanes];
    for (int i = 0; i < kLanes; ++i) { hb[i] = L(0); pb[i] = one_lane(i); }
    for (int64_t e = 0; e < cnt && e < kVW; ++e) {
      const int64_t slot = t.slot0 + (i0 + e) * t.slot_stride;
      if (t.mode == Mode::kScan && t.h0 != nullptr) {
        Info::to_lanes(static_cast<const T*>(t.h0) + slot, 1, hb + e * kPer);
      } else if (t.mode == Mode::kScanFromState) {
        for (int k = 0; k < kPer; ++k) {
          hb[e * kPer + k] = static_cast<const L*>(t.st_h)[slot * kPer + k];
          pb[e * kPer + k] = static_cast<const L*>(t.st_p)[slot * kPer + k];
        }
      }
    }
    *h = simd::load(hb);
    *p = simd::load(pb);
  }
  static void save_state(const ScanTask& t, int64_t i0, int64_t cnt, V h, V p) {
    if (t.mode != Mode::kReduce) return;
    alignas(64) L hb[kLanes], pb[kLanes];
    simd::store(hb, h);
    simd::store(pb, p);
    for (int64_t e = 0; e < cnt && e < kVW; ++e) {
      const int64_t slot = t.slot0 + (i0 + e) * t.slot_stride;
      for (int k = 0; k < kPer; ++k) {
        static_cast<L*>(t.st_h)[slot * kPer + k] = hb[e * kPer + k];
        static_cast<L*>(t.st_p)[slot * kPer + k] = pb[e * kPer + k];
      }
    }
  }

  // ================================================================== strided
  // Channels j0 .. j0+nch-1 (nch == NV*kVW, or nch < kVW with kPartial).
  template <int NV, bool kPartial, bool kOut, bool kProd>
  static void strided_tile(const ScanTask& t, int64_t j0, int64_t nch) {
    const T* a = static_cast<const T*>(t.a);
    const T* b = static_cast<const T*>(t.b);
    T* h = static_cast<T*>(t.h);
    T* p = static_cast<T*>(t.p);
    V hs[NV], ps[NV];
    JSS_UNROLL
    for (int u = 0; u < NV; ++u)
      init_state(t, j0 + u * kVW, kPartial ? nch : kVW, &hs[u], &ps[u]);
    const int64_t step = t.reverse ? -t.ld : t.ld;
    int64_t off = (t.reverse ? (t.n - 1) * t.ld : 0) + j0;
    for (int64_t s = 0; s < t.n; ++s, off += step) {
      JSS_UNROLL
      for (int u = 0; u < NV; ++u) {
        const int64_t o = off + u * kVW;
        V av, bv;
        if constexpr (kPartial) {
          av = load_part(a + o, nch, true);
          bv = load_part(b + o, nch, false);
        } else {
          av = VecIO<T>::load(a + o);
          bv = VecIO<T>::load(b + o);
        }
        const PA pa = prep(av);
        hs[u] = advance(pa, hs[u], bv);
        if constexpr (kProd) ps[u] = times(pa, ps[u]);
        if constexpr (kOut) {
          if constexpr (kPartial) store_part(h + o, nch, hs[u]);
          else VecIO<T>::store(h + o, hs[u]);
          if constexpr (kProd) {
            if constexpr (kPartial) store_part(p + o, nch, ps[u]);
            else VecIO<T>::store(p + o, ps[u]);
          }
        }
      }
    }
    JSS_UNROLL
    for (int u = 0; u < NV; ++u)
      save_state(t, j0 + u * kVW, kPartial ? nch : kVW, hs[u], ps[u]);
  }

  // Wide blocks of up to kWide channels: the state lives in a stack buffer
  // (L1/L2) instead of registers, so each step streams one contiguous run of
  // up to 16 KiB per array (what the hardware prefetchers and DRAM pages like
  // best) rather than a narrow tile at a large stride: 1.5x faster at
  // (L, C) = (4096, 4096). nch is a multiple of kVW.
#ifndef JSS_WIDE_BYTES
#define JSS_WIDE_BYTES 16384
#endif
  static constexpr int kWideLanes = JSS_WIDE_BYTES / int(sizeof(L));
  static constexpr int64_t kWide = kWideLanes / kPer;
  template <bool kOut, bool kProd>
  static void strided_wide(const ScanTask& t, int64_t j0, int64_t nch) {
    const T* a = static_cast<const T*>(t.a);
    const T* b = static_cast<const T*>(t.b);
    T* h = static_cast<T*>(t.h);
    T* p = static_cast<T*>(t.p);
    alignas(64) L hbuf[kWideLanes];
    alignas(64) L pbuf[kProd ? kWideLanes : kLanes];
    const int64_t nv = nch / kVW;
    for (int64_t v = 0; v < nv; ++v) {
      V hv, pv;
      init_state(t, j0 + v * kVW, kVW, &hv, &pv);
      simd::store(hbuf + v * kLanes, hv);
      if constexpr (kProd) simd::store(pbuf + v * kLanes, pv);
    }
    const int64_t step = t.reverse ? -t.ld : t.ld;
    int64_t off = (t.reverse ? (t.n - 1) * t.ld : 0) + j0;
    for (int64_t s = 0; s < t.n; ++s, off += step) {
      for (int64_t v = 0; v < nv; ++v) {
        const int64_t o = off + v * kVW;
        const PA pa = prep(VecIO<T>::load(a + o));
        const V hv = advance(pa, simd::load(hbuf + v * kLanes), VecIO<T>::load(b + o));
        simd::store(hbuf + v * kLanes, hv);
        if constexpr (kOut) VecIO<T>::store(h + o, hv);
        if constexpr (kProd) {
          const V pv = times(pa, simd::load(pbuf + v * kLanes));
          simd::store(pbuf + v * kLanes, pv);
          if constexpr (kOut) VecIO<T>::store(p + o, pv);
        }
      }
    }
    for (int64_t v = 0; v < nv; ++v) {
      save_state(t, j0 + v * kVW, kVW, simd::load(hbuf + v * kLanes),
                 kProd ? simd::load(pbuf + v * kLanes) : simd::broadcast(L(1)));
    }
  }

  template <bool kOut, bool kProd>
  static void strided_impl(const ScanTask& t) {
    int64_t j = 0;
    const int64_t c = t.count;
    if (c >= kWide / 8) {  // wide blocks (>= 2 KiB), then the last < kVW channels below
      for (; j + kVW <= c; j += kWide) {
        const int64_t w = min64(kWide, (c - j) / kVW * kVW);
        strided_wide<kOut, kProd>(t, j, w);
        if (w < kWide) { j += w; break; }
      }
    }
    for (; j + kTile <= c; j += kTile) strided_tile<kU, false, kOut, kProd>(t, j, kTile);
    for (; j + kVW <= c; j += kVW) strided_tile<1, false, kOut, kProd>(t, j, kVW);
    if (j < c) strided_tile<1, true, kOut, kProd>(t, j, c - j);
  }

  // Channels 0 .. count-1 at element offsets j (seq_stride must be 1), step t at t * ld.
  static void strided(const ScanTask& t) {
    if (t.count <= 0) return;  // n == 0 still runs (kReduce then writes the identity)
    if (t.mode == Mode::kReduce) strided_impl<false, true>(t);
    else if (t.p != nullptr) strided_impl<true, true>(t);
    else strided_impl<true, false>(t);
  }

  // ===================================================================== rows
  JSS_INLINE static void transpose_block(V* v) {
    if constexpr (kComplex) {  // one complex number = one 64-bit unit
      Vec<double> d[kR];
      JSS_UNROLL
      for (int i = 0; i < kR; ++i) d[i] = simd::as_double(v[i]);
      simd::transpose(d);
      JSS_UNROLL
      for (int i = 0; i < kR; ++i) v[i] = simd::as_float(d[i]);
    } else {
      simd::transpose(v);
    }
  }

  // After the transpose va[k], vb[k] hold time step k of all rows.
  template <bool kProd>
  JSS_INLINE static void walk(const V* va, const V* vb, V* vh, V* vp, V& h, V& p, bool reverse) {
    auto one_step = [&](int k) {
      const PA pa = prep(va[k]);
      h = advance(pa, h, vb[k]);
      vh[k] = h;
      if constexpr (kProd) {
        p = times(pa, p);
        vp[k] = p;
      }
    };
    if (reverse) {
      JSS_UNROLL
      for (int k = kR - 1; k >= 0; --k) one_step(k);
    } else {
      JSS_UNROLL
      for (int k = 0; k < kR; ++k) one_step(k);
    }
  }

  // Where the rows of a group are and how far they are staggered.
  struct RowGroup {
    const T* a;
    const T* b;
    T* h;
    T* p;
    int64_t row[kR];    // element offset of each row (rows past cnt repeat the last)
    int64_t cnt;        // real rows
    int64_t n, nfull, m;  // steps, full blocks, steps in the partial block
    int64_t lag[kR];    // row r works on block j - lag[r] at virtual block j
    bool reverse;
  };

  // Virtual block j: row r does its walk-order block b = j - lag[r]: a full
  // block (b < nfull), the partial block (b == nfull), or the identity (no
  // memory access) when b is outside the row. kAllFull: every row has a full
  // block at j (the steady state), no per-row checks.
  template <bool kOut, bool kProd, bool kAllFull>
  JSS_INLINE static void rows_block(const RowGroup& g, int64_t j, V& hv, V& pv, V one) {
    V va[kR], vb[kR], vh[kR], vp[kR];
    int64_t t0[kR];
    int kind[kR];  // 0 full, 1 partial, 2 identity
    JSS_UNROLL
    for (int r = 0; r < kR; ++r) {
      const int64_t blk = j - g.lag[r];
      if (kAllFull || (blk >= 0 && blk < g.nfull)) {
        kind[r] = 0;
        t0[r] = g.reverse ? g.n - (blk + 1) * kR : blk * kR;
        va[r] = VecIO<T>::load(g.a + g.row[r] + t0[r]);
        vb[r] = VecIO<T>::load(g.b + g.row[r] + t0[r]);
      } else if (blk == g.nfull && g.m > 0) {  // [n-m, n) forward, [0, m) reverse
        kind[r] = 1;
        t0[r] = g.reverse ? 0 : g.n - g.m;
        va[r] = load_part(g.a + g.row[r] + t0[r], g.m, true);
        vb[r] = load_part(g.b + g.row[r] + t0[r], g.m, false);
      } else {
        kind[r] = 2;
        t0[r] = 0;
        va[r] = one;
        vb[r] = simd::broadcast(L(0));
      }
    }
    transpose_block(va);
    transpose_block(vb);
    walk<kProd>(va, vb, vh, vp, hv, pv, g.reverse);  // identity steps leave the state as is
    if constexpr (kOut) {
      transpose_block(vh);
      if constexpr (kProd) transpose_block(vp);
      JSS_UNROLL
      for (int r = 0; r < kR; ++r) {
        if (r >= g.cnt) break;
        if (kAllFull || kind[r] == 0) {
          VecIO<T>::store(g.h + g.row[r] + t0[r], vh[r]);
          if constexpr (kProd) VecIO<T>::store(g.p + g.row[r] + t0[r], vp[r]);
        } else if (kind[r] == 1) {
          store_part(g.h + g.row[r] + t0[r], g.m, vh[r]);
          if constexpr (kProd) store_part(g.p + g.row[r] + t0[r], g.m, vp[r]);
        }
      }
    }
  }

  // Rows whose stride is (nearly) a multiple of 4 KiB land in the same L1 set
  // at the same time step: kR rows x 3 arrays overflow the set's ways and
  // L = 4096 runs ~2x slower than L = 4112. Staggering rows by whole cache
  // lines spreads them over sets, at the cost of a ramp of identity blocks.
  static int64_t stagger_lines(const ScanTask& t, int64_t nfull) {
    constexpr int64_t kBlockBytes = int64_t(kVW) * int64_t(sizeof(T));
    constexpr int64_t kUnit = kBlockBytes >= 64 ? 1 : 64 / kBlockBytes;  // blocks per line
    constexpr int64_t kSpread = kR < 8 ? kR : 8;                         // distinct lags
    int64_t d = (t.seq_stride * int64_t(sizeof(T))) % 4096;
    if (d < 0) d += 4096;
    d = d < 4096 - d ? d : 4096 - d;
    const int64_t ramp = (kSpread - 1) * kUnit;
    return (d < 32 && nfull >= 4 * ramp) ? kUnit : 0;
  }

  template <bool kOut, bool kProd>
  static void rows_group(const ScanTask& t, int64_t i0, int64_t cnt) {
    RowGroup g;
    g.a = static_cast<const T*>(t.a);
    g.b = static_cast<const T*>(t.b);
    g.h = static_cast<T*>(t.h);
    g.p = static_cast<T*>(t.p);
    g.cnt = cnt;
    g.n = t.n;
    g.nfull = t.n / kR;
    g.m = t.n % kR;
    g.reverse = t.reverse;
    const int64_t unit = stagger_lines(t, g.nfull);
    int64_t max_lag = 0;
    for (int r = 0; r < kR; ++r) {
      g.row[r] = (i0 + min64(r, cnt - 1)) * t.seq_stride;
      g.lag[r] = unit * (r % 8);
      max_lag = g.lag[r] > max_lag ? g.lag[r] : max_lag;
    }
    alignas(64) L ones[kLanes];
    for (int i = 0; i < kLanes; ++i) ones[i] = one_lane(i);
    const V one = simd::load(ones);
    V hv, pv;
    init_state(t, i0, cnt, &hv, &pv);
    const int64_t nvirt = g.nfull + (g.m > 0 ? 1 : 0) + max_lag;
    int64_t j = 0;
    for (; j < max_lag && j < nvirt; ++j) rows_block<kOut, kProd, false>(g, j, hv, pv, one);
    for (; j < g.nfull; ++j) rows_block<kOut, kProd, true>(g, j, hv, pv, one);
    for (; j < nvirt; ++j) rows_block<kOut, kProd, false>(g, j, hv, pv, one);
    save_state(t, i0, cnt, hv, pv);
  }

  template <bool kOut, bool kProd>
  static void rows_impl(const ScanTask& t) {
    for (int64_t i = 0; i < t.count; i += kR) rows_group<kOut, kProd>(t, i, min64(kR, t.count - i));
  }

  // Rows 0 .. count-1 at element offsets i * seq_stride (ld must be 1).
  static void rows(const ScanTask& t) {
    if (t.count <= 0) return;  // n == 0 still runs (kReduce then writes the identity)
    if (t.mode == Mode::kReduce) rows_impl<false, true>(t);
    else if (t.p != nullptr) rows_impl<true, true>(t);
    else rows_impl<true, false>(t);
  }
};

}  // namespace kernels
}  // namespace
}  // namespace jax_selscan
