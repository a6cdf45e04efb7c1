// Forward selective scan, "staged" layout (round 3; docs/PERFORMANCE_SELECTIVE_SCAN_CUDA.md §5).
//
// A block owns kSRows rows (channels d0 .. d0+31 of one batch element, all in one B group
// and one C group) and walks them through time in kST-step tiles:
//   1. stage: the block's threads turn the tile's elements, loaded one tile ahead into
//      registers with coalesced vector loads, into per-element float4s in shared memory,
//      X = (dt, dt*u, add, gate), and the tile's B and C into (B, C) pairs per step and
//      state. softplus, silu(z), D*u and the bidirectional add are computed here, once per
//      element.
//   2. walk: P lanes per row, NS states per lane in registers; per step one float4 of X,
//      NS (B, C) pairs, NS x (ex2, FMAs), an xor-sum of y over the P lanes; one lane writes
//      (y + add) * gate to Y in shared memory.
//   3. write: coalesced vector stores of Y.
// Two barriers per tile; the shared buffers are double-buffered so staging tile k+1 never
// waits for the write of tile k. Steps past the sequence are identities (dt = 0).
#pragma once

#include <cmath>
#include <cstdlib>
#include <type_traits>

#include "selective_scan_kernels.cuh"

namespace jss {
namespace ssk {

constexpr int kSRows = 32;    // rows per block
constexpr int kST = 32;       // steps per tile (multiple of kCk and of 4)
constexpr int kSX = kST + 1;  // row stride of X and Y: rows of a warp fall in distinct banks
constexpr int kSVec = kSRows * kST / 4;  // 4-element vectors per array and tile

// Four consecutive elements as loaded (float4, or 4 packed 16-bit values): the prefetched tile
// stays in this form until it is staged, so no conversion waits on a load in flight.
template <class T> struct Raw4 {
  uint2 r;
  __device__ __forceinline__ void load4(const T* p, int64_t i) { r = __ldg(reinterpret_cast<const uint2*>(p + i)); }
  __device__ __forceinline__ void load1(const T* p, int64_t i, int e) {
    const unsigned bits = __ldg(reinterpret_cast<const unsigned short*>(p + i));
    unsigned& w = (e < 2) ? r.x : r.y;
    w = (e & 1) ? ((w & 0xffffu) | (bits << 16)) : ((w & 0xffff0000u) | bits);
  }
  __device__ __forceinline__ void zero() { r = make_uint2(0u, 0u); }
  __device__ __forceinline__ void get(float v[4]) const {
    using C = Cvt16<T>;
    const float2 a = C::up2(*reinterpret_cast<const typename C::H2*>(&r.x));
    const float2 b = C::up2(*reinterpret_cast<const typename C::H2*>(&r.y));
    v[0] = a.x; v[1] = a.y; v[2] = b.x; v[3] = b.y;
  }
};
template <> struct Raw4<float> {
  float4 r;
  __device__ __forceinline__ void load4(const float* p, int64_t i) { r = __ldg(reinterpret_cast<const float4*>(p + i)); }
  __device__ __forceinline__ void load1(const float* p, int64_t i, int e) {
    const float x = __ldg(p + i);
    if (e == 0) r.x = x; else if (e == 1) r.y = x; else if (e == 2) r.z = x; else r.w = x;
  }
  __device__ __forceinline__ void zero() { r = make_float4(0.f, 0.f, 0.f, 0.f); }
  __device__ __forceinline__ void get(float v[4]) const { v[0] = r.x; v[1] = r.y; v[2] = r.z; v[3] = r.w; }
};

// Four elements of src starting at time t, as loaded: 16-byte vectors when L % 4 == 0 (a
// vector is then wholly inside [0, L) or wholly outside), else element by element; times
// outside [0, L) read as 0.
template <class T>
__device__ __forceinline__ void load_raw4(const T* src, int64_t t, int64_t L, bool vec, Raw4<T>& v) {
  v.zero();
  if (vec) {
    if (t >= 0 && t < L) v.load4(src, t);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (t + e >= 0 && t + e < L) v.load1(src, t + e, e);
  }
}

// Where tile k of a walk lies: position i is time t0(k) + i (forward: tiles from t = 0;
// reverse: from the end, the last tile reaching below 0), and shared memory holds position i
// in walking-order slot(i), so the walk's addresses are constants.
struct TileMap {
  int64_t L;
  bool rev;
  __device__ __forceinline__ int64_t t0(int64_t k) const { return rev ? L - (k + 1) * kST : k * kST; }
  __device__ __forceinline__ int slot(int i) const { return rev ? kST - 1 - i : i; }
};

constexpr int kG = 8;         // steps whose y the lanes of a row reduce together

// Sum of v[g] over the P lanes of a row (xor partners), reduce-scattered: each halving level
// keeps half of the values still held (the upper half on the lane whose bit O is set) and
// adds the partner's copy of that half, kG - 1 shuffles in all instead of kG * log2(P). At
// the end a lane holds kG / P sums (one when P >= kG; then lanes past kG hold copies) for the
// steps base .. base + kG / P - 1 of the group. LS: the lane distance between lanes q and
// q + 1 of a row (1 when a row's lanes are consecutive; the forward's rows-fastest layout:
// 32 / P).
template <int O, int M, int LS = 1>
__device__ __forceinline__ void reduce_scatter(float (&v)[kG], int q, int& base) {
  if constexpr (O >= 1) {
    if constexpr (M > 1) {
      constexpr int H = M / 2;
      const bool up = (q & O) != 0;
#pragma unroll
      for (int i = 0; i < H; ++i) {
        const float keep = up ? v[i + H] : v[i];
        const float send = up ? v[i] : v[i + H];
        v[i] = keep + __shfl_xor_sync(kFull, send, O * LS);
      }
      base += up ? H : 0;
      reduce_scatter<O / 2, H, LS>(v, q, base);
    } else {
      v[0] += __shfl_xor_sync(kFull, v[0], O * LS);
      reduce_scatter<O / 2, 1, LS>(v, q, base);
    }
  }
}

// A lane's share of a group's y sums after the reduce-scatter: kG / P sums (at least one) of
// the steps base, base + 1, ...
template <int P>
struct HeldY {
  static constexpr int kN = kG / P > 1 ? kG / P : 1;
  float v[kN];
  int base;
  __device__ __forceinline__ void store(float* Y) const {
#pragma unroll
    for (int i = 0; i < kN; ++i) Y[base + i] = v[i];
  }
};
template <int P, int LS = 1>
__device__ __forceinline__ HeldY<P> reduce_hold(float (&v)[kG], int q) {
  HeldY<P> h;
  h.base = 0;
  reduce_scatter<P / 2, kG, LS>(v, q, h.base);
#pragma unroll
  for (int i = 0; i < HeldY<P>::kN; ++i) h.v[i] = v[i];
  return h;
}
// Stores the group's y sums of one row: Y[j] for the kG steps of the group at Y.
template <int P, int LS = 1>
__device__ __forceinline__ void reduce_store(float (&v)[kG], int q, float* Y) {
  reduce_hold<P, LS>(v, q).store(Y);
}

// The forward's staging and write-out threads, and its shared-memory layouts, chosen against
// bank conflicts (PERFORMANCE_SELECTIVE_SCAN_CUDA 7.2). Vector v (4 steps of one row) of a
// tile: warp v / 32 takes rows 4 (v / 32) .. + 3, whole (still 4 full 128-byte lines per warp
// load), lane l the row 4 (v / 32) + l % 4 and the steps 4 (l / 4) ..; so a quarter warp
// (8 lanes) holds 4 rows x 2 vectors and its float4 accesses to X (row stride kSX = 33) fall
// in 8 distinct 16-byte bank groups. y: row stride kYS plus one float per 8 steps, so that
// 4 rows x 8 consecutive steps (the reduce-scatter's stores) and 4 rows x steps 4k + e (the
// write-out's loads) each fall in 32 distinct banks.
__device__ __forceinline__ int vec_row(int v) { return 4 * (v >> 5) + (v & 3); }
__device__ __forceinline__ int vec_step(int v) { return ((v & 31) >> 2) * 4; }
static_assert(kST == 32, "vec_row / vec_step: 8 vectors per row");
// (B, C) vector w of a tile (4 steps of one of NP states), forward and backward alike: state
// fastest, so the staging's float2 stores of a half warp hit 32 distinct banks.
__device__ __forceinline__ int bc_state(int w, int NP) { return w % NP; }
__device__ __forceinline__ int bc_step(int w, int NP) { return (w / NP) * 4; }
constexpr int kYS = 40;
__host__ __device__ constexpr int yidx(int r, int i) { return r * kYS + i + (i >> 3); }
static_assert(yidx(kSRows - 1, kST - 1) < kSRows * kYS, "y fits its rows");

// Shared-memory floats of one buffer for NP (padded) states; the kernel's dynamic shared
// memory: two buffers and the rows' delta bias and output multiplier.
__host__ __device__ constexpr int staged_buf_floats(int NP) {
  return kSRows * kSX * 4 + kST * NP * 2 + kSRows * kYS;
}
__host__ __device__ constexpr size_t staged_smem_bytes(int NP) {
  return sizeof(float) * (2 * staged_buf_floats(NP) + 2 * kSRows);
}

// Whether the staged kernel takes this problem: varying B and C whose groups never split a
// block of rows (Mamba's case), N <= 128.
inline bool staged_ok(const SsProblem& p) {
  static_assert(kSRows == 32, "ss_staged_ok assumes 32-row blocks");
  return ss_staged_ok(p);
}

// Blocks per SM the register budget is set for (4 x 128 or 3 x 256 threads; fewer for 8 states).
__host__ __device__ constexpr int staged_min_blocks(int P, int NS) {
  return P >= 16 ? 1 : (NS >= 8 ? 2 : (P <= 4 ? 4 : 3));
}

// YB: what the walk does with the y buffer of "bidirectional", in kernels of their own so that
// the other modes carry none of that code (with it, ptxas spilled more in the float32 kernels,
// and the forward ran ~6% slower in float32, 2-3% in bfloat16; notes 18.2):
//   kYbNone  - kFinal, the checkpoint sweep, phase A's chunk ends;
//   kYbWrite - kRawY, the first direction: stores y there;
//   kYbAdd   - kAddY, the second: prefetches it with the tile's other inputs and folds it into
//              the add term when staging. Loaded at the write-out instead, each tile's loads
//              stalled its block on global memory after the walk (5-7% over the two
//              directions' kernels).
enum YBuf { kYbNone = 0, kYbWrite = 1, kYbAdd = 2 };

// c ? a : b as one selp, both operands computed: ptxas keeps no branch for it (a ?: may become one).
__device__ __forceinline__ float select_f32(bool c, float a, float b) {
  float r;
  asm("{\n .reg .pred p;\n setp.ne.u32 p, %3, 0;\n selp.f32 %0, %1, %2, p;\n}" : "=f"(r) : "f"(a), "f"(b), "r"(static_cast<unsigned>(c)));
  return r;
}

// Whether the walk of tile k stages tile k + 1 (notes 28); off: staging, barrier, walk.
#ifndef JSS_SS_FWD_OVERLAP
#define JSS_SS_FWD_OVERLAP 0
#endif
constexpr int kFwdOverlapMode = JSS_SS_FWD_OVERLAP;  // 2: the pieces without a branch, so ptxas interleaves them
constexpr bool kFwdOverlap = JSS_SS_FWD_OVERLAP != 0;

// REV: the walk's direction (a.rev), a template parameter so that the tile's shared-memory slots
// (TileMap::slot) are compile-time offsets: with it a runtime flag, each staged and each written
// element recomputed its address with a select (notes 21.5).
template <class T, int P, int NS, int YB, bool REV>
__global__ void __launch_bounds__(kSRows * P, staged_min_blocks(P, NS)) fwd_staged_kernel(FwdArgs a) {
  constexpr int NT = kSRows * P;
  constexpr int NP = P * NS;
  constexpr int VPT = (kSVec + NT - 1) / NT;            // u/delta/z vectors per thread
  constexpr int BCV = NP * kST / 4;                     // B (or C) vectors per tile
  constexpr int BPT = (BCV + NT - 1) / NT;
  constexpr int BUF = staged_buf_floats(NP);
  static_assert(NS % 2 == 0, "the walk reads (B, C) of two states at a time");
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);

  const SsProblem& p = a.p;
  const int64_t L = p.L, N = p.N, Dm = p.dim;
  const int64_t nrb = (Dm + kSRows - 1) / kSRows;
  const int64_t b = blockIdx.x / nrb, d0 = (blockIdx.x % nrb) * kSRows;
  const int tid = threadIdx.x;
  constexpr bool rev = REV;
  const bool vec = (L & 3) == 0;
  const int mode = a.mode;
  // Phase A (kChunkEnd) is launched as fwd_staged_phase_a_kernel now; its branches here are
  // unreachable but kept: removing them moved ptxas's register allocation of the y kernels
  // (bf16 <8, 2> gained 8 bytes of spills, float32 <8, 2> 24), not measured (notes 23).
  const bool outputs = mode != kCheckpoint && mode != kChunkEnd;  // y, out, z and C
  const T* u = static_cast<const T*>(p.u);
  const T* de = static_cast<const T*>(p.delta);
  const T* z = outputs ? static_cast<const T*>(p.z) : nullptr;
  const T* Bp = static_cast<const T*>(p.B) + (b * p.groups_b + d0 / (Dm / p.groups_b)) * N * L;
  const T* Cp = static_cast<const T*>(p.C) + (b * p.groups_c + d0 / (Dm / p.groups_c)) * N * L;

  // The walking lane: row r of the block, states q*NS .. q*NS+NS-1. Rows fastest within a
  // warp (lane = q * RW + row in warp): the lanes reading one (B, C) address are then
  // consecutive, which halves the wavefronts of that 16-byte load (4 → 2, measured with
  // cuda/tools/lds_wavefronts.cu; PERFORMANCE_SELECTIVE_SCAN_CUDA 12.1); X's 8-byte load goes
  // 1 → 2. The y sums pair the same lanes q ^ O as before (shuffle distance O * RW), so the
  // same bits.
  constexpr int RW = 32 / P;  // rows per warp
  static_assert(P <= 32 && 32 % P == 0, "a row's lanes within one warp");
  const int r = (tid / 32) * RW + (tid % 32) % RW, q = (tid % 32) / RW;
  const bool rlive = d0 + r < Dm;
  const int64_t d = rlive ? d0 + r : Dm - 1;
  const int64_t row = b * Dm + d;
  // This block's L chunk: tiles [kb, ke) in walking order (all of them without a split).
  const int64_t c = blockIdx.y, nch = a.nch > 1 ? a.nch : 1;
  const int64_t ntiles = (L + kST - 1) / kST;
  const int64_t kb = nch > 1 ? c * (a.chunk_steps / kST) : 0;
  const int64_t ke = nch > 1 && kb + a.chunk_steps / kST < ntiles ? kb + a.chunk_steps / kST : ntiles;
  float a2[NS], h[NS], S = 0.f;
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    const int64_t n = q * NS + s;
    a2[s] = n < N ? p.A[d * N + n] * kLog2e : 0.f;
    h[s] = chunk_entry(a, row, n, n < N, c);
  }
  // The entering states come from global loads. Unless they are used here, ptxas waits for
  // those loads' scoreboard at the loop's first read of h, on every tile, and the next tile's
  // prefetch shares that scoreboard: each walk then began by waiting for the whole prefetch
  // (notes 21). One add of -0 each settles them here; it changes no value, NaN and signed
  // zeros included.
#pragma unroll
  for (int s = 0; s < NS; ++s) asm volatile("add.f32 %0, %0, 0f80000000;" : "+f"(h[s]));

  const TileMap tm{L, rev};
  auto load_vec = [&](const T* src, int64_t t, Raw4<T>& v) { load_raw4(src, t, L, vec, v); };

  // Where this thread's staging vectors start, fixed over the tiles: in u / delta / z, the
  // row's base plus the vector's step offset (-1: a row past D); in B / C, the state's row plus
  // the step offset (-1: a padded state). A tile then adds only its first time.
  int64_t voff[VPT], boff[BPT];
#pragma unroll
  for (int m = 0; m < VPT; ++m) {
    const int v = tid + m * NT;
    voff[m] = v < kSVec && d0 + vec_row(v) < Dm ? (b * Dm + d0 + vec_row(v)) * L + vec_step(v) : -1;
  }
#pragma unroll
  for (int m = 0; m < BPT; ++m) {
    const int w = tid + m * NT;
    boff[m] = w < BCV && bc_state(w, NP) < N ? bc_state(w, NP) * L + bc_step(w, NP) : -1;
  }
  // Whether tile k lies wholly inside [0, L) with 16-byte vectors (uniform over the block):
  // then no vector needs a bounds check.
  auto tile_inside = [&](int64_t t0) { return vec && t0 >= 0 && t0 + kST <= L; };

  // Registers holding the next tile.
  Raw4<T> ru[VPT], rd[VPT], rz[VPT], rb[BPT], rc[BPT];
  constexpr bool AddY = YB == kYbAdd;
  Raw4<float> ry[AddY ? VPT : 1];
  auto load_tile = [&](int64_t k) {
    const int64_t t0 = tm.t0(k);
    if (tile_inside(t0)) {
#pragma unroll
      for (int m = 0; m < VPT; ++m) {
        ru[m].zero(); rd[m].zero(); rz[m].zero();
        if constexpr (AddY) ry[m].zero();  // (a dead row's are masked in stage_tile anyway)
        if (voff[m] < 0) continue;
        const int64_t o = voff[m] + t0;
        ru[m].load4(u, o);
        rd[m].load4(de, o);
        if (z) rz[m].load4(z, o);
        if constexpr (AddY) ry[m].load4(a.ybuf, o);
      }
#pragma unroll
      for (int m = 0; m < BPT; ++m) {
        rb[m].zero(); rc[m].zero();
        if (boff[m] < 0) continue;
        rb[m].load4(Bp, boff[m] + t0);
        if (outputs) rc[m].load4(Cp, boff[m] + t0);
      }
      return;
    }
#pragma unroll
    for (int m = 0; m < VPT; ++m) {
      const int i0 = vec_step(tid + m * NT);
      const bool ok = voff[m] >= 0;
      const int64_t base = ok ? voff[m] - i0 : 0;
      const int64_t t = ok ? t0 + i0 : -kST;  // a dead vector reads nothing
      load_vec(u + base, t, ru[m]);
      load_vec(de + base, t, rd[m]);
      if (z) load_vec(z + base, t, rz[m]);
      if constexpr (AddY) load_raw4<float>(a.ybuf + base, t, L, vec, ry[m]);
    }
#pragma unroll
    for (int m = 0; m < BPT; ++m) {
      const int i0 = bc_step(tid + m * NT, NP);
      const bool ok = boff[m] >= 0;
      const int64_t t = ok ? t0 + i0 : -kST;
      const int64_t base = ok ? boff[m] - i0 : 0;
      load_vec(Bp + base, t, rb[m]);
      if (outputs) load_vec(Cp + base, t, rc[m]);
    }
  };
  auto slot = [&](int i) { return tm.slot(i); };
  // The block's rows' delta bias and output multiplier (add = addmul * u), read once into
  // shared memory rather than from global memory per tile (each such read stalled the
  // staging; registers for them made the 80-register kernels spill).
  float* RB = smem + 2 * BUF;
  float* RM = RB + kSRows;
  if (tid < kSRows) {
    const int64_t dd = d0 + tid < Dm ? d0 + tid : 0;
    const float Dd = p.Dskip ? p.Dskip[dd] : 0.f;
    RB[tid] = p.delta_bias ? p.delta_bias[dd] : 0.f;
    RM[tid] = mode == kFinal ? Dd : (mode == kAddY ? 2.f * Dd : 0.f);
  }
  __syncthreads();
  // Staging in pieces: piece i < VPT is the u / delta / z vector i of the thread, the rest its
  // (B, C) vectors. With kFwdOverlap the walk of tile k stages tile k + 1 piece by piece between its
  // groups, so that the staging's independent arithmetic can fill the walk's stalls; a padded
  // step is then masked through (dt, dt u) alone (its u, z and y registers read as 0, so add and
  // silu(z) are 0 already), with selects, and in mode 2 the pieces keep no branch at all.
  constexpr int NPIECE = VPT + BPT;
  const bool gated = z && mode != kRawY;  // gate = silu(z) unless kRawY
  auto stage_piece = [&](int64_t k, float* buf, int i) {
    const int64_t t0 = tm.t0(k);
    float4* X = reinterpret_cast<float4*>(buf);
    float2* BC = reinterpret_cast<float2*>(buf + kSRows * kSX * 4);
    if (i < VPT) {
      const int m = i;
      const int v = tid + m * NT;
      if ((kFwdOverlapMode != 2 || VPT * NT != kSVec) && v >= kSVec) return;  // mode 2: no branch here
      const int rr = vec_row(v), i0 = vec_step(v);
      const bool ok = d0 + rr < Dm;
      const int64_t t = t0 + i0;
      const bool full = ok && t >= 0 && t + 3 < L;  // always, or never, when L % 4 == 0
      const float bias = RB[rr], addmul = RM[rr];
      float uv[4], dv[4], zv[4] = {0.f, 0.f, 0.f, 0.f}, yv[4] = {0.f, 0.f, 0.f, 0.f};
      ru[m].get(uv);
      rd[m].get(dv);
      if (gated) rz[m].get(zv);
      if constexpr (AddY) ry[m].get(yv);
      auto elem = [&](int e) {
        const float xb = dv[e] + bias;
        float dt, g;
        if constexpr (kFwdOverlap) {  // both sides computed and selected: no branch in the walk
          dt = select_f32(p.softplus, softplus_fast(xb), xb);
          g = select_f32(gated, silu_fast(zv[e]), 1.f);
        } else {
          dt = p.softplus ? softplus_fast(xb) : xb;
          g = gated ? silu_fast(zv[e]) : 1.f;
        }
        return make_float4(dt, dt * uv[e], AddY ? fmaf(addmul, uv[e], yv[e]) : addmul * uv[e], g);
      };
      float4* Xr = X + rr * kSX;
      if constexpr (kFwdOverlap) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float4 x = elem(e);
          const bool valid = full || (ok && t + e >= 0 && t + e < L);
          x.x = select_f32(valid, x.x, 0.f);
          x.y = select_f32(valid, x.y, 0.f);
          Xr[slot(i0 + e)] = x;
        }
      } else if (full) {  // every tile but a sequence's last: no per-element bounds
#pragma unroll
        for (int e = 0; e < 4; ++e) Xr[slot(i0 + e)] = elem(e);
      } else {  // padding reads as 0; masked to the identity step (dt = 0)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const bool valid = ok && t + e >= 0 && t + e < L;
          Xr[slot(i0 + e)] = valid ? elem(e) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
    } else {
      const int m = i - VPT;
      const int w = tid + m * NT;
      if ((kFwdOverlapMode != 2 || BPT * NT != BCV) && w >= BCV) return;
      const int n = bc_state(w, NP), i0 = bc_step(w, NP);
      float bv[4], cv[4] = {0.f, 0.f, 0.f, 0.f};
      rb[m].get(bv);
      if (outputs) rc[m].get(cv);
#pragma unroll
      for (int e = 0; e < 4; ++e) BC[slot(i0 + e) * NP + n] = make_float2(bv[e], cv[e]);
    }
  };
  auto stage_tile = [&](int64_t k, float* buf) {
#pragma unroll
    for (int i = 0; i < NPIECE; ++i) stage_piece(k, buf, i);
  };

  load_tile(kb);
  if constexpr (kFwdOverlap) {  // the first tile staged ahead; each walk stages the next
    stage_tile(kb, smem);
    if (kb + 1 < ke) load_tile(kb + 1);
    __syncthreads();
  }
  for (int64_t k = kb; k < ke; ++k) {
    float* buf = smem + ((k - kb) & 1) * BUF;
    if constexpr (!kFwdOverlap) {
      stage_tile(k, buf);
      if (k + 1 < ke) load_tile(k + 1);
      __syncthreads();
    }
    // kFwdOverlap: the pieces of tile k + 1's staging that follow group g of this walk, into the
    // other buffer (free: its write-out ended before the last barrier). Past the chunk's last
    // tile they stage stale registers into that buffer, which nothing reads again.
    float* nbuf = smem + ((k - kb + 1) & 1) * BUF;
    auto ahead = [&](int g) {
      if constexpr (kFwdOverlap) {
#pragma unroll
        for (int i = g; i < NPIECE; i += 4) stage_piece(k + 1, nbuf, i);
      }
    };

    // The walk through the tile's steps; slot j is step j. Per group of kG steps the P
    // lanes of a row keep their partial y in registers and then reduce-scatter them, so
    // no shared-memory store sits between the steps of a group.
    const float4* X = reinterpret_cast<const float4*>(buf) + r * kSX;
    const float* BC = buf + kSRows * kSX * 4 + 2 * q * NS;
    float* Y = buf + kSRows * kSX * 4 + kST * NP * 2;
    auto step = [&](int j) {
      const float4 x = X[j];
      const float* bc = BC + j * NP * 2;
      float y = 0.f;
#pragma unroll
      for (int s2 = 0; s2 < NS; s2 += 2) {  // (B, C) of two states per 16-byte load
        const float4 v = *reinterpret_cast<const float4*>(bc + 2 * s2);
        h[s2] = fmaf(fast_exp2(x.x * a2[s2]), h[s2], x.y * v.x);
        y = fmaf(v.y, h[s2], y);
        h[s2 + 1] = fmaf(fast_exp2(x.x * a2[s2 + 1]), h[s2 + 1], x.y * v.z);
        y = fmaf(v.w, h[s2 + 1], y);
      }
      return y;
    };
    if (outputs) {
      // The tile's 4 groups unrolled, each group's y reduction issued after the next group's
      // first loads, so that its chain of shuffles (three levels, each waiting for the last)
      // overlaps that group's steps instead of stalling the warp; the last group's reduction
      // stays exposed (the write-out needs it after the barrier).
      static_assert(kG == kCk && kST == 4 * kG, "four groups per tile, each starting at a checkpoint");
      static_assert(kG == 8, "yidx: a group's 8 steps are contiguous from yidx(r, j0)");
      // The forward saving the backward's checkpoints: the states entering each group.
      float* ckp = a.ckpt && rlive ? a.ckpt + row * a.ck_row + (k * kST / kCk) * N + q * NS : nullptr;
      auto save = [&](int j0) {
        if (ckp && k * kST + j0 < L) {
#pragma unroll
          for (int sx = 0; sx < NS; ++sx)
            if (q * NS + sx < N) ckp[(j0 / kCk) * N + sx] = h[sx];
        }
      };
      // A group's sums are stored only after the next group's steps: a shared store ahead of
      // them would keep their shared loads (which the compiler cannot tell apart from it)
      // behind the whole shuffle chain.
      float ya[kG], yb[kG];
      save(0);
#pragma unroll
      for (int g = 0; g < kG; ++g) ya[g] = step(g);
      ahead(0);
      save(kG);
      HeldY<P> ha = reduce_hold<P, RW>(ya, q);
#pragma unroll
      for (int g = 0; g < kG; ++g) yb[g] = step(kG + g);
      ahead(1);
      ha.store(Y + yidx(r, 0));
      save(2 * kG);
      HeldY<P> hb = reduce_hold<P, RW>(yb, q);
#pragma unroll
      for (int g = 0; g < kG; ++g) ya[g] = step(2 * kG + g);
      ahead(2);
      hb.store(Y + yidx(r, kG));
      save(3 * kG);
      ha = reduce_hold<P, RW>(ya, q);
#pragma unroll
      for (int g = 0; g < kG; ++g) yb[g] = step(3 * kG + g);
      ahead(3);
      ha.store(Y + yidx(r, 2 * kG));
      reduce_store<P, RW>(yb, q, Y + yidx(r, 3 * kG));
    } else {
#pragma unroll
      for (int j = 0; j < kST; ++j) {
        if (j % kG == 0 && j > 0) ahead(j / kG - 1);
        if (mode == kChunkEnd) S += X[j].x;  // padding steps have dt = 0
        else if (j % kCk == 0) {
          const int64_t s = k * kST + j;
          if (s < L && rlive) {
#pragma unroll
            for (int sx = 0; sx < NS; ++sx)
              if (q * NS + sx < N) a.ckpt[row * a.ck_row + (s / kCk) * N + q * NS + sx] = h[sx];
          }
        }
        step(j);
      }
      ahead(kST / kG - 1);
    }
    if constexpr (kFwdOverlap) {
      if (k + 2 < ke) load_tile(k + 2);
    }
    __syncthreads();

    if (outputs) {  // out = (y + add) * gate, coalesced
      const int64_t t0 = tm.t0(k);
      const float4* Xb = reinterpret_cast<const float4*>(buf);
      const float* Yb = buf + kSRows * kSX * 4 + kST * NP * 2;
      const bool inside = tile_inside(t0);
#pragma unroll
      for (int m = 0; m < VPT; ++m) {
        if (voff[m] < 0) continue;
        const int v = tid + m * NT;
        const int rr = vec_row(v), i0 = vec_step(v);
        const int64_t o0 = voff[m] + t0, t = t0 + i0;  // o0: the element of time t
        auto live = [&](int e) { return inside || (t + e >= 0 && t + e < L); };
        float o[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int sl = slot(i0 + e);
          const float4 x = Xb[rr * kSX + sl];
          o[e] = (Yb[yidx(rr, sl)] + x.z) * x.w;
        }
        if constexpr (YB == kYbWrite) {
          if (inside) {
            *reinterpret_cast<float4*>(a.ybuf + o0) = make_float4(o[0], o[1], o[2], o[3]);
          } else {
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (live(e)) a.ybuf[o0 + e] = o[e];
          }
        } else if (vec && t >= 0 && t < L) {
          Io<T>::st4(static_cast<T*>(a.out), o0, o);
        } else if (!vec) {
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (t + e >= 0 && t + e < L) Io<T>::st(static_cast<T*>(a.out), o0 + e, o[e]);
        }
      }
    }
    if constexpr (kFwdOverlap) {
      if (outputs) __syncthreads();  // the next walk stages into this buffer
    }
  }
  if (mode == kChunkEnd) {
    if (rlive) {
#pragma unroll
      for (int s = 0; s < NS; ++s)
        if (q * NS + s < N) a.chunk_h[(row * a.ch_slots + c) * N + q * NS + s] = h[s];
      if (q == 0) a.chunk_S[row * a.ch_slots + c] = S;
    }
  } else if (a.last && rlive && c == nch - 1) {
#pragma unroll
    for (int s = 0; s < NS; ++s)
      if (q * NS + s < N) a.last[row * N + q * NS + s] = h[s];
  }
}

// Phase A of the L split (mode kChunkEnd) as a kernel of its own: per sub-chunk of tiles, the
// walk from a zero state with no outputs, h = exp2(dt a2) h + dt u B, and the sum of dt, for
// chunk_carry. It needs only (dt, dt u) per element and B per step, so it stages those alone
// (no z, no C, no y buffer) in 20.6 KiB of shared memory and at most 64 registers, 8 blocks per
// SM, where fwd_staged_kernel ran it at that kernel's 52 KiB and register budget (4 blocks).
// Same tiles, walking order and arithmetic per state as that kernel's walk, so the carries are
// bitwise those it gave (PERFORMANCE_SELECTIVE_SCAN_CUDA 23).
__host__ __device__ constexpr int sfa_buf_floats(int NP) { return kSRows * kSX * 2 + kST * NP; }
__host__ __device__ constexpr size_t sfa_smem_bytes(int NP) {
  return sizeof(float) * (2 * sfa_buf_floats(NP) + kSRows);
}

template <class T, int P, int NS, bool REV>
__global__ void __launch_bounds__(kSRows * P, 32 / P) fwd_staged_phase_a_kernel(FwdArgs a) {
  constexpr int NT = kSRows * P;
  constexpr int NP = P * NS;
  constexpr int VPT = (kSVec + NT - 1) / NT;  // u/delta vectors per thread
  constexpr int BV = NP * kST / 4;            // B vectors per tile
  constexpr int BPT = (BV + NT - 1) / NT;
  constexpr int BUF = sfa_buf_floats(NP);
  static_assert(NS % 2 == 0, "B of two states per 8-byte load");
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* RB = smem + 2 * BUF;  // the rows' delta bias

  const SsProblem& p = a.p;
  const int64_t L = p.L, N = p.N, Dm = p.dim;
  const int64_t nrb = (Dm + kSRows - 1) / kSRows;
  const int64_t b = blockIdx.x / nrb, d0 = (blockIdx.x % nrb) * kSRows;
  const int tid = threadIdx.x;
  const bool vec = (L & 3) == 0;
  const T* u = static_cast<const T*>(p.u);
  const T* de = static_cast<const T*>(p.delta);
  const T* Bp = static_cast<const T*>(p.B) + (b * p.groups_b + d0 / (Dm / p.groups_b)) * N * L;
  // The walking lane: row r, states q NS .. q NS + NS - 1 (no sums across lanes here, so the
  // lane order does not change a bit).
  const int r = tid / P, q = tid % P;
  const bool rlive = d0 + r < Dm;
  const int64_t d = rlive ? d0 + r : Dm - 1, row = b * Dm + d;
  const int64_t c = blockIdx.y, ntiles = (L + kST - 1) / kST;
  const int64_t kb = c * (a.chunk_steps / kST);
  const int64_t ke = kb + a.chunk_steps / kST < ntiles ? kb + a.chunk_steps / kST : ntiles;
  float a2[NS], h[NS], S = 0.f;
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    const int64_t n = q * NS + s;
    a2[s] = n < N ? p.A[d * N + n] * kLog2e : 0.f;
    h[s] = 0.f;
  }
  // Settle the loads of a2 here: else the walk's first use of a2 waits on a scoreboard that the
  // next tile's prefetch shares, on every tile (notes 21.1).
#pragma unroll
  for (int s = 0; s < NS; ++s) asm volatile("add.f32 %0, %0, 0f80000000;" : "+f"(a2[s]));
  if (tid < kSRows) RB[tid] = p.delta_bias ? p.delta_bias[d0 + tid < Dm ? d0 + tid : 0] : 0.f;

  const TileMap tm{L, REV};
  // Vector v of a tile: row v / 8, steps 4 (v % 8) ..; B vector w: state w % NP, steps 4 (w / NP) ..
  Raw4<T> ru[VPT], rd[VPT], rb[BPT];
  auto load_tile = [&](int64_t k) {
    const int64_t t0 = tm.t0(k);
#pragma unroll
    for (int m = 0; m < VPT; ++m) {
      const int v = tid + m * NT, rr = v / (kST / 4), i0 = (v % (kST / 4)) * 4;
      const bool ok = v < kSVec && d0 + rr < Dm;
      const int64_t base = ok ? (b * Dm + d0 + rr) * L : 0;
      const int64_t t = ok ? t0 + i0 : -kST;  // a dead vector reads nothing
      load_raw4(u + base, t, L, vec, ru[m]);
      load_raw4(de + base, t, L, vec, rd[m]);
    }
#pragma unroll
    for (int m = 0; m < BPT; ++m) {
      const int w = tid + m * NT, n = bc_state(w, NP), i0 = bc_step(w, NP);
      const bool ok = w < BV && n < N;
      load_raw4(Bp + (ok ? n : 0) * L, ok ? t0 + i0 : -kST, L, vec, rb[m]);
    }
  };
  auto stage_tile = [&](int64_t k, float* buf) {
    const int64_t t0 = tm.t0(k);
    float2* X = reinterpret_cast<float2*>(buf);  // (dt, dt u) [row][slot]
    float* Bs = buf + kSRows * kSX * 2;          // B [slot][state]
#pragma unroll
    for (int m = 0; m < VPT; ++m) {
      const int v = tid + m * NT;
      if (v >= kSVec) continue;
      const int rr = v / (kST / 4), i0 = (v % (kST / 4)) * 4;
      const bool ok = d0 + rr < Dm;
      const int64_t t = t0 + i0;
      const float bias = RB[rr];
      float uv[4], dv[4];
      ru[m].get(uv);
      rd[m].get(dv);
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // padding and dead rows: the identity step (dt = 0)
        const bool valid = ok && t + e >= 0 && t + e < L;
        const float xb = dv[e] + bias;
        const float dt = p.softplus ? softplus_fast(xb) : xb;
        X[rr * kSX + tm.slot(i0 + e)] = valid ? make_float2(dt, dt * uv[e]) : make_float2(0.f, 0.f);
      }
    }
#pragma unroll
    for (int m = 0; m < BPT; ++m) {
      const int w = tid + m * NT;
      if (w >= BV) continue;
      const int n = bc_state(w, NP), i0 = bc_step(w, NP);
      float bv[4];
      rb[m].get(bv);
#pragma unroll
      for (int e = 0; e < 4; ++e) Bs[tm.slot(i0 + e) * NP + n] = bv[e];
    }
  };

  __syncthreads();  // RB
  load_tile(kb);
  for (int64_t k = kb; k < ke; ++k) {
    // Two buffers, one barrier a tile: a buffer is staged again only after the barrier of
    // the tile in between, which every thread passes after walking it. (The forward kernel's
    // loop is the same skeleton, written out in both on purpose: a shared for_each_tile
    // helper taking the three lambdas made nvcc 13.0 spill in 8 more of the 80-register
    // instantiations, notes 23.4.)
    float* buf = smem + ((k - kb) & 1) * BUF;
    stage_tile(k, buf);
    if (k + 1 < ke) load_tile(k + 1);
    __syncthreads();
    const float2* X = reinterpret_cast<const float2*>(buf) + r * kSX;
    const float* Bs = buf + kSRows * kSX * 2 + q * NS;
#pragma unroll
    for (int j = 0; j < kST; ++j) {
      const float2 x = X[j];
      S += x.x;  // padding steps have dt = 0
#pragma unroll
      for (int s = 0; s < NS; s += 2) {
        const float2 v = *reinterpret_cast<const float2*>(Bs + j * NP + s);
        h[s] = fmaf(fast_exp2(x.x * a2[s]), h[s], x.y * v.x);
        h[s + 1] = fmaf(fast_exp2(x.x * a2[s + 1]), h[s + 1], x.y * v.y);
      }
    }
  }
  if (rlive) {
#pragma unroll
    for (int s = 0; s < NS; ++s)
      if (q * NS + s < N) a.chunk_h[(row * a.ch_slots + c) * N + q * NS + s] = h[s];
    if (q == 0) a.chunk_S[row * a.ch_slots + c] = S;
  }
}

template <class T, int P, int NS>
cudaError_t launch_staged(const FwdArgs& a, int chunks, cudaStream_t stream) {
  const int64_t blocks = a.p.batch * ((a.p.dim + kSRows - 1) / kSRows);
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const bool phase_a = a.mode == kChunkEnd;
  const size_t smem = phase_a ? sfa_smem_bytes(P * NS) : staged_smem_bytes(P * NS);
  auto pick = [&](auto rev) {
    constexpr bool R = decltype(rev)::value;
    return phase_a ? fwd_staged_phase_a_kernel<T, P, NS, R>
           : a.mode == kAddY ? fwd_staged_kernel<T, P, NS, kYbAdd, R>
           : a.mode == kRawY ? fwd_staged_kernel<T, P, NS, kYbWrite, R> : fwd_staged_kernel<T, P, NS, kYbNone, R>;
  };
  auto kern = a.rev ? pick(std::true_type{}) : pick(std::false_type{});
  cudaError_t err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  kern<<<dim3(static_cast<unsigned>(blocks), chunks), kSRows * P, smem, stream>>>(a);
  return cudaGetLastError();
}

template <class T, int P, int NS>
int staged_blocks_per_sm() {
  static const int n = [] {
    // The occupancy query counts dynamic shared memory above 48 KB only once allowed.
    const int smem = static_cast<int>(staged_smem_bytes(P * NS));
    cudaFuncSetAttribute(fwd_staged_kernel<T, P, NS, kYbNone, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    int k = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&k, fwd_staged_kernel<T, P, NS, kYbNone, false>, kSRows * P,
                                                            smem, cudaOccupancyDisableCachingOverride);
    return k;
  }();
  return n;
}

// Lanes per row and states per lane. N <= 16: 8 lanes of 2 states or 4 lanes of 4, by the
// fills of the GPU's waves (ss_staged_fwd_lanes). Fill, e.g. 12288 rows: 384 blocks fill 73%
// of the 528 slots of 4 blocks/SM (4 lanes), 97% of the 396 slots of the 8-lane blocks, which
// fit 3 per SM. More states: as many lanes as N needs.
// `chunks`: the grid's L chunks (blockIdx.y): a.nch, or for phase A of the split the sub-chunks
// before the last chunk. Phase A (its own kernel, 8 blocks of 4 lanes per SM): 4 lanes.
template <class T>
cudaError_t fwd_staged(const FwdArgs& a, int chunks, cudaStream_t stream) {
  const int64_t N = a.p.N;
  if (N > 64) return launch_staged<T, 16, 8>(a, chunks, stream);
  if (N > 32) return launch_staged<T, 8, 8>(a, chunks, stream);
  if (N > 16) return launch_staged<T, 8, 4>(a, chunks, stream);
  if (a.mode == kChunkEnd) return launch_staged<T, 4, 4>(a, chunks, stream);  // 8 blocks per SM
  if (const char* e = std::getenv("JAX_SELSCAN_SS_FWD_LANES")) {  // 4 or 8: force (measurements)
    if (e[0] == '4') return launch_staged<T, 4, 4>(a, chunks, stream);
    if (e[0] == '8') return launch_staged<T, 8, 2>(a, chunks, stream);
  }
  const int64_t blocks = a.p.batch * ((a.p.dim + kSRows - 1) / kSRows) * chunks;
  const bool ys = a.mode != kCheckpoint, plain = a.mode == kFinal && a.ckpt == nullptr;
  if (ss_staged_fwd_lanes(blocks, ss_device_sms(), staged_blocks_per_sm<T, 4, 4>(), staged_blocks_per_sm<T, 8, 2>(), ys,
                          plain, static_cast<int>(sizeof(T))) == 4)
    return launch_staged<T, 4, 4>(a, chunks, stream);
  return launch_staged<T, 8, 2>(a, chunks, stream);
}

}  // namespace ssk
}  // namespace jss
