// XLA FFI handler for selective_scan on CPU (registered by ffi_module.cc).
//
//   jax_selscan_selective_scan
//     args:  u, delta (batch, D, L); A (D, N); B, C ((D, N) or (batch, G, N, L));
//            D (D,); z (batch, D, L); delta_bias (D,); h0 (batch, D, N)
//            (absent optional arguments: any buffer, with has_* = false)
//     rets:  out (batch, D, L) in u's dtype;
//            last_fwd, last_rev: (batch, D, N) float32, or zero-size when not wanted
//     attrs: delta_softplus (bool), direction (int64: 0 forward, 1 reverse,
//            2 bidirectional), has_D, has_z, has_delta_bias, has_h0 (bool)
//
//   jax_selscan_selective_scan_ckpt (the forward under differentiation)
//     as jax_selscan_selective_scan, with a fourth result: the checkpoints for the
//     backward, float32 (batch, D, K) (layout: SsParams::ckpt, K = ss_ckpt_row(lanes,
//     N, L, direction) for the ISA in use; any other K: every row flagged unwritten).
//   dtypes: float32, bfloat16, float16 for every array (mixed allowed); float32 state.
//
//   jax_selscan_selective_scan_bwd_cpu
//     args:  the nine above, then dout (u's shape, float32/bfloat16/float16),
//            dlast_fwd, dlast_rev ((batch, D, N) float32, or zero-size: zero),
//            ckpt (the forward's checkpoints (batch, D, K), or zero-size: the
//            backward runs its own checkpoint sweep)
//     rets:  du, ddelta, dz, dA, dB, dC, dD, ddelta_bias, dh0, all float32 in the
//            operands' shapes (absent operands: zero-size placeholders)
//     attrs: as the forward. Gradients summed over channels / batch / time are
//            reduced in a fixed order (bitwise independent of the thread count).
//
// Threads: XLA's intra-op pool (the calling thread plus at most
// num_threads - 1 pool tasks); JAX_SELSCAN_CPU_THREADS=k (read on every call)
// caps that at k (for scaling measurements; 0 or unset: no cap).
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "selective_scan_bwd_cpu.h"
#include "selective_scan_cpu.h"
#include "huge_pages.h"
#include "../ffi_common/selective_scan_binding.h"
#include "pool_executor.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_selscan {
namespace {

bool ss_type(ffi::DataType t, SsType* out) {
  switch (t) {
    case ffi::F32: *out = SsType::kF32; return true;
    case ffi::BF16: *out = SsType::kBF16; return true;
    case ffi::F16: *out = SsType::kF16; return true;
    default: return false;
  }
}

int64_t numel(const ffi::AnyBuffer& x) {
  int64_t n = 1;
  for (int64_t d : x.dimensions()) n *= d;
  return n;
}

bool dims_are(const ffi::AnyBuffer& x, std::initializer_list<int64_t> want) {
  auto d = x.dimensions();
  if (d.size() != want.size()) return false;
  size_t i = 0;
  for (int64_t w : want)
    if (d[i++] != w) return false;
  return true;
}

// The forward's inputs and options as SsParams (out / last_* left null); an error
// message, or "" when they are valid.
std::string parse_inputs(const ffi::AnyBuffer& u, const ffi::AnyBuffer& delta, const ffi::AnyBuffer& A,
                         const ffi::AnyBuffer& B, const ffi::AnyBuffer& C, const ffi::AnyBuffer& D,
                         const ffi::AnyBuffer& z, const ffi::AnyBuffer& delta_bias,
                         const ffi::AnyBuffer& h0, bool delta_softplus, int64_t direction, bool has_D,
                         bool has_z, bool has_delta_bias, bool has_h0, SsParams& p) {
  auto bad = [](const std::string& m) { return m; };
  if (u.dimensions().size() != 3) return bad("u must be (batch, D, L)");
  const int64_t batch = u.dimensions()[0], dim = u.dimensions()[1], length = u.dimensions()[2];
  if (A.dimensions().size() != 2 || A.dimensions()[0] != dim) return bad("A must be (D, N)");
  const int64_t dstate = A.dimensions()[1];
  if (direction < 0 || direction > 2) return bad("direction must be 0, 1 or 2");
  p = SsParams{};
  struct In { const ffi::AnyBuffer* buf; bool present; const void** ptr; SsType* type; const char* name; };
  In ins[] = {{&u, true, &p.u, &p.u_t, "u"},
              {&delta, true, &p.delta, &p.delta_t, "delta"},
              {&A, true, &p.A, &p.A_t, "A"},
              {&B, true, &p.B, &p.B_t, "B"},
              {&C, true, &p.C, &p.C_t, "C"},
              {&D, has_D, &p.D, &p.D_t, "D"},
              {&z, has_z, &p.z, &p.z_t, "z"},
              {&delta_bias, has_delta_bias, &p.delta_bias, &p.delta_bias_t, "delta_bias"},
              {&h0, has_h0, &p.h0, &p.h0_t, "h0"}};
  for (In& in : ins) {
    *in.type = SsType::kF32;
    *in.ptr = nullptr;
    if (!in.present) continue;
    if (!ss_type(in.buf->element_type(), in.type))
      return bad(std::string(in.name) + ": unsupported dtype (float32, bfloat16, float16)");
    *in.ptr = in.buf->untyped_data();
  }
  if (!dims_are(delta, {batch, dim, length})) return bad("delta must have u's shape");
  if (has_z && !dims_are(z, {batch, dim, length})) return bad("z must have u's shape");
  if (has_D && !dims_are(D, {dim})) return bad("D must be (D,)");
  if (has_delta_bias && !dims_are(delta_bias, {dim})) return bad("delta_bias must be (D,)");
  if (has_h0 && !dims_are(h0, {batch, dim, dstate})) return bad("h0 must be (batch, D, N)");
  auto bc = [&](const ffi::AnyBuffer& x, bool* var, int64_t* groups, const char* name) -> std::string {
    *groups = 1;
    auto d = x.dimensions();
    if (d.size() == 2 && d[0] == dim && d[1] == dstate) { *var = false; return ""; }
    if (d.size() == 4 && d[0] == batch && d[2] == dstate && d[3] == length && d[1] > 0 &&
        dim % d[1] == 0) {
      *var = true;
      *groups = d[1];
      return "";
    }
    return std::string(name) + " must be (D, N) or (batch, G, N, L) with G dividing D";
  };
  p.b_var = false;
  p.c_var = false;
  if (std::string e = bc(B, &p.b_var, &p.b_groups, "B"); !e.empty()) return bad(e);
  if (std::string e = bc(C, &p.c_var, &p.c_groups, "C"); !e.empty()) return bad(e);
  p.delta_softplus = delta_softplus;
  p.direction = static_cast<SsDirection>(direction);
  p.batch = batch;
  p.dim = dim;
  p.dstate = dstate;
  p.length = length;
  return "";
}

// ckpt: the checkpoints result of jax_selscan_selective_scan_ckpt, or null.
ffi::Error SelectiveScanCommon(ffi::ThreadPool& pool, ffi::AnyBuffer u, ffi::AnyBuffer delta,
                               ffi::AnyBuffer A, ffi::AnyBuffer B, ffi::AnyBuffer C,
                               ffi::AnyBuffer D, ffi::AnyBuffer z, ffi::AnyBuffer delta_bias,
                               ffi::AnyBuffer h0, ffi::Result<ffi::AnyBuffer>& out,
                               ffi::Result<ffi::AnyBuffer>& last_fwd,
                               ffi::Result<ffi::AnyBuffer>& last_rev, ffi::AnyBuffer* ckpt,
                               bool delta_softplus, int64_t direction, bool has_D, bool has_z,
                               bool has_delta_bias, bool has_h0) {
  const std::string where = "jax_selscan selective_scan (CPU): ";
  auto bad = [&](const std::string& m) { return ffi::Error::InvalidArgument(where + m); };
  SsParams p;
  if (std::string e = parse_inputs(u, delta, A, B, C, D, z, delta_bias, h0, delta_softplus, direction, has_D,
                                   has_z, has_delta_bias, has_h0, p);
      !e.empty())
    return bad(e);
  const int64_t batch = p.batch, dim = p.dim, dstate = p.dstate, length = p.length;
  if (!ss_type(out->element_type(), &p.out_t)) return bad("out: unsupported dtype");
  if (!dims_are(*out, {batch, dim, length})) return bad("out must have u's shape");
  p.out = out->untyped_data();
  p.last_fwd = nullptr;
  p.last_rev = nullptr;
  for (auto [res, dst] : {std::pair{&*last_fwd, &p.last_fwd}, std::pair{&*last_rev, &p.last_rev}}) {
    if (numel(*res) == 0) continue;
    if (res->element_type() != ffi::F32 || !dims_are(*res, {batch, dim, dstate}))
      return bad("last states must be float32 (batch, D, N) or zero-size");
    *dst = static_cast<float*>(res->untyped_data());
  }
  p.ckpt = nullptr;
  p.ckpt_row = 0;
  if (ckpt != nullptr && numel(*ckpt) != 0) {
    auto cd = ckpt->dimensions();
    if (ckpt->element_type() != ffi::F32 || cd.size() != 3 || cd[0] != batch || cd[1] != dim || cd[2] < 1)
      return bad("checkpoints must be float32 (batch, D, K >= 1) or zero-size");
    p.ckpt = static_cast<float*>(ckpt->untyped_data());
    p.ckpt_row = cd[2];
  }
  std::string error;
  const SsTable* table = select_ss_table(&error);
  if (table == nullptr) return bad(error);
  PoolExecutor executor(pool, "JAX_SELSCAN_CPU_THREADS");
  prepare_output(p.out, out->size_bytes(), executor);
  if (p.ckpt != nullptr) prepare_output(p.ckpt, ckpt->size_bytes(), executor);
  try {
    selective_scan_cpu(p, *table, executor);
  } catch (const std::bad_alloc&) {
    return scratch_exhausted(where);
  }
  return ffi::Error::Success();
}

ffi::Error SelectiveScanImpl(ffi::ThreadPool pool, ffi::AnyBuffer u, ffi::AnyBuffer delta,
                             ffi::AnyBuffer A, ffi::AnyBuffer B, ffi::AnyBuffer C,
                             ffi::AnyBuffer D, ffi::AnyBuffer z, ffi::AnyBuffer delta_bias,
                             ffi::AnyBuffer h0, ffi::Result<ffi::AnyBuffer> out,
                             ffi::Result<ffi::AnyBuffer> last_fwd,
                             ffi::Result<ffi::AnyBuffer> last_rev, bool delta_softplus,
                             int64_t direction, bool has_D, bool has_z, bool has_delta_bias,
                             bool has_h0) {
  return SelectiveScanCommon(pool, u, delta, A, B, C, D, z, delta_bias, h0, out, last_fwd, last_rev, nullptr,
                             delta_softplus, direction, has_D, has_z, has_delta_bias, has_h0);
}

ffi::Error SelectiveScanCkptImpl(ffi::ThreadPool pool, ffi::AnyBuffer u, ffi::AnyBuffer delta,
                                 ffi::AnyBuffer A, ffi::AnyBuffer B, ffi::AnyBuffer C,
                                 ffi::AnyBuffer D, ffi::AnyBuffer z, ffi::AnyBuffer delta_bias,
                                 ffi::AnyBuffer h0, ffi::Result<ffi::AnyBuffer> out,
                                 ffi::Result<ffi::AnyBuffer> last_fwd,
                                 ffi::Result<ffi::AnyBuffer> last_rev, ffi::Result<ffi::AnyBuffer> ckpt,
                                 bool delta_softplus, int64_t direction, bool has_D, bool has_z,
                                 bool has_delta_bias, bool has_h0) {
  return SelectiveScanCommon(pool, u, delta, A, B, C, D, z, delta_bias, h0, out, last_fwd, last_rev, &*ckpt,
                             delta_softplus, direction, has_D, has_z, has_delta_bias, has_h0);
}

ffi::Error SelectiveScanBwdImpl(ffi::ThreadPool pool, ffi::AnyBuffer u, ffi::AnyBuffer delta,
                                ffi::AnyBuffer A, ffi::AnyBuffer B, ffi::AnyBuffer C,
                                ffi::AnyBuffer D, ffi::AnyBuffer z, ffi::AnyBuffer delta_bias,
                                ffi::AnyBuffer h0, ffi::AnyBuffer dout, ffi::AnyBuffer dlast_fwd,
                                ffi::AnyBuffer dlast_rev, ffi::AnyBuffer ckpt, ffi::Result<ffi::AnyBuffer> du,
                                ffi::Result<ffi::AnyBuffer> ddelta, ffi::Result<ffi::AnyBuffer> dz,
                                ffi::Result<ffi::AnyBuffer> dA, ffi::Result<ffi::AnyBuffer> dB,
                                ffi::Result<ffi::AnyBuffer> dC, ffi::Result<ffi::AnyBuffer> dD,
                                ffi::Result<ffi::AnyBuffer> ddelta_bias, ffi::Result<ffi::AnyBuffer> dh0,
                                bool delta_softplus, int64_t direction, bool has_D, bool has_z,
                                bool has_delta_bias, bool has_h0) {
  const std::string where = "jax_selscan selective_scan backward (CPU): ";
  auto bad = [&](const std::string& m) { return ffi::Error::InvalidArgument(where + m); };
  SsBwdParams q{};
  SsParams& p = q.fwd;
  if (std::string e = parse_inputs(u, delta, A, B, C, D, z, delta_bias, h0, delta_softplus, direction, has_D,
                                   has_z, has_delta_bias, has_h0, p);
      !e.empty())
    return bad(e);
  const int64_t batch = p.batch, dim = p.dim, dstate = p.dstate, length = p.length;
  if (!ss_type(dout.element_type(), &q.dout_t) || !dims_are(dout, {batch, dim, length}))
    return bad("dout must have u's shape (float32, bfloat16 or float16)");
  q.dout = dout.untyped_data();
  for (auto [buf, dst] : {std::pair{&dlast_fwd, &q.dlast_fwd}, std::pair{&dlast_rev, &q.dlast_rev}}) {
    *dst = nullptr;
    if (numel(*buf) == 0) continue;
    if (buf->element_type() != ffi::F32 || !dims_are(*buf, {batch, dim, dstate}))
      return bad("last-state cotangents must be float32 (batch, D, N) or zero-size");
    *dst = static_cast<const float*>(buf->untyped_data());
  }
  q.ckpt = nullptr;
  q.ckpt_row = 0;
  if (numel(ckpt) != 0) {
    auto cd = ckpt.dimensions();
    if (ckpt.element_type() != ffi::F32 || cd.size() != 3 || cd[0] != batch || cd[1] != dim || cd[2] < 1)
      return bad("checkpoints must be float32 (batch, D, K >= 1) or zero-size");
    q.ckpt = static_cast<const float*>(ckpt.untyped_data());
    q.ckpt_row = cd[2];
  }
  // Gradient buffers: float32, the operand's element count (null when absent).
  struct Out { ffi::AnyBuffer* res; bool present; const ffi::AnyBuffer* like; float** dst; const char* name; };
  Out outs[] = {{&*du, true, &u, &q.du, "du"},
                {&*ddelta, true, &delta, &q.ddelta, "ddelta"},
                {&*dz, has_z, &z, &q.dz, "dz"},
                {&*dA, true, &A, &q.dA, "dA"},
                {&*dB, true, &B, &q.dB, "dB"},
                {&*dC, true, &C, &q.dC, "dC"},
                {&*dD, has_D, &D, &q.dD, "dD"},
                {&*ddelta_bias, has_delta_bias, &delta_bias, &q.ddelta_bias, "ddelta_bias"},
                {&*dh0, has_h0, &h0, &q.dh0, "dh0"}};
  for (Out& o : outs) {
    *o.dst = nullptr;
    if (!o.present) continue;
    if (o.res->element_type() != ffi::F32 || numel(*o.res) != numel(*o.like))
      return bad(std::string(o.name) + " must be float32 with its operand's shape");
    *o.dst = static_cast<float*>(o.res->untyped_data());
  }
  std::string error;
  const SsBwdTable* table = select_ss_bwd_table(&error);
  if (table == nullptr) return bad(error);
  PoolExecutor executor(pool, "JAX_SELSCAN_CPU_THREADS");
  for (const Out& o : outs)
    if (*o.dst != nullptr) prepare_output(*o.dst, o.res->size_bytes(), executor);
  try {
    selective_scan_bwd_cpu(q, *table, executor);
  } catch (const std::bad_alloc&) {
    return scratch_exhausted(where);
  }
  return ffi::Error::Success();
}

// The handlers' shared operands and attributes (ffi_common/selective_scan_binding.h), with the
// thread pool as their context.
auto bind_ss_fwd() { return jss_ffi::bind_ss_fwd<ffi::ThreadPool>(); }
auto bind_ss_bwd() { return jss_ffi::bind_ss_bwd<ffi::ThreadPool>(); }
using jss_ffi::with_ss_attrs;

}  // namespace
}  // namespace jax_selscan

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxSelscanSelectiveScan, jax_selscan::SelectiveScanImpl,
                              jax_selscan::with_ss_attrs(jax_selscan::bind_ss_fwd()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxSelscanSelectiveScanCkpt, jax_selscan::SelectiveScanCkptImpl,
                              jax_selscan::with_ss_attrs(jax_selscan::bind_ss_fwd()
                                                             .Ret<ffi::AnyBuffer>()));  // ckpt

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxSelscanSelectiveScanBwd, jax_selscan::SelectiveScanBwdImpl,
                              jax_selscan::with_ss_attrs(jax_selscan::bind_ss_bwd()));
