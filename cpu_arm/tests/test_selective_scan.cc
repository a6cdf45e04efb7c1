// C++ tests of the CPU selective scan against a scalar float64 reference, with
// each ISA this CPU/build runs in turn (AVX-512, AVX2, generic on x86-64; NEON
// and generic on aarch64): all options (D, z, delta_bias + softplus, h0, last
// states, invariant / variable / grouped B and C with different groups), odd
// lengths and channel counts, float32 / bfloat16 / float16 storage, the three
// directions; the fused bidirectional result against forward + reverse of
// separate calls; threads (results must be bit-identical to one thread). The
// backward (selective_scan_bwd_cpu): every gradient against a float64 adjoint
// (itself checked against central differences), every case and direction,
// bit-identical on 1, 3 and 4 threads; the forced L split (3 and 7 threads, fewer tasks than
// threads) against the reference, reproducible.
//
//   ./test_selective_scan           all cases
//   ./test_selective_scan --quick   fewer / smaller cases (for emulators)
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../dtypes.h"
#include "test_util.h"
#include "../selective_scan_cpu.h"
#include "../selective_scan_bwd_cpu.h"
#include "../ss_host_util.h"

using namespace jax_selscan;

namespace {

using test::g_checks;
using test::g_failures;
using Threads = test::ThreadExecutor;
int g_split_runs = 0;  // backward calls that ran the L split

// An operand stored in one of the three types; `v` holds the exact (rounded) values.
struct Arr {
  SsType t = SsType::kF32;
  std::vector<double> v;
  std::vector<float> f;
  std::vector<uint16_t> h;
  bool present = false;
  const void* ptr() const {
    if (!present) return nullptr;
    return t == SsType::kF32 ? static_cast<const void*>(f.data()) : static_cast<const void*>(h.data());
  }
};

Arr make(std::mt19937& g, size_t n, SsType t, double scale, double shift, bool present = true) {
  Arr a;
  a.t = t;
  a.present = present;
  if (!present) return a;
  std::normal_distribution<double> nd(0.0, 1.0);
  a.v.resize(n);
  for (size_t i = 0; i < n; ++i) {
    float x = static_cast<float>(nd(g) * scale + shift);
    if (t == SsType::kBF16) { uint16_t b = float_to_bf16(x); a.h.push_back(b); x = bf16_to_float(b); }
    else if (t == SsType::kF16) { uint16_t b = float_to_f16(x); a.h.push_back(b); x = f16_to_float(b); }
    else a.f.push_back(x);
    a.v[i] = x;
  }
  return a;
}

struct Case {
  int64_t batch, dim, N, L, bg, cg;  // bg / cg: 0 = invariant (D, N), else groups
  bool D, z, bias, softplus, h0, last;
  SsType io, state_in;  // u/delta/z/out type; A/B/C/D/bias/h0 type
  bool fast_decay = false;  // A <= -2: dA's products underflow within ~100 steps (L split windows close)
  bool slow_decay = false;  // A / 50: dA's products stay large over a piece (the carries matter)
};

struct Inputs {
  Arr u, delta, A, B, C, D, z, bias, h0;
};

Inputs make_inputs(const Case& c, uint32_t seed) {
  std::mt19937 g(seed);
  Inputs x;
  const size_t bdl = c.batch * c.dim * c.L;
  x.u = make(g, bdl, c.io, 1.0, 0.0);
  x.delta = c.softplus ? make(g, bdl, c.io, 0.5, -0.5) : make(g, bdl, c.io, 0.2, 0.5);
  if (!c.softplus) for (auto& d : x.delta.v) d = std::fabs(d);  // only used by the reference: keep in sync below
  x.A = make(g, c.dim * c.N, c.state_in, 0.5, 0.0);
  // A = -exp(normal * 0.5): overwrite values and storage consistently.
  {
    Arr a = make(g, c.dim * c.N, c.state_in, 0.5, 0.0);
    for (size_t i = 0; i < a.v.size(); ++i) {
      float v = -std::exp(static_cast<float>(a.v[i])) - (c.fast_decay ? 2.0f : 0.0f);
      if (c.slow_decay) v *= 0.02f;
      if (a.t == SsType::kBF16) { a.h[i] = float_to_bf16(v); v = bf16_to_float(a.h[i]); }
      else if (a.t == SsType::kF16) { a.h[i] = float_to_f16(v); v = f16_to_float(a.h[i]); }
      else a.f[i] = v;
      a.v[i] = v;
    }
    x.A = a;
  }
  x.B = make(g, c.bg ? c.batch * c.bg * c.N * c.L : c.dim * c.N, c.state_in, 1.0, 0.0);
  x.C = make(g, c.cg ? c.batch * c.cg * c.N * c.L : c.dim * c.N, c.state_in, 1.0, 0.0);
  x.D = make(g, c.dim, c.state_in, 1.0, 0.0, c.D);
  x.z = make(g, bdl, c.io, 1.0, 0.0, c.z);
  x.bias = make(g, c.dim, c.state_in, 0.2, 0.2, c.bias);
  x.h0 = make(g, c.batch * c.dim * c.N, c.state_in, 1.0, 0.0, c.h0);
  if (!c.softplus) {  // delta > 0 without softplus: store |delta|
    Arr& d = x.delta;
    for (size_t i = 0; i < d.v.size(); ++i) {
      float v = static_cast<float>(d.v[i]);
      if (d.t == SsType::kBF16) d.h[i] = float_to_bf16(v);
      else if (d.t == SsType::kF16) d.h[i] = float_to_f16(v);
      else d.f[i] = v;
    }
  }
  return x;
}

// float64 loop: out (batch, D, L), last states (batch, D, N) for one direction.
void reference(const Case& c, const Inputs& x, bool reverse, std::vector<double>& out,
               std::vector<double>& last, bool accumulate) {
  if (!accumulate) out.assign(c.batch * c.dim * c.L, 0.0);
  last.assign(c.batch * c.dim * c.N, 0.0);
  std::vector<double> h(c.N);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t d = 0; d < c.dim; ++d) {
      for (int64_t n = 0; n < c.N; ++n) h[n] = c.h0 ? x.h0.v[(b * c.dim + d) * c.N + n] : 0.0;
      for (int64_t k = 0; k < c.L; ++k) {
        const int64_t t = reverse ? c.L - 1 - k : k;
        const int64_t i = (b * c.dim + d) * c.L + t;
        double dl = x.delta.v[i] + (c.bias ? x.bias.v[d] : 0.0);
        if (c.softplus) dl = dl > 0 ? dl + std::log1p(std::exp(-dl)) : std::log1p(std::exp(dl));
        double y = 0;
        for (int64_t n = 0; n < c.N; ++n) {
          const double Bv = c.bg ? x.B.v[((b * c.bg + d / (c.dim / c.bg)) * c.N + n) * c.L + t]
                                 : x.B.v[d * c.N + n];
          const double Cv = c.cg ? x.C.v[((b * c.cg + d / (c.dim / c.cg)) * c.N + n) * c.L + t]
                                 : x.C.v[d * c.N + n];
          h[n] = std::exp(dl * x.A.v[d * c.N + n]) * h[n] + dl * Bv * x.u.v[i];
          y += Cv * h[n];
        }
        if (c.D) y += x.D.v[d] * x.u.v[i];
        if (c.z) { const double zz = x.z.v[i]; y *= zz / (1.0 + std::exp(-zz)); }
        out[i] += y;
      }
      for (int64_t n = 0; n < c.N; ++n) last[(b * c.dim + d) * c.N + n] = h[n];
    }
}

struct Result {
  std::vector<float> out, lf, lr;
};

Result run(const Case& c, const Inputs& x, SsDirection dir, const SsTable& table, Executor& ex,
           std::vector<float>* ckpt = nullptr, int64_t ckpt_row = 0) {
  SsParams p{};
  if (ckpt != nullptr) {  // checkpoints for the backward (SsParams::ckpt)
    ckpt->assign(c.batch * c.dim * ckpt_row, NAN);
    p.ckpt = ckpt->data();
    p.ckpt_row = ckpt_row;
  }
  p.u = x.u.ptr(); p.u_t = x.u.t;
  p.delta = x.delta.ptr(); p.delta_t = x.delta.t;
  p.A = x.A.ptr(); p.A_t = x.A.t;
  p.B = x.B.ptr(); p.B_t = x.B.t; p.b_var = c.bg != 0;
  p.C = x.C.ptr(); p.C_t = x.C.t; p.c_var = c.cg != 0;
  p.D = x.D.ptr(); p.D_t = x.D.t;
  p.z = x.z.ptr(); p.z_t = x.z.t;
  p.delta_bias = x.bias.ptr(); p.delta_bias_t = x.bias.t;
  p.h0 = x.h0.ptr(); p.h0_t = x.h0.t;
  p.delta_softplus = c.softplus;
  p.direction = dir;
  p.batch = c.batch; p.dim = c.dim; p.dstate = c.N; p.length = c.L;
  p.b_groups = c.bg ? c.bg : 1;
  p.c_groups = c.cg ? c.cg : 1;
  Result r;
  r.out.assign(c.batch * c.dim * c.L, 0.0f);
  std::vector<uint16_t> out16(r.out.size());
  p.out_t = c.io;
  p.out = c.io == SsType::kF32 ? static_cast<void*>(r.out.data()) : static_cast<void*>(out16.data());
  if (c.last) {
    r.lf.assign(c.batch * c.dim * c.N, NAN);
    r.lr.assign(c.batch * c.dim * c.N, NAN);
    if (dir != SsDirection::kReverse) p.last_fwd = r.lf.data();
    if (dir != SsDirection::kForward) p.last_rev = r.lr.data();
  }
  selective_scan_cpu(p, table, ex);
  if (c.io != SsType::kF32)
    for (size_t i = 0; i < r.out.size(); ++i)
      r.out[i] = c.io == SsType::kBF16 ? bf16_to_float(out16[i]) : f16_to_float(out16[i]);
  return r;
}

double rel_err(const std::vector<float>& got, const std::vector<double>& want) {
  double scale = 1e-30, err = 0;
  for (double w : want) scale = std::fmax(scale, std::fabs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = std::fabs(got[i] - want[i]);
    if (!(e <= err)) err = e;  // NaN counts as the worst
  }
  return err / scale;
}

const char* tname(SsType t) { return t == SsType::kF32 ? "f32" : t == SsType::kBF16 ? "bf16" : "f16"; }

void run_case(const Case& c, const SsTable& table, uint32_t seed) {
  const Inputs x = make_inputs(c, seed);
  InlineExecutor one;
  Threads four(4);
  // Tolerance relative to the largest output: float32 state; 16-bit outputs round.
  const double tol = c.io == SsType::kF32 ? 2e-5 : c.io == SsType::kBF16 ? 1.6e-2 : 2e-3;
  char what[256];
  std::snprintf(what, sizeof what,
                "%s b%lld D%lld N%lld L%lld B%lld C%lld D%d z%d bias%d sp%d h0%d io=%s st=%s",
                table.name, (long long)c.batch, (long long)c.dim, (long long)c.N, (long long)c.L,
                (long long)c.bg, (long long)c.cg, c.D, c.z, c.bias, c.softplus, c.h0, tname(c.io),
                tname(c.state_in));
  std::vector<double> ref_f, ref_r, ref_b, last_f, last_r, tmp_last;
  reference(c, x, false, ref_f, last_f, false);
  reference(c, x, true, ref_r, last_r, false);
  ref_b = ref_f;
  for (size_t i = 0; i < ref_b.size(); ++i) ref_b[i] += ref_r[i];

  const Result f = run(c, x, SsDirection::kForward, table, one);
  const Result r = run(c, x, SsDirection::kReverse, table, one);
  const Result bi = run(c, x, SsDirection::kBidirectional, table, one);
  const Result bi4 = run(c, x, SsDirection::kBidirectional, table, four);
  const Result f4 = run(c, x, SsDirection::kForward, table, four);
  double e;
  CHECK((e = rel_err(f.out, ref_f)) <= tol, "%s forward out rel err %.3g", what, e);
  CHECK((e = rel_err(r.out, ref_r)) <= tol, "%s reverse out rel err %.3g", what, e);
  CHECK((e = rel_err(bi.out, ref_b)) <= tol, "%s bidirectional out rel err %.3g", what, e);
  if (c.last) {
    CHECK((e = rel_err(f.lf, last_f)) <= 2e-5, "%s forward last rel err %.3g", what, e);
    CHECK((e = rel_err(r.lr, last_r)) <= 2e-5, "%s reverse last rel err %.3g", what, e);
    CHECK((e = rel_err(bi.lf, last_f)) <= 2e-5, "%s bidi fwd last rel err %.3g", what, e);
    CHECK((e = rel_err(bi.lr, last_r)) <= 2e-5, "%s bidi rev last rel err %.3g", what, e);
    // Same arithmetic as the separate calls: the last states are bit-identical.
    CHECK(std::memcmp(bi.lf.data(), f.lf.data(), 4 * f.lf.size()) == 0, "%s bidi fwd last != forward", what);
    CHECK(std::memcmp(bi.lr.data(), r.lr.data(), 4 * r.lr.size()) == 0, "%s bidi rev last != reverse", what);
  }
  // Fused bidirectional == forward + reverse of separate calls (float32 outputs:
  // up to the rounding of the sum, and of D u counted twice, then silu(z)).
  if (c.io == SsType::kF32) {
    std::vector<double> sum(f.out.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = double(f.out[i]) + double(r.out[i]);
    CHECK((e = rel_err(bi.out, sum)) <= 1e-6, "%s fused bidirectional vs forward + reverse: %.3g", what, e);
  }
  // The kept exp(delta A) are the recomputed ones: keeping none, the first block only, all
  // but the last block, or all of them gives the same bits (channel path; the along-L path
  // keeps none).
  {
    const int64_t block_bytes = table.lanes * c.N * table.lanes * 4, nb = (c.L + table.lanes - 1) / table.lanes;
    for (int64_t kb : {int64_t(0), int64_t(1), nb - 1, nb + 1}) {
      if (kb < 0) continue;
      setenv("JAX_SELSCAN_SS_DA_BYTES", std::to_string(kb * block_bytes).c_str(), 1);
      const Result bk = run(c, x, SsDirection::kBidirectional, table, one);
      CHECK(std::memcmp(bk.out.data(), bi.out.data(), bi.out.size() * sizeof(bi.out[0])) == 0,
            "%s bidi keeping dA of %lld blocks of %lld != default", what, (long long)kb, (long long)nb);
      if (c.last)
        CHECK(std::memcmp(bk.lf.data(), bi.lf.data(), 4 * bi.lf.size()) == 0 &&
                  std::memcmp(bk.lr.data(), bi.lr.data(), 4 * bi.lr.size()) == 0,
              "%s bidi last states keeping dA of %lld blocks != default", what, (long long)kb);
    }
    unsetenv("JAX_SELSCAN_SS_DA_BYTES");
    // Likewise the prepared rows the forward pass reads (the first blocks' or none).
    for (int64_t kb : {int64_t(0), int64_t(1), nb - 1}) {
      if (kb < 0) continue;
      setenv("JAX_SELSCAN_SS_PREP_BYTES", std::to_string(kb * 3 * table.lanes * table.lanes * 4).c_str(), 1);
      const Result bk = run(c, x, SsDirection::kBidirectional, table, one);
      CHECK(std::memcmp(bk.out.data(), bi.out.data(), bi.out.size() * sizeof(bi.out[0])) == 0,
            "%s bidi keeping the prepared rows of %lld blocks of %lld != default", what, (long long)kb,
            (long long)nb);
    }
    unsetenv("JAX_SELSCAN_SS_PREP_BYTES");
  }
  // Threads. With at least as many tasks as threads every task is computed the same
  // way whichever thread runs it (bit-identical to one thread); with fewer, L is
  // split into pieces (results differ by float rounding: compared with the float64
  // reference), and a given thread count is bit-reproducible.
  CHECK((e = rel_err(bi4.out, ref_b)) <= tol, "%s 4 threads bidirectional rel err %.3g", what, e);
  CHECK((e = rel_err(f4.out, ref_f)) <= tol, "%s 4 threads forward rel err %.3g", what, e);
  const Result f4b = run(c, x, SsDirection::kForward, table, four);
  CHECK(std::memcmp(f4b.out.data(), f4.out.data(), 4 * f4.out.size()) == 0, "%s 4 threads not reproducible", what);
  const int64_t tasks_if_channels = c.batch * ((c.dim + table.lanes - 1) / table.lanes);
  if (tasks_if_channels >= 4) {
    CHECK(std::memcmp(bi4.out.data(), bi.out.data(), 4 * bi.out.size()) == 0, "%s 4 threads != 1 (bidi)", what);
    CHECK(std::memcmp(f4.out.data(), f.out.data(), 4 * f.out.size()) == 0, "%s 4 threads != 1 (fwd)", what);
  }
  // Forced L split (pieces of >= 64 steps) on 3 and 7 threads: every direction, last states,
  // fused bidirectional == forward + reverse of the same split.
  if (c.L >= 128) {
    setenv("JAX_SELSCAN_SS_PIECE_STEPS", "64", 1);
    for (int nt : {3, 7}) {
      Threads th(nt);
      const Result sf = run(c, x, SsDirection::kForward, table, th);
      const Result sr = run(c, x, SsDirection::kReverse, table, th);
      const Result sb = run(c, x, SsDirection::kBidirectional, table, th);
      CHECK((e = rel_err(sf.out, ref_f)) <= tol, "%s split %d threads forward rel err %.3g", what, nt, e);
      CHECK((e = rel_err(sr.out, ref_r)) <= tol, "%s split %d threads reverse rel err %.3g", what, nt, e);
      CHECK((e = rel_err(sb.out, ref_b)) <= tol, "%s split %d threads bidi rel err %.3g", what, nt, e);
      if (c.last) {
        CHECK((e = rel_err(sf.lf, last_f)) <= 2e-5, "%s split %d fwd last rel err %.3g", what, nt, e);
        CHECK((e = rel_err(sr.lr, last_r)) <= 2e-5, "%s split %d rev last rel err %.3g", what, nt, e);
        CHECK(std::memcmp(sb.lf.data(), sf.lf.data(), 4 * sf.lf.size()) == 0, "%s split bidi fwd last != forward", what);
        CHECK(std::memcmp(sb.lr.data(), sr.lr.data(), 4 * sr.lr.size()) == 0, "%s split bidi rev last != reverse", what);
      }
      if (c.io == SsType::kF32) {
        std::vector<double> sum(sf.out.size());
        for (size_t i = 0; i < sum.size(); ++i) sum[i] = double(sf.out[i]) + double(sr.out[i]);
        CHECK((e = rel_err(sb.out, sum)) <= 1e-6, "%s split bidirectional vs forward + reverse: %.3g", what, e);
      }
    }
    unsetenv("JAX_SELSCAN_SS_PIECE_STEPS");
  }
}


// ---- backward ----------------------------------------------------------------------------

// Cotangents: dout (batch, D, L) in the io type, the last states' (batch, D, N) float32.
struct Cot {
  Arr dout;
  std::vector<float> dlf, dlr;
};

Cot make_cot(const Case& c, uint32_t seed) {
  std::mt19937 g(seed * 7919u + 17u);
  Cot k;
  k.dout = make(g, c.batch * c.dim * c.L, c.io, 1.0, 0.0);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (auto* v : {&k.dlf, &k.dlr}) {
    v->resize(c.batch * c.dim * c.N);
    for (auto& e : *v) e = static_cast<float>(nd(g));
  }
  return k;
}

// Gradients in float64 (or float32 from the kernel, widened), named like the operands.
struct Grads {
  std::vector<double> u, delta, z, A, B, C, D, bias, h0;
};

double softplus_d(double x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }
double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The float64 backward of sum(out * dout) + sum(last_f * dlf) + sum(last_r * dlr): for
// each (b, d) and direction the states are kept, then the adjoint runs backwards.
Grads reference_bwd(const Case& c, const Inputs& x, const Cot& k, SsDirection dir) {
  Grads gr;
  const size_t bdl = c.batch * c.dim * c.L;
  gr.u.assign(bdl, 0); gr.delta.assign(bdl, 0); gr.z.assign(c.z ? bdl : 0, 0);
  gr.A.assign(c.dim * c.N, 0);
  gr.B.assign(x.B.v.size(), 0); gr.C.assign(x.C.v.size(), 0);
  gr.D.assign(c.D ? c.dim : 0, 0); gr.bias.assign(c.bias ? c.dim : 0, 0);
  gr.h0.assign(c.h0 ? c.batch * c.dim * c.N : 0, 0);
  const double kD = dir == SsDirection::kBidirectional ? 2.0 : 1.0;
  const int64_t L = c.L, N = c.N;
  std::vector<double> dt(L), raw(L), ysum(L), ddt(L), du(L), h((L + 1) * N), a(L * N), g(N);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t d = 0; d < c.dim; ++d) {
      const int64_t row = (b * c.dim + d) * L;
      auto Bv = [&](int64_t t, int64_t n) {
        return c.bg ? x.B.v[((b * c.bg + d / (c.dim / c.bg)) * N + n) * L + t] : x.B.v[d * N + n];
      };
      auto Cv = [&](int64_t t, int64_t n) {
        return c.cg ? x.C.v[((b * c.cg + d / (c.dim / c.cg)) * N + n) * L + t] : x.C.v[d * N + n];
      };
      auto bidx = [&](int64_t t, int64_t n) { return c.bg ? ((b * c.bg + d / (c.dim / c.bg)) * N + n) * L + t : d * N + n; };
      auto cidx = [&](int64_t t, int64_t n) { return c.cg ? ((b * c.cg + d / (c.dim / c.cg)) * N + n) * L + t : d * N + n; };
      for (int64_t t = 0; t < L; ++t) {
        raw[t] = x.delta.v[row + t] + (c.bias ? x.bias.v[d] : 0.0);
        dt[t] = c.softplus ? softplus_d(raw[t]) : raw[t];
        ysum[t] = ddt[t] = du[t] = 0;
      }
      auto dyf = [&](int64_t t) {
        const double o = k.dout.v[row + t];
        if (!c.z) return o;
        const double zz = x.z.v[row + t];
        return o * zz * sigmoid_d(zz);
      };
      for (int rv = 0; rv < 2; ++rv) {
        const bool rev = rv == 1;
        if (rev && dir == SsDirection::kForward) continue;
        if (!rev && dir == SsDirection::kReverse) continue;
        auto tm = [&](int64_t s) { return rev ? L - 1 - s : s; };
        // h[s + 1] = state after scan step s; h[0] = h0.
        for (int64_t n = 0; n < N; ++n) h[n] = c.h0 ? x.h0.v[(b * c.dim + d) * N + n] : 0.0;
        for (int64_t s = 0; s < L; ++s) {
          const int64_t t = tm(s);
          double y = 0;
          for (int64_t n = 0; n < N; ++n) {
            a[s * N + n] = std::exp(dt[t] * x.A.v[d * N + n]);
            h[(s + 1) * N + n] = a[s * N + n] * h[s * N + n] + dt[t] * Bv(t, n) * x.u.v[row + t];
            y += Cv(t, n) * h[(s + 1) * N + n];
          }
          ysum[t] += y;
        }
        const std::vector<float>& dl = rev ? k.dlr : k.dlf;
        for (int64_t n = 0; n < N; ++n) g[n] = c.last ? dl[(b * c.dim + d) * N + n] : 0.0;
        for (int64_t s = L - 1; s >= 0; --s) {
          const int64_t t = tm(s);
          const double dy = dyf(t), uu = x.u.v[row + t];
          for (int64_t n = 0; n < N; ++n) {
            const double gi = g[n] + Cv(t, n) * dy;
            const double ah = a[s * N + n] * h[s * N + n];
            gr.A[d * N + n] += gi * dt[t] * ah;
            ddt[t] += gi * (x.A.v[d * N + n] * ah + uu * Bv(t, n));
            du[t] += gi * dt[t] * Bv(t, n);
            gr.B[bidx(t, n)] += gi * dt[t] * uu;
            gr.C[cidx(t, n)] += dy * h[(s + 1) * N + n];
            g[n] = a[s * N + n] * gi;
          }
        }
        if (c.h0)
          for (int64_t n = 0; n < N; ++n) gr.h0[(b * c.dim + d) * N + n] += g[n];
      }
      for (int64_t t = 0; t < L; ++t) {
        const double dy = dyf(t), uu = x.u.v[row + t];
        const double Dd = c.D ? x.D.v[d] : 0.0;
        gr.u[row + t] = du[t] + kD * Dd * dy;
        if (c.D) gr.D[d] += kD * dy * uu;
        if (c.z) {
          const double zz = x.z.v[row + t], s = sigmoid_d(zz);
          gr.z[row + t] = k.dout.v[row + t] * s * (1 + zz * (1 - s)) * (ysum[t] + kD * Dd * uu);
        }
        const double dd = ddt[t] * (c.softplus ? sigmoid_d(raw[t]) : 1.0);
        gr.delta[row + t] = dd;
        if (c.bias) gr.bias[d] += dd;
      }
    }
  return gr;
}

// The loss the backward differentiates, by the forward float64 reference.
double ref_loss(const Case& c, const Inputs& x, const Cot& k, SsDirection dir) {
  std::vector<double> out, lf, lr;
  if (dir == SsDirection::kForward || dir == SsDirection::kBidirectional) reference(c, x, false, out, lf, false);
  if (dir == SsDirection::kReverse) reference(c, x, true, out, lr, false);
  if (dir == SsDirection::kBidirectional) reference(c, x, true, out, lr, true);
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += out[i] * k.dout.v[i];
  if (c.last) {
    for (size_t i = 0; i < lf.size(); ++i) s += lf[i] * k.dlf[i];
    for (size_t i = 0; i < lr.size(); ++i) s += lr[i] * k.dlr[i];
  }
  return s;
}

// The float64 backward against central differences of the float64 forward (a few
// elements of every operand), so that the reference itself is checked.
void check_reference_bwd(const Case& c, uint32_t seed) {
  const Inputs x = make_inputs(c, seed);
  const Cot k = make_cot(c, seed);
  for (SsDirection dir : {SsDirection::kForward, SsDirection::kReverse, SsDirection::kBidirectional}) {
    const Grads gr = reference_bwd(c, x, k, dir);
    struct Op { const char* name; Arr Inputs::*arr; const std::vector<double> Grads::*g; };
    const Op ops[] = {{"u", &Inputs::u, &Grads::u}, {"delta", &Inputs::delta, &Grads::delta},
                      {"z", &Inputs::z, &Grads::z}, {"A", &Inputs::A, &Grads::A},
                      {"B", &Inputs::B, &Grads::B}, {"C", &Inputs::C, &Grads::C},
                      {"D", &Inputs::D, &Grads::D}, {"bias", &Inputs::bias, &Grads::bias},
                      {"h0", &Inputs::h0, &Grads::h0}};
    for (const Op& op : ops) {
      const std::vector<double>& gv = gr.*(op.g);
      for (size_t i = 0; i < gv.size(); i += 1 + gv.size() / 5) {
        Inputs xp = x, xm = x;
        const double e = 1e-6;
        (xp.*(op.arr)).v[i] += e;
        (xm.*(op.arr)).v[i] -= e;
        const double fd = (ref_loss(c, xp, k, dir) - ref_loss(c, xm, k, dir)) / (2 * e);
        CHECK(std::fabs(fd - gv[i]) <= 1e-6 * (1 + std::fabs(fd)), "reference backward d%s[%zu] dir %d: %.9g vs fd %.9g",
              op.name, i, int(dir), gv[i], fd);
      }
    }
  }
}

struct BwdOut {
  std::vector<float> u, delta, z, A, B, C, D, bias, h0;
};

// The gradients of u, delta and z go through 64-byte-aligned buffers (AVX-512 then stores
// their whole lines past the caches when L is a multiple of 16) or, with `misalign`, through
// buffers one float past such an address (plain stores); the tests compare the two.
struct LineBuf {
  std::vector<float> v;
  float* p;
  LineBuf(size_t n, bool misalign) : v(n + 32, NAN) {
    const uintptr_t a = (reinterpret_cast<uintptr_t>(v.data()) + 63) & ~uintptr_t(63);
    p = reinterpret_cast<float*>(a) + (misalign ? 1 : 0);
  }
};

BwdOut run_bwd(const Case& c, const Inputs& x, const Cot& k, SsDirection dir, const SsBwdTable& table,
               Executor& ex, const std::vector<float>* ckpt = nullptr, int64_t ckpt_row = 0,
               bool misalign = false) {
  SsBwdParams q{};
  if (ckpt != nullptr) {
    q.ckpt = ckpt->data();
    q.ckpt_row = ckpt_row;
  }
  SsParams& p = q.fwd;
  p.u = x.u.ptr(); p.u_t = x.u.t;
  p.delta = x.delta.ptr(); p.delta_t = x.delta.t;
  p.A = x.A.ptr(); p.A_t = x.A.t;
  p.B = x.B.ptr(); p.B_t = x.B.t; p.b_var = c.bg != 0;
  p.C = x.C.ptr(); p.C_t = x.C.t; p.c_var = c.cg != 0;
  p.D = x.D.ptr(); p.D_t = x.D.t;
  p.z = x.z.ptr(); p.z_t = x.z.t;
  p.delta_bias = x.bias.ptr(); p.delta_bias_t = x.bias.t;
  p.h0 = x.h0.ptr(); p.h0_t = x.h0.t;
  p.delta_softplus = c.softplus;
  p.direction = dir;
  p.batch = c.batch; p.dim = c.dim; p.dstate = c.N; p.length = c.L;
  p.b_groups = c.bg ? c.bg : 1;
  p.c_groups = c.cg ? c.cg : 1;
  q.dout = k.dout.ptr(); q.dout_t = k.dout.t;
  q.dlast_fwd = c.last ? k.dlf.data() : nullptr;
  q.dlast_rev = c.last ? k.dlr.data() : nullptr;
  BwdOut o;
  const size_t bdl = c.batch * c.dim * c.L;
  o.A.assign(c.dim * c.N, NAN); o.B.assign(x.B.v.size(), NAN); o.C.assign(x.C.v.size(), NAN);
  o.D.assign(c.D ? c.dim : 0, NAN); o.bias.assign(c.bias ? c.dim : 0, NAN);
  o.h0.assign(c.h0 ? c.batch * c.dim * c.N : 0, NAN);
  LineBuf du(bdl, misalign), ddelta(bdl, misalign), dz(c.z ? bdl : 0, misalign);
  q.du = du.p; q.ddelta = ddelta.p; q.dz = c.z ? dz.p : nullptr;
  q.dA = o.A.data(); q.dB = o.B.data(); q.dC = o.C.data();
  q.dD = c.D ? o.D.data() : nullptr; q.ddelta_bias = c.bias ? o.bias.data() : nullptr;
  q.dh0 = c.h0 ? o.h0.data() : nullptr;
  selective_scan_bwd_cpu(q, table, ex);
  o.u.assign(du.p, du.p + bdl);
  o.delta.assign(ddelta.p, ddelta.p + bdl);
  if (c.z) o.z.assign(dz.p, dz.p + bdl);
  return o;
}

bool same_bits(const BwdOut& a, const BwdOut& b) {
  auto eq = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), 4 * x.size()) == 0);
  };
  return eq(a.u, b.u) && eq(a.delta, b.delta) && eq(a.z, b.z) && eq(a.A, b.A) && eq(a.B, b.B) &&
         eq(a.C, b.C) && eq(a.D, b.D) && eq(a.bias, b.bias) && eq(a.h0, b.h0);
}

void run_bwd_case(const Case& c, const SsBwdTable& table, const SsTable& fwd, uint32_t seed) {
  const Inputs x = make_inputs(c, seed);
  const Cot k = make_cot(c, seed);
  InlineExecutor one;
  Threads three(3), four(4);
  // Relative to the largest |gradient| of each operand: float32 state and sums over L
  // (and batch, channels); 16-bit inputs are exact in the reference, so the same bound.
  const double tol = 1e-4;
  char what[256];
  std::snprintf(what, sizeof what,
                "bwd %s b%lld D%lld N%lld L%lld B%lld C%lld D%d z%d bias%d sp%d h0%d last%d io=%s st=%s",
                table.name, (long long)c.batch, (long long)c.dim, (long long)c.N, (long long)c.L,
                (long long)c.bg, (long long)c.cg, c.D, c.z, c.bias, c.softplus, c.h0, c.last, tname(c.io),
                tname(c.state_in));
  for (SsDirection dir : {SsDirection::kForward, SsDirection::kReverse, SsDirection::kBidirectional}) {
    const Grads want = reference_bwd(c, x, k, dir);
    const BwdOut got = run_bwd(c, x, k, dir, table, one);
    double e;
    const char* names[] = {"u", "delta", "z", "A", "B", "C", "D", "delta_bias", "h0"};
    const std::vector<float>* gs[] = {&got.u, &got.delta, &got.z, &got.A, &got.B, &got.C, &got.D, &got.bias, &got.h0};
    const std::vector<double>* ws[] = {&want.u, &want.delta, &want.z, &want.A, &want.B, &want.C, &want.D, &want.bias, &want.h0};
    for (int i = 0; i < 9; ++i) {
      CHECK(gs[i]->size() == ws[i]->size(), "%s dir %d d%s size", what, int(dir), names[i]);
      if (gs[i]->size() != ws[i]->size() || ws[i]->empty()) continue;
      // dD and ddelta_bias are single sums of batch * L terms of both signs (|sum| ~ sqrt(L)
      // while sum |terms| ~ L): relative to the result their error is ~sqrt(L) larger
      // (generic backend: silu without fma, <= 45 ULP, shows it at L = 4099).
      const double t_i = (i == 6 || i == 7) ? 3 * tol : tol;
      CHECK((e = rel_err(*gs[i], *ws[i])) <= t_i, "%s dir %d d%s rel err %.3g", what, int(dir), names[i], e);
    }
    // Deterministic: bitwise the same on 3 and 4 threads as on one (fixed-order sums).
    const BwdOut g3 = run_bwd(c, x, k, dir, table, three);
    const BwdOut g4 = run_bwd(c, x, k, dir, table, four);
    CHECK(same_bits(got, g3) && same_bits(got, g4), "%s dir %d: threads change the gradients", what, int(dir));
    // Gradient rows on 64-byte lines (streamed past the caches where whole lines are written)
    // or not: the same bits.
    CHECK(same_bits(got, run_bwd(c, x, k, dir, table, one, nullptr, 0, true)),
          "%s dir %d: misaligned gradient buffers change the gradients", what, int(dir));
    // Bidirectional: the forward half reads the reverse half's kept exp(delta A) for the last
    // blocks; none, one, all but one or all kept give the same bits.
    if (dir == SsDirection::kBidirectional) {
      const int64_t block_bytes = table.lanes * c.N * table.lanes * 4, nb = (c.L + table.lanes - 1) / table.lanes;
      for (int64_t kb : {int64_t(0), int64_t(1), nb - 1, nb + 1}) {
        if (kb < 0) continue;
        setenv("JAX_SELSCAN_SS_DA_BYTES", std::to_string(kb * block_bytes).c_str(), 1);
        CHECK(same_bits(got, run_bwd(c, x, k, dir, table, one)), "%s bidi backward keeping dA of %lld of %lld blocks",
              what, (long long)kb, (long long)nb);
      }
      unsetenv("JAX_SELSCAN_SS_DA_BYTES");
    }
    // The forward's checkpoints (SsParams::ckpt) instead of the sweep: the same bits. On one
    // thread every channel-path row is written (along-L tasks leave theirs unwritten); on
    // four threads the L split may leave all unwritten (the backward then sweeps).
    const int64_t row = ss_ckpt_row(table.lanes, c.N, c.L, dir);
    std::vector<float> ck;
    run(c, x, dir, fwd, one, &ck, row);
    int64_t x0 = c.dim / (c.bg ? c.bg : 1), y0 = c.dim / (c.cg ? c.cg : 1);
    while (y0 != 0) { const int64_t r = x0 % y0; x0 = y0; y0 = r; }
    const int64_t lanes = table.lanes;
    const bool narrow = ss_use_narrow(lanes, std::min(lanes, x0), c.L) ||
                        (x0 % lanes != 0 && ss_use_narrow(lanes, x0 % lanes, c.L));
    int64_t flagged = 0;
    for (int64_t i = 0; i < c.batch * c.dim; ++i) flagged += ck[i * row] == static_cast<float>(lanes);
    CHECK(narrow || c.L == 0 || flagged == c.batch * c.dim, "%s dir %d: %lld of %lld checkpoint rows written", what,
          int(dir), (long long)flagged, (long long)(c.batch * c.dim));
    CHECK(same_bits(got, run_bwd(c, x, k, dir, table, one, &ck, row)), "%s dir %d: checkpoints change the gradients",
          what, int(dir));
    run(c, x, dir, fwd, four, &ck, row);
    CHECK(same_bits(got, run_bwd(c, x, k, dir, table, four, &ck, row)),
          "%s dir %d: checkpoints (4 threads) change the gradients", what, int(dir));
    // A row length of another ISA: nothing written, the sweep runs.
    std::vector<float> bad;
    run(c, x, dir, fwd, one, &bad, row + 1);
    for (int64_t i = 0; i < c.batch * c.dim; ++i) CHECK(bad[i * (row + 1)] == 0.0f, "%s: wrong row written", what);
    CHECK(same_bits(got, run_bwd(c, x, k, dir, table, one, &bad, row + 1)), "%s dir %d: bad checkpoints used", what,
          int(dir));
  }
  // Forced L split (pieces of >= 64 steps) on 3 and 7 threads when there are fewer tasks
  // than threads: every gradient against the float64 reference at the same tolerances,
  // with the backward's own sweep and with the forward's checkpoints (written unsplit);
  // bit-reproducible for a given thread count; differing (by rounding) from one thread,
  // which shows the split ran.
  if (c.L >= 128) {
    int64_t x0 = c.dim / (c.bg ? c.bg : 1), y0 = c.dim / (c.cg ? c.cg : 1);
    while (y0 != 0) { const int64_t r = x0 % y0; x0 = y0; y0 = r; }
    const int64_t tasks = c.batch * (c.dim / x0) * ((x0 + table.lanes - 1) / table.lanes);
    const bool big = c.batch * c.dim * c.L * c.N >= (int64_t(1) << 16);
    setenv("JAX_SELSCAN_SS_PIECE_STEPS", "64", 1);
    for (int nt : {3, 7}) {
      Threads th(nt);
      for (SsDirection dir : {SsDirection::kForward, SsDirection::kReverse, SsDirection::kBidirectional}) {
        const Grads want = reference_bwd(c, x, k, dir);
        const BwdOut one_t = run_bwd(c, x, k, dir, table, one);
        const BwdOut got = run_bwd(c, x, k, dir, table, th);
        const int64_t row = ss_ckpt_row(table.lanes, c.N, c.L, dir);
        std::vector<float> ck;
        run(c, x, dir, fwd, one, &ck, row);
        const BwdOut got_ck = run_bwd(c, x, k, dir, table, th, &ck, row);
        const char* names[] = {"u", "delta", "z", "A", "B", "C", "D", "delta_bias", "h0"};
        for (const BwdOut* o : {&got, &got_ck}) {
          const std::vector<float>* gs[] = {&o->u, &o->delta, &o->z, &o->A, &o->B, &o->C, &o->D, &o->bias, &o->h0};
          const std::vector<double>* ws[] = {&want.u, &want.delta, &want.z, &want.A, &want.B,
                                             &want.C, &want.D, &want.bias, &want.h0};
          for (int i = 0; i < 9; ++i) {
            if (gs[i]->size() != ws[i]->size() || ws[i]->empty()) continue;
            const double t_i = (i == 6 || i == 7) ? 3 * tol : tol;
            double e;
            CHECK((e = rel_err(*gs[i], *ws[i])) <= t_i, "%s split %d threads%s dir %d d%s rel err %.3g", what, nt,
                  o == &got ? "" : " (checkpoints)", int(dir), names[i], e);
          }
        }
        CHECK(same_bits(got, run_bwd(c, x, k, dir, table, th)), "%s split %d threads dir %d: not reproducible", what,
              nt, int(dir));
        if (tasks < nt && big) {
          ++g_split_runs;
          CHECK(!same_bits(got, one_t), "%s %d threads dir %d: no L split (bitwise one thread's)", what, nt, int(dir));
        } else {
          CHECK(same_bits(got, one_t), "%s %d threads dir %d (no split): differs from one thread", what, nt, int(dir));
        }
      }
    }
    unsetenv("JAX_SELSCAN_SS_PIECE_STEPS");
  }
}
}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const SsType F = SsType::kF32, H = SsType::kBF16, S = SsType::kF16;
  std::vector<Case> cases = {
      // batch, dim, N, L, bg, cg, D, z, bias, softplus, h0, last, io, state
      {1, 1, 1, 1, 1, 1, true, true, true, true, true, true, F, F},
      {2, 4, 3, 7, 2, 1, true, true, true, true, true, true, F, F},
      {2, 17, 16, 33, 1, 1, true, true, true, true, true, true, F, F},
      {1, 37, 5, 101, 0, 0, true, false, true, true, false, true, F, F},
      {3, 20, 4, 64, 0, 4, false, true, false, false, true, true, F, F},
      {2, 48, 16, 130, 3, 0, true, true, true, true, true, true, F, F},
      {1, 64, 16, 257, 1, 2, true, true, true, true, true, true, F, F},
      {2, 24, 2, 19, 4, 2, true, true, true, true, true, true, H, F},
      {2, 24, 16, 50, 1, 1, true, true, true, true, true, true, H, H},
      {1, 33, 8, 47, 1, 1, true, true, true, true, true, true, S, S},
      {2, 16, 16, 31, 2, 2, false, false, false, true, false, false, F, H},
      {1, 8, 16, 0, 1, 1, true, true, true, true, true, true, F, F},  // L = 0
      // Narrow tasks (few channels, long L): vectorised along L in segments.
      {1, 1, 1, 1031, 1, 1, true, true, true, true, true, true, F, F},
      {2, 3, 4, 1300, 3, 0, true, true, true, true, true, true, F, F},
      {1, 2, 16, 4100, 0, 2, true, false, true, false, true, true, F, F},
      {1, 1, 2, 1024, 1, 1, true, true, true, true, true, true, H, F},
      // Along-L path: L not a multiple of the chunk (scalar tail), N = 1 and 16,
      // invariant / variable / grouped B and C, 16-bit storage.
      {1, 1, 1, 4099, 1, 1, true, true, true, true, true, true, F, F},
      {1, 1, 16, 777, 0, 1, true, true, true, true, true, true, F, F},
      {3, 2, 3, 1111, 1, 2, true, false, true, true, true, true, H, F},
      {1, 2, 1, 2303, 2, 2, true, true, true, true, true, true, S, S},
      {2, 1, 5, 1500, 1, 0, false, true, false, false, true, true, F, F},
      // L split with windows that close (fast decay), channel tiles and along-L tasks.
      {1, 32, 16, 2000, 1, 1, true, true, true, true, true, true, F, F, true},
      {1, 1, 4, 3001, 1, 1, true, true, true, true, true, true, F, F, true},
      {1, 1, 1, 5003, 1, 1, true, true, true, true, true, true, F, F, true},
      {2, 1, 1, 2500, 1, 1, true, true, true, true, true, true, H, H, true},
      // The backward's L split (fewer tasks than threads): idle lanes with slow decay; short
      // pieces and slow decay (windows that do not close, large carries); fast decay with
      // N = 8, invariant B / C; no softplus / D / z / h0.
      {1, 3, 16, 1500, 1, 1, true, true, true, true, true, true, F, F},
      {1, 16, 16, 400, 1, 2, true, true, true, true, true, true, F, F, false, true},
      {1, 5, 8, 2100, 0, 0, true, true, true, true, true, true, F, F, true},
      {1, 8, 4, 2500, 1, 1, false, false, false, false, false, true, F, F, false, true},
      // Many channels per group: more tiles than the backward's slabs (several tiles
      // summing into one dB / dC partial).
      {1, 600, 4, 37, 1, 1, true, true, true, true, true, true, F, F},
  };
  if (!quick) {
    cases.push_back({2, 96, 16, 1023, 1, 1, true, true, true, true, true, true, F, F});
    cases.push_back({1, 40, 16, 4099, 2, 2, true, true, true, true, true, true, F, F});
  }
  // Scratch that cannot be allocated throws (the FFI handlers turn it into an error) rather than
  // handing a kernel a null buffer.
  {
    bool threw = false;
    try {
      alloc_floats(int64_t(1) << 60);
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    CHECK(threw, "alloc_floats of 2^62 bytes did not throw std::bad_alloc");
  }
  // The float64 backward reference against central differences (tiny cases, all options).
  for (const Case& c : {Case{2, 4, 3, 7, 2, 1, true, true, true, true, true, true, F, F},
                        Case{1, 3, 2, 5, 0, 0, true, true, false, false, true, true, F, F},
                        Case{2, 2, 2, 6, 1, 2, false, false, true, true, false, true, F, F}})
    check_reference_bwd(c, 99);
  for (const KernelTable* k : supported_kernel_tables()) {
    if (!test::isa_selected(k->name)) {
      std::printf("%-8s not tested (JSS_TEST_ISAS)\n", k->name);
      continue;
    }
    const SsTable* t = ss_table_named(k->name);
    if (t == nullptr) { CHECK(false, "no selective-scan table for %s", k->name); continue; }
    const int before = g_failures;
    uint32_t seed = 1;
    for (const Case& c : cases) run_case(c, *t, seed++);
    const SsBwdTable* bt = ss_bwd_table_named(k->name);
    if (bt == nullptr) { CHECK(false, "no selective-scan backward table for %s", k->name); continue; }
    seed = 1;
    g_split_runs = 0;
    for (const Case& c : cases) run_bwd_case(c, *bt, *t, seed++);
    CHECK(g_split_runs >= 12, "%s: only %d backward calls ran the L split", t->name, g_split_runs);
    std::printf("%-8s (%d lanes): %s (%d split backward calls)\n", t->name, t->lanes,
                g_failures == before ? "ok" : "FAILED", g_split_runs);
  }
  std::printf("%d checks, %d failures\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
