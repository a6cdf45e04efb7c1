// Backward selective scan, "staged" layout (the backward of selective_scan_staged.cuh).
//
// Same block shape as the staged forward: 32 rows of one batch element (one B group, one C
// group), P lanes per row with NS states each, tiles of kST steps staged in shared memory,
// here walked from the last tile to the first. Per tile the block's threads stage, once per
// element, XA = (dt, dt*u, dy, u) for the walk (dy = dout * gate) and XB = (dt', dzf) for
// the write-out (dt' = d softplus, dzf = dout * silu'(z)), and (B, C) pairs per step.
// The walk takes the tile in 8-step chunks, last chunk first: from the chunk's checkpoint
// (the forward's kCheckpoint sweep) it recomputes the 8 states and exponentials into
// registers, then runs the adjoint g[t] = C[t] dy[t] + exp(dt[t+1] A) g[t+1] backwards
// through them. Per step the lanes of a row reduce-scatter their partial ddt, du and y
// (as in the forward); dB and dC are summed over the block's 32 rows in shared memory in a
// fixed order after each half chunk (no atomics: bitwise reproducible), written as per-block
// partials and summed over blocks by sum_jobs afterwards, like the other per-row partials
// (dA, dD, ddelta_bias, dh0). Bidirectional: the phases of BwdArgs.
#pragma once

#include "selective_scan_staged.cuh"

namespace jss {
namespace ssk {

constexpr int kBC = kCk;      // steps per walk chunk (= checkpoint interval)
constexpr int kBH = kBC / 2;  // steps per dB/dC reduction (half a chunk: less shared memory)

// Shared floats: XA (float4 per element), XB (float2), BC pairs, three reduced per-step
// outputs (ddt, du, y), the dB/dC terms of half a chunk [step][row][state]. The step stride is
// 8 banks past a multiple of 32 (and a multiple of 4, for float4 stores): the sums' 8-lane
// phases then hit 8 distinct 16-byte bank groups. 59 KB for N = 16: 3 blocks of 128 threads
// per SM (the registers allow no more). Last, the block's 32 delta biases and D values (read
// per tile from here rather than from global memory, where each read stalled the staging).
__host__ __device__ constexpr int sbwd_part_stride(int NP) { return kSRows * NP + 8; }
__host__ __device__ constexpr int sbwd_floats(int NP) {
  return kSRows * kSX * 6 + kST * NP * 2 + 3 * kSRows * kSX + 2 * kBH * sbwd_part_stride(NP) + 2 * kSRows;
}

template <class T, int P, int NS>
__global__ void __launch_bounds__(kSRows * P, 3) bwd_staged_kernel(BwdArgs a) {
  constexpr int NT = kSRows * P;
  constexpr int NP = P * NS;
  constexpr int VPT = (kSVec + NT - 1) / NT;
  constexpr int BCV = NP * kST / 4;
  constexpr int BPT = (BCV + NT - 1) / NT;
  constexpr int PS = sbwd_part_stride(NP);
  static_assert(NS == 4, "float4 checkpoints and dB/dC terms: 4 states per lane");
  static_assert(NP % 16 == 0 && NT == 2 * NP * kBH, "the dB/dC sums: one thread per (B|C, 4 states, step, row group)");
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float4* XA = smem4;
  float2* XB = reinterpret_cast<float2*>(smem4 + kSRows * kSX);
  float* BCs = smem + kSRows * kSX * 6;
  float* RD = BCs + kST * NP * 2;   // reduced ddt (pre-sigmoid), [row][step]
  float* RU = RD + kSRows * kSX;    // reduced du (state part)
  float* RY = RU + kSRows * kSX;    // reduced y
  float* SB = RY + kSRows * kSX;    // [step in chunk][row][lane q, state(s) at q NS + s] dB terms
  float* SC = SB + kBH * PS;        // dC terms
  float* RB = SC + kBH * PS;        // the rows' delta bias
  float* RDk = RB + kSRows;         // the rows' D

  const SsProblem& p = a.p;
  const int64_t L = p.L, N = p.N, Dm = p.dim, R = p.batch * Dm;
  const int64_t nblk = Dm / kSRows;
  const int64_t b = blockIdx.x / nblk, cb = blockIdx.x % nblk, d0 = cb * kSRows;
  const int tid = threadIdx.x;
  const bool rev = a.rev, vec = (L & 3) == 0;
  const T* u = static_cast<const T*>(p.u);
  const T* de = static_cast<const T*>(p.delta);
  const T* z = static_cast<const T*>(p.z);
  const T* dout = static_cast<const T*>(a.dout);
  const T* Bp = static_cast<const T*>(p.B) + (b * p.groups_b + d0 / (Dm / p.groups_b)) * N * L;
  const T* Cp = static_cast<const T*>(p.C) + (b * p.groups_c + d0 / (Dm / p.groups_c)) * N * L;
  const float dmult = a.ndir == 2 ? 2.f : 1.f;

  // Walking lane: row r, states q, q + P, ... (state(s)): each state's (B, C) is then its own
  // 8-byte load (ptxas fuses a lane's two adjacent ones into a 16-byte load). Not fewer
  // wavefronts, but 4-7.5% faster than q*NS .. with fewer spills (PERFORMANCE_SELECTIVE_SCAN_CUDA 12.1).
  const int r = tid / P, q = tid % P;
  auto state = [&](int s) { return q + s * P; };
  const int64_t d = d0 + r, row = b * Dm + d;
  // This block's L chunk: tiles [kb, ke) in walking order, walked backwards (all of them
  // without a split).
  const int64_t ntiles = (L + kST - 1) / kST;
  const int64_t lc = blockIdx.y + a.chunk_base, nch = a.nch > 1 ? a.nch : 1;
  const int64_t kb = nch > 1 ? lc * (a.chunk_steps / kST) : 0;
  const int64_t ke = nch > 1 && kb + a.chunk_steps / kST < ntiles ? kb + a.chunk_steps / kST : ntiles;
  float an[NS], a2[NS], g[NS], accA[NS];
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    const int64_t n = state(s);
    an[s] = n < N ? p.A[d * N + n] : 0.f;
    a2[s] = an[s] * kLog2e;
    g[s] = 0.f;
    if (n < N) {
      if (nch > 1) g[s] = a.chunk_g[chunk_g_slot(a, row, lc) * N + n];
      else if (a.dlast) g[s] = a.dlast[row * N + n];
    }
    accA[s] = 0.f;
  }

  const TileMap tm{L, rev};
  auto slot = [&](int i) { return tm.slot(i); };
  auto load_vec = [&](const T* src, int64_t t, Raw4<T>& v) { load_raw4(src, t, L, vec, v); };
  Raw4<T> ru[VPT], rd[VPT], rz[VPT], rg[VPT], rb[BPT], rc[BPT];
  auto load_tile = [&](int64_t k) {
    const int64_t t0 = tm.t0(k);
#pragma unroll
    for (int m = 0; m < VPT; ++m) {
      const int v = tid + m * NT;
      const int rr = v / (kST / 4), i0 = (v % (kST / 4)) * 4;
      const bool ok = v < kSVec;
      const int64_t base = (b * Dm + d0 + (ok ? rr : 0)) * L;
      const int64_t t = ok ? t0 + i0 : -kST;
      load_vec(u + base, t, ru[m]);
      load_vec(de + base, t, rd[m]);
      load_vec(dout + base, t, rg[m]);
      if (z) load_vec(z + base, t, rz[m]);
    }
#pragma unroll
    for (int m = 0; m < BPT; ++m) {
      const int w = tid + m * NT;
      const int n = bc_state(w, NP), i0 = bc_step(w, NP);
      const bool ok = w < BCV && n < N;
      const int64_t t = ok ? t0 + i0 : -kST;
      load_vec(Bp + (ok ? n : 0) * L, t, rb[m]);
      load_vec(Cp + (ok ? n : 0) * L, t, rc[m]);
    }
  };
  // Per-thread write-out accumulators (the thread's rows are fixed: v = tid + m NT).
  float accD[VPT], accBias[VPT];
#pragma unroll
  for (int m = 0; m < VPT; ++m) accD[m] = accBias[m] = 0.f;

  auto stage_tile = [&](int64_t k) {
    const int64_t t0 = tm.t0(k);
#pragma unroll
    for (int m = 0; m < VPT; ++m) {
      const int v = tid + m * NT;
      if (v >= kSVec) continue;
      const int rr = v / (kST / 4), i0 = (v % (kST / 4)) * 4;
      const int64_t t = t0 + i0;
      const bool full = t >= 0 && t + 3 < L;
      const float bias = RB[rr];
      float uv[4], dv[4], gv[4], zv[4] = {0.f, 0.f, 0.f, 0.f};
      ru[m].get(uv);
      rd[m].get(dv);
      rg[m].get(gv);
      if (z) rz[m].get(zv);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool valid = full || (t + e >= 0 && t + e < L);
        const float xb = dv[e] + bias;
        float dt = xb, sg = 1.f;
        if (p.softplus) {
          float tt;  // exp(-|xb|), shared by softplus and its derivative
          dt = softplus_fast(xb, tt);
          sg = sigmoid_from_t(xb, tt);
        }
        float gate = 1.f, dzf = 0.f;
        if (z) {
          const float s = sigmoid_fast(zv[e]);
          gate = zv[e] * s;
          dzf = gv[e] * s * fmaf(zv[e], 1.f - s, 1.f);
        }
        const int sl = rr * kSX + slot(i0 + e);
        XA[sl] = valid ? make_float4(dt, dt * uv[e], gv[e] * gate, uv[e]) : make_float4(0.f, 0.f, 0.f, 0.f);
        XB[sl] = valid ? make_float2(sg, dzf) : make_float2(0.f, 0.f);
      }
    }
#pragma unroll
    for (int m = 0; m < BPT; ++m) {
      const int w = tid + m * NT;
      if (w >= BCV) continue;
      const int n = bc_state(w, NP), i0 = bc_step(w, NP);
      float bv[4], cv[4];
      rb[m].get(bv);
      rc[m].get(cv);
#pragma unroll
      for (int e = 0; e < 4; ++e)
        *reinterpret_cast<float2*>(BCs + (slot(i0 + e) * NP + n) * 2) = make_float2(bv[e], cv[e]);
    }
  };

  // The checkpoint (state entering an 8-step chunk) of this lane's NS states, straight from
  // global memory into registers, one chunk ahead of the walk so that the load overlaps a
  // chunk of work. Chunk ci covers steps [ci kBC, ci kBC + kBC); past L 0.
  static_assert(kBC == kCk, "one checkpoint per walk chunk");
  const int64_t K = (L + kCk - 1) / kCk;
  const float* ckrow = a.ckpt ? a.ckpt + row * a.ck_row + q : nullptr;
  auto load_ck = [&](int64_t ci) {  // the P lanes of a row read P consecutive floats per state
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (ci < 0 || ci >= K || q >= N) return v;
    const float* src = ckrow + ci * N;
    v.x = src[0];
    if (state(1) < N) v.y = src[P];
    if (state(2) < N) v.z = src[2 * P];
    if (state(3) < N) v.w = src[3 * P];
    return v;
  };
  if (tid < kSRows) {  // all 32 rows exist: the staged backward needs D % 32 == 0
    RB[tid] = p.delta_bias ? p.delta_bias[d0 + tid] : 0.f;
    RDk[tid] = p.Dskip ? p.Dskip[d0 + tid] : 0.f;
  }
  int64_t ci = ke * (kST / kBC) - 1;  // the chunk walked next
  float4 ck_next = load_ck(ci);

  // No register prefetch of tiles here (the walk's chunk registers need the room): each tile
  // is loaded when it is staged; the other blocks on the SM cover the wait.
  for (int64_t k = ke - 1; k >= kb; --k) {
    __syncthreads();  // the previous tile's write-out has read the shared buffers
    load_tile(k);
    stage_tile(k);
    __syncthreads();

    const float4* X = XA + r * kSX;
    const float* BCr = BCs + 2 * q;  // (B, C) of state(s) at + 2 s P
#pragma unroll 1
    for (int c = kST / kBC - 1; c >= 0; --c) {
      const int j0 = c * kBC;
      // Recompute the chunk's states and exponentials.
      float H[kBC][NS], E[kBC][NS], yv[kBC];
      const float4 ck = ck_next;
      ck_next = load_ck(--ci);
      const float h0c[NS] = {ck.x, ck.y, ck.z, ck.w};
      float hs[NS] = {ck.x, ck.y, ck.z, ck.w};
#pragma unroll
      for (int jj = 0; jj < kBC; ++jj) {
        const float4 x = X[j0 + jj];
        const float* bc = BCr + (j0 + jj) * NP * 2;
        float y = 0.f;
#pragma unroll
        for (int s = 0; s < NS; ++s) {
          const float2 v = *reinterpret_cast<const float2*>(bc + 2 * s * P);
          E[jj][s] = fast_exp2(x.x * a2[s]);
          hs[s] = fmaf(E[jj][s], hs[s], x.y * v.x);
          H[jj][s] = hs[s];
          y = fmaf(v.y, hs[s], y);
        }
        yv[jj] = y;
      }
      // y of the chunk is complete: its reduce-scatter's shuffles go here, so that they overlap
      // the adjoint's first half rather than waiting at the chunk's end (stored there).
      const HeldY<P> yheld = reduce_hold<P>(yv, q);
      // The adjoint, backwards through the chunk; after each half, dB and dC of its steps
      // are summed over the block's rows in row order (thread -> (state, step), step
      // fastest, so that consecutive threads write consecutive times of one state).
      float ddt[kBC], dus[kBC];
#pragma unroll
      for (int hf = 1; hf >= 0; --hf) {
#pragma unroll
        for (int jh = kBH - 1; jh >= 0; --jh) {
          const int jj = hf * kBH + jh;
          const float4 x = X[j0 + jj];  // dt, du, dy, u
          const float* bc = BCr + (j0 + jj) * NP * 2;
          float dd = 0.f, du = 0.f, sb[NS], sc[NS];
#pragma unroll
          for (int si = 0; si < NS; ++si) {
            const float2 v = *reinterpret_cast<const float2*>(bc + 2 * si * P);
            const float Bv = v.x, Cv = v.y;
            const float gi = fmaf(Cv, x.z, g[si]);
            const float hp = jj > 0 ? H[jj > 0 ? jj - 1 : 0][si] : h0c[si];
            const float eh = E[jj][si] * hp;
            dd = fmaf(gi, fmaf(Bv, x.w, an[si] * eh), dd);
            du = fmaf(gi * x.x, Bv, du);
            accA[si] = fmaf(gi * x.x, eh, accA[si]);
            g[si] = E[jj][si] * gi;
            sb[si] = gi * x.y;
            sc[si] = x.z * H[jj][si];
          }
          *reinterpret_cast<float4*>(SB + jh * PS + r * NP + q * NS) = make_float4(sb[0], sb[1], sb[2], sb[3]);
          *reinterpret_cast<float4*>(SC + jh * PS + r * NP + q * NS) = make_float4(sc[0], sc[1], sc[2], sc[3]);
          ddt[jj] = dd;
          dus[jj] = du;
        }
        __syncthreads();
        {  // The sums over the block's 32 rows, in a fixed order: a thread per (B|C, 4 states,
           // step, row group gq) adds rows gq, gq + 4, ..., then an xor butterfly over the 4
           // groups (lanes 4 and 8 apart; a + b == b + a, so every lane gets the same bits).
          const int nq = tid & 3, gq = (tid >> 2) & 3, jh = (tid >> 4) & 3, which = tid >> 6;
          const float* src = (which ? SC : SB) + jh * PS + gq * NP + nq * 4;
          float4 acc = *reinterpret_cast<const float4*>(src);
#pragma unroll
          for (int i = 1; i < kSRows / 4; ++i) {
            const float4 v = *reinterpret_cast<const float4*>(src + i * 4 * NP);
            acc.x += v.x;
            acc.y += v.y;
            acc.z += v.z;
            acc.w += v.w;
          }
#pragma unroll
          for (int o = 4; o <= 8; o <<= 1) {
            acc.x += __shfl_xor_sync(kFull, acc.x, o);
            acc.y += __shfl_xor_sync(kFull, acc.y, o);
            acc.z += __shfl_xor_sync(kFull, acc.z, o);
            acc.w += __shfl_xor_sync(kFull, acc.w, o);
          }
          // Slot nq * 4 + gq holds lane nq's state gq, i.e. state(gq) of lane nq (NS = 4);
          // lane gq of the group writes it.
          const int n = nq + gq * P;
          const float sum = gq == 0 ? acc.x : gq == 1 ? acc.y : gq == 2 ? acc.z : acc.w;
          const int64_t st = k * kST + j0 + hf * kBH + jh;
          if (n < N && st < L) {
            float* dst = which ? a.pdC : a.pdB;
            dst[(((b * nblk + cb) * a.ndir + a.dir) * N + n) * L + tmap(st, L, rev)] = sum;
          }
        }
        __syncthreads();
      }
      reduce_store<P>(ddt, q, RD + r * kSX + j0);
      reduce_store<P>(dus, q, RU + r * kSX + j0);
      yheld.store(RY + r * kSX + j0);
    }
    __syncthreads();

    // Write-out of the tile's per-element gradients, coalesced.
    const int64_t t0 = tm.t0(k);
#pragma unroll
    for (int m = 0; m < VPT; ++m) {
      const int v = tid + m * NT;
      if (v >= kSVec) continue;
      const int rr = v / (kST / 4), i0 = (v % (kST / 4)) * 4;
      const int64_t dd = d0 + rr, base = (b * Dm + dd) * L, t = t0 + i0;
      const float Dd = RDk[rr];
      float odu[4], odd[4], odz[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int sl = rr * kSX + slot(i0 + e);
        const bool valid = t + e >= 0 && t + e < L;
        const float4 xa = XA[sl];
        const float2 xb = XB[sl];
        float ddl = RD[sl] * xb.x, dul = RU[sl], y = RY[sl];
        if (a.phase == 1) {
          if (valid) {
            a.du_acc[base + t + e] = dul;
            a.dd_acc[base + t + e] = ddl;
            a.ybuf[base + t + e] = y;
          }
          odu[e] = odd[e] = odz[e] = 0.f;
          continue;
        }
        const float Du = Dd * xa.w;
        float ytot = y + Du;
        if (a.phase == 2 && valid) {
          dul += a.du_acc[base + t + e];
          ddl += a.dd_acc[base + t + e];
          ytot = y + a.ybuf[base + t + e] + 2.f * Du;
        }
        odu[e] = fmaf(dmult * Dd, xa.z, dul);
        odd[e] = ddl;
        odz[e] = xb.y * ytot;
        if (valid) {
          accD[m] = fmaf(dmult * xa.z, xa.w, accD[m]);
          accBias[m] += ddl;
        }
      }
      if (a.phase == 1) continue;
      T* oU = static_cast<T*>(a.du);
      T* oD = static_cast<T*>(a.ddelta);
      T* oZ = static_cast<T*>(a.dz);
      if (vec) {
        if (t >= 0 && t < L) {
          Io<T>::st4(oU, base + t, odu);
          Io<T>::st4(oD, base + t, odd);
          if (z) Io<T>::st4(oZ, base + t, odz);
        }
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (t + e < 0 || t + e >= L) continue;
          Io<T>::st(oU, base + t + e, odu[e]);
          Io<T>::st(oD, base + t + e, odd[e]);
          if (z) Io<T>::st(oZ, base + t + e, odz[e]);
        }
      }
    }
  }

  // Per-row partials: dA, dh0 from the walking lanes; dD, ddelta_bias from the write-out
  // threads (8 consecutive lanes share a row: summed by xor shuffles in a fixed order).
  const int64_t pslot = ((lc * p.batch + b) * a.ndir + a.dir) * Dm + d;
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    const int64_t n = state(s);
    if (n >= N) continue;
    a.pdA[pslot * N + n] = accA[s];
    if (a.pdh0 && lc == 0) a.pdh0[(a.dir * R + row) * N + n] = g[s];
  }
#pragma unroll
  for (int m = 0; m < VPT; ++m) {
    float sD = accD[m], sB = accBias[m];
#pragma unroll
    for (int o = 1; o < kST / 4; o <<= 1) {
      sD += __shfl_xor_sync(kFull, sD, o);
      sB += __shfl_xor_sync(kFull, sB, o);
    }
    const int v = tid + m * NT;
    if (v < kSVec && (v % (kST / 4)) == 0) {
      const int64_t ps = ((lc * p.batch + b) * a.ndir + a.dir) * Dm + d0 + v / (kST / 4);
      if (a.pdD) a.pdD[ps] = sD;
      if (a.pdbias) a.pdbias[ps] = sB;
    }
  }
}

// Phase A of the L split (a.chunk_end) as a kernel of its own: per sub-chunk of tiles, the
// adjoint alone from zero, g[t] = exp(dt[t] A) (C[t] dy[t] + g[t+1]), and the sum of dt, for
// chunk_carry. It needs only dt and dy = dout * gate per element and C per step, so it stages
// those alone (no u, no B, no backward terms), in 10.6 KiB of shared memory and few registers,
// where the backward's kernel ran it at that kernel's 168 registers and 57.6 KiB (3 blocks per
// SM). Same block geometry, tile order and arithmetic as that kernel's phase-A walk, so the
// carries are bitwise those it gave (PERFORMANCE_SELECTIVE_SCAN_CUDA 22.5).
__host__ __device__ constexpr int sbwd_a_floats(int NP) { return kSRows * kSX * 2 + kST * NP + kSRows; }

template <class T, int P, int NS>
__global__ void __launch_bounds__(kSRows * P, 6) bwd_staged_phase_a_kernel(BwdArgs a) {
  constexpr int NT = kSRows * P;
  constexpr int NP = P * NS;
  constexpr int VPT = (kSVec + NT - 1) / NT;
  constexpr int CV = NP * kST / 4;
  constexpr int CPT = (CV + NT - 1) / NT;
  extern __shared__ float4 smem4[];
  float2* XD = reinterpret_cast<float2*>(smem4);  // (dt, dy) [row][slot]
  float* Cs = reinterpret_cast<float*>(XD + kSRows * kSX);  // C [slot][state]
  float* RB = Cs + kST * NP;                                // the rows' delta bias

  const SsProblem& p = a.p;
  const int64_t L = p.L, N = p.N, Dm = p.dim;
  const int64_t nblk = Dm / kSRows;
  const int64_t b = blockIdx.x / nblk, d0 = (blockIdx.x % nblk) * kSRows;
  const int tid = threadIdx.x;
  const bool vec = (L & 3) == 0;
  const T* de = static_cast<const T*>(p.delta);
  const T* z = static_cast<const T*>(p.z);
  const T* dout = static_cast<const T*>(a.dout);
  const T* Cp = static_cast<const T*>(p.C) + (b * p.groups_c + d0 / (Dm / p.groups_c)) * N * L;
  const int r = tid / P, q = tid % P;
  auto state = [&](int s) { return q + s * P; };
  const int64_t d = d0 + r, row = b * Dm + d;
  const int64_t ntiles = (L + kST - 1) / kST;
  const int64_t lc = blockIdx.y + a.chunk_base;
  const int64_t kb = lc * (a.chunk_steps / kST);
  const int64_t ke = kb + a.chunk_steps / kST < ntiles ? kb + a.chunk_steps / kST : ntiles;
  float a2[NS], g[NS], S = 0.f;
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    const int64_t n = state(s);
    a2[s] = (n < N ? p.A[d * N + n] : 0.f) * kLog2e;
    g[s] = 0.f;
  }
  if (tid < kSRows) RB[tid] = p.delta_bias ? p.delta_bias[d0 + tid] : 0.f;
  const TileMap tm{L, a.rev};
  for (int64_t k = ke - 1; k >= kb; --k) {
    __syncthreads();  // the previous tile's walk has read the shared buffers (and RB is set)
    const int64_t t0 = tm.t0(k);
#pragma unroll
    for (int m = 0; m < VPT; ++m) {
      const int v = tid + m * NT;
      if (v >= kSVec) continue;
      const int rr = v / (kST / 4), i0 = (v % (kST / 4)) * 4;
      const int64_t base = (b * Dm + d0 + rr) * L, t = t0 + i0;
      Raw4<T> rd, rg, rz;
      load_raw4(de + base, t, L, vec, rd);
      load_raw4(dout + base, t, L, vec, rg);
      if (z) load_raw4(z + base, t, L, vec, rz);
      const bool full = t >= 0 && t + 3 < L;
      const float bias = RB[rr];
      float dv[4], gv[4], zv[4] = {0.f, 0.f, 0.f, 0.f};
      rd.get(dv);
      rg.get(gv);
      if (z) rz.get(zv);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool valid = full || (t + e >= 0 && t + e < L);
        const float xb = dv[e] + bias;
        const float dt = p.softplus ? softplus_fast(xb) : xb;
        float gate = 1.f;
        if (z) gate = zv[e] * sigmoid_fast(zv[e]);
        XD[rr * kSX + tm.slot(i0 + e)] = valid ? make_float2(dt, gv[e] * gate) : make_float2(0.f, 0.f);
      }
    }
#pragma unroll
    for (int m = 0; m < CPT; ++m) {
      const int w = tid + m * NT;
      if (w >= CV) continue;
      const int n = bc_state(w, NP), i0 = bc_step(w, NP);
      Raw4<T> rc;
      load_raw4(Cp + (n < N ? n : 0) * L, n < N ? t0 + i0 : -kST, L, vec, rc);
      float cv[4];
      rc.get(cv);
#pragma unroll
      for (int e = 0; e < 4; ++e) Cs[tm.slot(i0 + e) * NP + n] = cv[e];
    }
    __syncthreads();
    const float2* X = XD + r * kSX;
#pragma unroll 4
    for (int j = kST - 1; j >= 0; --j) {
      const float2 x = X[j];
      S += x.x;
#pragma unroll
      for (int s = 0; s < NS; ++s) g[s] = fast_exp2(x.x * a2[s]) * fmaf(Cs[j * NP + state(s)], x.y, g[s]);
    }
  }
#pragma unroll
  for (int s = 0; s < NS; ++s)
    if (state(s) < N) a.chunk_g[(row * a.ch_slots + lc) * N + state(s)] = g[s];
  if (q == 0) a.chunk_S[row * a.ch_slots + lc] = S;
}

template <class T, int P, int NS>
cudaError_t launch_staged_bwd(const BwdArgs& a, int chunks, cudaStream_t stream) {
  const int64_t blocks = a.p.batch * (a.p.dim / kSRows);
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const size_t smem = sizeof(float) * (a.chunk_end ? sbwd_a_floats(P * NS) : sbwd_floats(P * NS));
  auto kern = a.chunk_end ? bwd_staged_phase_a_kernel<T, P, NS> : bwd_staged_kernel<T, P, NS>;
  cudaError_t err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  kern<<<dim3(static_cast<unsigned>(blocks), chunks), kSRows * P, smem, stream>>>(a);
  return cudaGetLastError();
}

// `chunks`: the grid's L chunks (blockIdx.y), from chunk a.chunk_base.
template <class T>
cudaError_t bwd_staged(const BwdArgs& a, int chunks, cudaStream_t stream) {
  return launch_staged_bwd<T, 4, 4>(a, chunks, stream);
}

}  // namespace ssk
}  // namespace jss
