// Forward selective scan with the staging on warps of their own ("warp-specialised"; notes 29
// of docs/PERFORMANCE_SELECTIVE_SCAN_CUDA.md): the forward of 16-bit inputs with N <= 16, the
// plain output mode (with or without the backward's checkpoints), no L split and L % 8 == 0;
// opt-in with JAX_SELSCAN_SS_FWD_WS=1 (ws_fwd_env) until the GPU test suite has run on it.
//
// The staged kernel (selective_scan_staged.cuh) stages a tile, then walks it, with barriers
// between, in every warp; the walk is bound by the MUFU (one EX2 per state and step), the
// staging by the issue slot, and since every block of an SM starts together, its warps are all
// in the same phase: neither unit is kept busy (notes 28.1). Here a block has 4 walking warps
// (the staged kernel's 32 rows x 4 lanes x 4 states, same walk, same arithmetic) and 2 producer
// warps that, while the walkers walk tile k, write out tile k - 1 and stage tile k + 1:
//   raw slots   (3): tile k's u, delta, z, B, C as loaded, by cp.async (16 bytes a lane);
//   X, BC       (2): per element (dt, dt u), per step and state (B, C), as float32;
//   Y           (2): the walk's y sums, which the producers turn into out = (y + D u) silu(z)
//                    from the raw u and z (so X carries no add or gate).
// Hand-offs are named barriers, arrive on one side and sync on the other (each arrive and sync
// also orders the shared-memory accesses before it for the threads after it):
//   FULL[b]  producers arrive when X/BC[b] hold a tile; walkers sync before walking it;
//   DONE[b]  walkers arrive after the walk of the tile in X/BC/Y[b]; producers sync before its
//            write-out, and only after that write-out stage into X/BC[b] again.
// The outputs are meant to be bitwise those of the staged kernel's 4-lane geometry (the same
// expressions per element and step; its 8-lane geometry sums y in another order): measured so
// where the staged kernel ran 4 lanes (notes 29.1).
#pragma once

#include "selective_scan_staged.cuh"

namespace jss {
namespace ssk {

constexpr int kWsWalkers = kSRows * 4;   // 4 lanes a row, 4 states a lane
constexpr int kWsProducers = 64;         // 2 warps
constexpr int kWsThreads = kWsWalkers + kWsProducers;
constexpr int kWsRaw = 3;                // raw slots: tile k (write-out), k + 1 (staging), k + 2 (loading)
constexpr int kWsYS = 36;                // Y row stride in floats: the write-out's 16-byte row loads hit distinct banks
constexpr int kWsBarProd = 1, kWsBarFull = 2, kWsBarDone = 4;  // named barriers (0 is __syncthreads)

// Shared-memory layout (bytes) for element type T.
template <class T>
struct WsLayout {
  static_assert(sizeof(T) == 2, "the warp-specialised forward is for 16-bit inputs");
  static constexpr int EPC = 16 / sizeof(T);                   // elements in a 16-byte chunk
  static constexpr int CPR = kST / EPC;                        // chunks in a row of a tile
  static constexpr int RS = kST * int(sizeof(T)) + 16;          // raw row stride, padded one chunk
  static constexpr int kRawRows = 3 * kSRows + 2 * 16;          // u, delta, z rows; B, C states
  static constexpr int kRawBytes = kRawRows * RS;
  static constexpr int kXBytes = kSRows * kSX * 8;             // float2 (dt, dt u)
  static constexpr int kBCBytes = kST * 16 * 8;                // float2 (B, C)
  static constexpr int kYBytes = kSRows * kWsYS * 4;
  static constexpr int kX = 0, kBC = kX + 2 * kXBytes, kY = kBC + 2 * kBCBytes, kRaw = kY + 2 * kYBytes;
  static constexpr int kRB = kRaw + kWsRaw * kRawBytes;        // rows' delta bias, then output multiplier
  static constexpr int kBytes = kRB + 2 * kSRows * 4;
  static constexpr int kChunks = kRawRows * CPR;              // 16-byte loads a tile
  static_assert(kChunks % kWsProducers == 0, "each producer lane loads the same number of chunks");
};

// Barrier ids as immediates, so that ptxas reserves only the ones used; `j` picks barrier ID + j.
template <int ID, int N>
__device__ __forceinline__ void ws_bar_sync() {
  asm volatile("bar.sync %0, %1;" ::"n"(ID), "n"(N) : "memory");
}
template <int ID, int N>
__device__ __forceinline__ void ws_bar_arrive() {
  asm volatile("bar.arrive %0, %1;" ::"n"(ID), "n"(N) : "memory");
}
template <int ID, int N>
__device__ __forceinline__ void ws_bar_sync(int j) {
  if (j) ws_bar_sync<ID + 1, N>(); else ws_bar_sync<ID, N>();
}
template <int ID, int N>
__device__ __forceinline__ void ws_bar_arrive(int j) {
  if (j) ws_bar_arrive<ID + 1, N>(); else ws_bar_arrive<ID, N>();
}
// 16 bytes global -> shared, zero-filled when !ok (src must still be a valid address).
__device__ __forceinline__ void ws_cp16(void* s, const void* g, bool ok) {
  const unsigned sa = static_cast<unsigned>(__cvta_generic_to_shared(s));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sa), "l"(g), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void ws_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void ws_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
// M (a multiple of 8) 16-bit values from shared memory (16-byte aligned) as floats.
template <class T, int M>
__device__ __forceinline__ void ws_up(const unsigned char* s, float (&v)[M]) {
  using C = Cvt16<T>;
#pragma unroll
  for (int c = 0; c < M / 8; ++c) {
    const uint4 w = *reinterpret_cast<const uint4*>(s + 16 * c);
    const unsigned ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = C::up2(*reinterpret_cast<const typename C::H2*>(&ws[i]));
      v[8 * c + 2 * i] = f.x;
      v[8 * c + 2 * i + 1] = f.y;
    }
  }
}

template <class T, bool REV>
__global__ void __launch_bounds__(kWsThreads, 3) fwd_ws_kernel(FwdArgs a) {
  using Ly = WsLayout<T>;
  constexpr int P = 4, NS = 4, NP = P * NS, RW = 32 / P;
  extern __shared__ float4 smem4[];
  unsigned char* sm = reinterpret_cast<unsigned char*>(smem4);

  const SsProblem& p = a.p;
  const int64_t L = p.L, N = p.N, Dm = p.dim;
  const int64_t nrb = (Dm + kSRows - 1) / kSRows;
  const int64_t b = blockIdx.x / nrb, d0 = (blockIdx.x % nrb) * kSRows;
  const int tid = threadIdx.x;
  const int64_t ke = (L + kST - 1) / kST;  // tiles, walked 0 .. ke - 1
  const TileMap tm{L, REV};
  float* RB = reinterpret_cast<float*>(sm + Ly::kRB);
  float* RM = RB + kSRows;
  if (tid < kSRows) {
    const int64_t dd = d0 + tid < Dm ? d0 + tid : 0;
    RB[tid] = p.delta_bias ? p.delta_bias[dd] : 0.f;
    RM[tid] = p.Dskip ? p.Dskip[dd] : 0.f;  // kFinal: add = D u
  }
  __syncthreads();  // the last block-wide barrier: from here the roles part

  if (tid >= kWsWalkers) {
    // ---- producers: loads, staging, write-out ----
    const int pt = tid - kWsWalkers;
    const T* u = static_cast<const T*>(p.u);
    const T* de = static_cast<const T*>(p.delta);
    const T* z = static_cast<const T*>(p.z);
    const T* Bp = static_cast<const T*>(p.B) + (b * p.groups_b + d0 / (Dm / p.groups_b)) * N * L;
    const T* Cp = static_cast<const T*>(p.C) + (b * p.groups_c + d0 / (Dm / p.groups_c)) * N * L;
    const bool gated = z != nullptr;
    auto raw = [&](int s) { return sm + Ly::kRaw + s * Ly::kRawBytes; };
    // This lane's chunks, fixed over the tiles: the source row (null: dead row or padded state)
    // and the chunk's step within the tile; a tile adds its first time.
    constexpr int CPL = Ly::kChunks / kWsProducers;
    const T* src[CPL];
    int col[CPL];
#pragma unroll
    for (int m = 0; m < CPL; ++m) {
      const int c = pt + m * kWsProducers, rr = c / Ly::CPR;
      col[m] = c % Ly::CPR;
      if (rr < 3 * kSRows) {
        const int arr = rr / kSRows, r = rr % kSRows;
        const T* g = arr == 0 ? u : arr == 1 ? de : z;
        src[m] = g && d0 + r < Dm ? g + (b * Dm + d0 + r) * L : nullptr;
      } else {
        const int arr = (rr - 3 * kSRows) / 16, n = (rr - 3 * kSRows) % 16;
        src[m] = n < N ? (arr == 0 ? Bp : Cp) + n * L : nullptr;
      }
    }
    auto issue = [&](int64_t k, int s) {
      const int64_t t0 = tm.t0(k);
      unsigned char* base = raw(s);
#pragma unroll
      for (int m = 0; m < CPL; ++m) {
        const int c = pt + m * kWsProducers;
        const int64_t t = t0 + col[m] * Ly::EPC;  // L % 8 == 0: a chunk is wholly in or out of [0, L)
        const bool ok = src[m] && t >= 0 && t < L;
        ws_cp16(base + (c / Ly::CPR) * Ly::RS + col[m] * 16, ok ? src[m] + t : u, ok);
      }
    };
    // Lane pt stages and writes out row pt % 32, positions i0 .. i0 + 15 of the tile, and stages
    // (B, C) of state pt % 16 at positions 8 (pt / 16) .. + 7.
    const int r = pt % kSRows, i0 = (pt / kSRows) * 16;
    const bool rlive = d0 + r < Dm;
    const int bn = pt % 16, bi0 = (pt / 16) * 8;
    auto stage = [&](int64_t k, int xb, int s) {
      const int64_t t0 = tm.t0(k);
      const unsigned char* rs = raw(s);
      float2* X = reinterpret_cast<float2*>(sm + Ly::kX + xb * Ly::kXBytes) + r * kSX;
      float2* BC = reinterpret_cast<float2*>(sm + Ly::kBC + xb * Ly::kBCBytes);
      float uv[16], dv[16];
      ws_up<T>(rs + r * Ly::RS + i0 * 2, uv);
      ws_up<T>(rs + (kSRows + r) * Ly::RS + i0 * 2, dv);
      const float bias = RB[r];
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        const int64_t t = t0 + i0 + e;
        const bool valid = rlive && t >= 0 && t < L;
        const float xb = dv[e] + bias;
        const float dt = p.softplus ? softplus_fast(xb) : xb;
        X[tm.slot(i0 + e)] = valid ? make_float2(dt, dt * uv[e]) : make_float2(0.f, 0.f);
      }
      float bv[8], cv[8];
      ws_up<T>(rs + (3 * kSRows + bn) * Ly::RS + bi0 * 2, bv);
      ws_up<T>(rs + (3 * kSRows + 16 + bn) * Ly::RS + bi0 * 2, cv);
#pragma unroll
      for (int e = 0; e < 8; ++e) BC[tm.slot(bi0 + e) * NP + bn] = make_float2(bv[e], cv[e]);
    };
    auto write_out = [&](int64_t k, int yb, int s) {
      if (!rlive) return;
      const int64_t t0 = tm.t0(k);
      const unsigned char* rs = raw(s);
      // The walk's slots of positions i0 .. i0 + 15: ascending from i0, or (REV) descending
      // from kST - 1 - i0, i.e. the 16 slots from kST - 16 - i0 read in reverse.
      const float* Y = reinterpret_cast<const float*>(sm + Ly::kY + yb * Ly::kYBytes) + r * kWsYS + (REV ? kST - 16 - i0 : i0);
      float yv[16], uv[16], zv[16];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float4 w = reinterpret_cast<const float4*>(Y)[c];
        yv[4 * c] = w.x, yv[4 * c + 1] = w.y, yv[4 * c + 2] = w.z, yv[4 * c + 3] = w.w;
      }
      ws_up<T>(rs + r * Ly::RS + i0 * 2, uv);
      if (gated) ws_up<T>(rs + (2 * kSRows + r) * Ly::RS + i0 * 2, zv);
      const float addmul = RM[r];
      T* out = static_cast<T*>(a.out) + (b * Dm + d0 + r) * L + t0 + i0;
      using C = Cvt16<T>;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        unsigned w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float o[2];
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            const int e = 8 * c + 2 * i + h2;
            const float y = yv[REV ? 15 - e : e];
            o[h2] = (y + __fmul_rn(addmul, uv[e])) * (gated ? silu_fast(zv[e]) : 1.f);  // no FMA: as the staged kernel rounds
          }
          const typename C::H2 pr = C::down2(o[0], o[1]);
          w[i] = *reinterpret_cast<const unsigned*>(&pr);
        }
        const int64_t t = t0 + i0 + 8 * c;
        if (t >= 0 && t < L) *reinterpret_cast<uint4*>(out + 8 * c) = make_uint4(w[0], w[1], w[2], w[3]);
      }
    };

    // Tile k's loads land in raw slot k % 3 (one commit group a tile, empty past the end).
#pragma unroll
    for (int s = 0; s < kWsRaw; ++s) {
      if (s < ke) issue(s, s);
      ws_commit();
    }
    ws_wait<kWsRaw - 1>();
    ws_bar_sync<kWsBarProd, kWsProducers>();
    stage(0, 0, 0);
    ws_bar_arrive<kWsBarFull, kWsThreads>();
    for (int64_t k = 0; k < ke; ++k) {
      const int j = static_cast<int>(k & 1), s = static_cast<int>(k % kWsRaw);
      if (k + 1 < ke) {  // X/BC[1 - j] were last read by walk k - 1, whose DONE came before write-out k - 1
        ws_wait<kWsRaw - 2>();
        ws_bar_sync<kWsBarProd, kWsProducers>();
        stage(k + 1, 1 - j, static_cast<int>((k + 1) % kWsRaw));
        ws_bar_arrive<kWsBarFull, kWsThreads>(1 - j);
      }
      ws_bar_sync<kWsBarDone, kWsThreads>(j);
      write_out(k, j, s);
      ws_bar_sync<kWsBarProd, kWsProducers>();  // every lane is done with raw slot s
      if (k + kWsRaw < ke) issue(k + kWsRaw, s);
      ws_commit();
    }
    ws_wait<0>();
    return;
  }

  // ---- walkers: the staged kernel's walk (P = 4, NS = 4), rows fastest within a warp ----
  const int r = (tid / 32) * RW + (tid % 32) % RW, q = (tid % 32) / RW;
  const bool rlive = d0 + r < Dm;
  const int64_t d = rlive ? d0 + r : Dm - 1;
  const int64_t row = b * Dm + d;
  float a2[NS], h[NS];
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    const int64_t n = q * NS + s;
    a2[s] = n < N ? p.A[d * N + n] * kLog2e : 0.f;
    h[s] = chunk_entry(a, row, n, n < N, 0);
  }
#pragma unroll
  for (int s = 0; s < NS; ++s) asm volatile("add.f32 %0, %0, 0f80000000;" : "+f"(h[s]));  // as in the staged kernel

  for (int64_t k = 0; k < ke; ++k) {
    const int j = static_cast<int>(k & 1);
    ws_bar_sync<kWsBarFull, kWsThreads>(j);
    const float2* X = reinterpret_cast<const float2*>(sm + Ly::kX + j * Ly::kXBytes) + r * kSX;
    const float* BC = reinterpret_cast<const float*>(sm + Ly::kBC + j * Ly::kBCBytes) + 2 * q * NS;
    float* Y = reinterpret_cast<float*>(sm + Ly::kY + j * Ly::kYBytes) + r * kWsYS;
    auto step = [&](int jj) {
      const float2 x = X[jj];
      const float* bc = BC + jj * NP * 2;
      float y = 0.f;
#pragma unroll
      for (int s2 = 0; s2 < NS; s2 += 2) {
        const float4 v = *reinterpret_cast<const float4*>(bc + 2 * s2);
        h[s2] = fmaf(fast_exp2(x.x * a2[s2]), h[s2], x.y * v.x);
        y = fmaf(v.y, h[s2], y);
        h[s2 + 1] = fmaf(fast_exp2(x.x * a2[s2 + 1]), h[s2 + 1], x.y * v.z);
        y = fmaf(v.w, h[s2 + 1], y);
      }
      return y;
    };
    float* ckp = a.ckpt && rlive ? a.ckpt + row * a.ck_row + (k * kST / kCk) * N + q * NS : nullptr;
    auto save = [&](int j0) {
      if (ckp && k * kST + j0 < L) {
#pragma unroll
        for (int sx = 0; sx < NS; ++sx)
          if (q * NS + sx < N) ckp[(j0 / kCk) * N + sx] = h[sx];
      }
    };
    // The staged kernel's group order: each group's y reduction after the next group's steps.
    float ya[kG], yb[kG];
    save(0);
#pragma unroll
    for (int g = 0; g < kG; ++g) ya[g] = step(g);
    save(kG);
    HeldY<P> ha = reduce_hold<P, RW>(ya, q);
#pragma unroll
    for (int g = 0; g < kG; ++g) yb[g] = step(kG + g);
    ha.store(Y);
    save(2 * kG);
    HeldY<P> hb = reduce_hold<P, RW>(yb, q);
#pragma unroll
    for (int g = 0; g < kG; ++g) ya[g] = step(2 * kG + g);
    hb.store(Y + kG);
    save(3 * kG);
    ha = reduce_hold<P, RW>(ya, q);
#pragma unroll
    for (int g = 0; g < kG; ++g) yb[g] = step(3 * kG + g);
    ha.store(Y + 2 * kG);
    reduce_store<P, RW>(yb, q, Y + 3 * kG);
    ws_bar_arrive<kWsBarDone, kWsThreads>(j);
  }
  if (a.last && rlive) {
#pragma unroll
    for (int s = 0; s < NS; ++s)
      if (q * NS + s < N) a.last[row * N + q * NS + s] = h[s];
  }
}

// JAX_SELSCAN_SS_FWD_WS (read per launch): unset or 0 off (for now: notes 29.2), 1 on where it
// applies, 2 (tests) on, and every forward launch it does not take fails, so a test cannot pass
// on the other kernel unawares.
inline int ws_fwd_env() {
  const char* e = std::getenv("JAX_SELSCAN_SS_FWD_WS");
  return e && (e[0] == '1' || e[0] == '2') ? e[0] - '0' : 0;
}
// Whether the warp-specialised forward takes this call (asked for, and one of its cases).
inline bool ws_fwd_ok(const FwdArgs& a, int chunks) {
  if (!ws_fwd_env()) return false;
  const SsProblem& p = a.p;
  auto al = [](const void* x) { return (reinterpret_cast<uintptr_t>(x) & 15) == 0; };
  return p.t != SsDType::F32 && p.N <= 16 && a.mode == kFinal && chunks <= 1 && a.nch <= 1 && p.L % 8 == 0 &&
         al(p.u) && al(p.delta) && (!p.z || al(p.z)) && al(p.B) && al(p.C) && al(a.out);
}

template <class T>
cudaError_t launch_ws(const FwdArgs& a, cudaStream_t stream) {
  const int64_t blocks = a.p.batch * ((a.p.dim + kSRows - 1) / kSRows);
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  auto kern = a.rev ? fwd_ws_kernel<T, true> : fwd_ws_kernel<T, false>;
  cudaError_t err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, WsLayout<T>::kBytes);
  if (err != cudaSuccess) return err;
  kern<<<static_cast<unsigned>(blocks), kWsThreads, WsLayout<T>::kBytes, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace ssk
}  // namespace jss
