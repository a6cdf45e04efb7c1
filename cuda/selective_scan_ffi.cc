// XLA FFI handlers of the CUDA selective scan.
//
//   jax_selscan_selective_scan_fwd (u, delta, A, B, C, D, z, delta_bias, h0)
//       -> (out, last_fwd, last_rev)
//   jax_selscan_selective_scan_fwd_ckpt (the same) -> (out, last_fwd, last_rev, ckpt):
//       also the states the backward needs, (batch, D, ss_ckpt_row) float32
//   jax_selscan_selective_scan_bwd (u, delta, A, B, C, D, z, delta_bias, h0, dout,
//                                   dlast_fwd, dlast_rev, ckpt)
//       (ckpt: the forward's, or a (0,) placeholder: the backward sweeps for them itself)
//       -> (du, ddelta, dz, dA, dB, dC, dD, ddelta_bias, dh0)
// Every handler has one more result, last: `scratch`, a 1-D uint8 buffer that Python sizes at
// trace time with selective_scan_scratch_bytes() (ffi_module.cc) plus 256 bytes of alignment
// slack, and drops (the L split's carries, the backward's dB / dC partials and checkpoint
// sweep, the bidirectional y). Nothing is allocated in the call, so the handlers are declared
// command-buffer (CUDA graph) compatible, and the scratch counts in XLA's memory analysis.
// attributes: delta_softplus (bool), direction (int64: 0 forward, 1 reverse,
// 2 bidirectional), has_D, has_z, has_delta_bias, has_h0 (bool).
// An absent operand or result is a placeholder of shape (0,). The Python lowering
// (jax_selscan/primitives.py) passes the activations (u, delta, z, varying B/C, dout) in
// one dtype (float32, bfloat16 or float16) and everything else in float32; the handler
// checks that and the shapes, and returns InvalidArgument otherwise.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "../ffi_common/selective_scan_binding.h"
#include "graph_capture.h"
#include "selective_scan.h"
#include "selective_scan_ffi.h"

namespace ffi = xla::ffi;

namespace {

bool act_dtype(ffi::DataType t, jss::SsDType* out) {
  switch (t) {
    case ffi::DataType::F32: *out = jss::SsDType::F32; return true;
    case ffi::DataType::BF16: *out = jss::SsDType::BF16; return true;
    case ffi::DataType::F16: *out = jss::SsDType::F16; return true;
    default: return false;
  }
}

bool dims_are(const ffi::AnyBuffer& x, std::initializer_list<int64_t> want) {
  auto d = x.dimensions();
  if (d.size() != want.size()) return false;
  size_t i = 0;
  for (int64_t w : want)
    if (d[i++] != w) return false;
  return true;
}

const float* f32_or_null(const ffi::AnyBuffer& x, bool present) {
  return present ? static_cast<const float*>(x.untyped_data()) : nullptr;
}

// Fills p from the nine operands; an error message names what is wrong.
std::string describe(const ffi::AnyBuffer& u, const ffi::AnyBuffer& delta, const ffi::AnyBuffer& A,
                     const ffi::AnyBuffer& B, const ffi::AnyBuffer& C, const ffi::AnyBuffer& D,
                     const ffi::AnyBuffer& z, const ffi::AnyBuffer& bias, const ffi::AnyBuffer& h0,
                     bool softplus, int64_t direction, bool has_D, bool has_z, bool has_bias,
                     bool has_h0, jss::SsProblem* p) {
  if (!act_dtype(u.element_type(), &p->t)) return "u must be float32, bfloat16 or float16";
  auto ud = u.dimensions();
  if (ud.size() != 3) return "u must be (batch, D, L)";
  p->batch = ud[0];
  p->dim = ud[1];
  p->L = ud[2];
  auto ad = A.dimensions();
  if (ad.size() != 2 || ad[0] != p->dim || A.element_type() != ffi::DataType::F32)
    return "A must be float32 (D, N)";
  p->N = ad[1];
  if (delta.element_type() != u.element_type() || !dims_are(delta, {p->batch, p->dim, p->L}))
    return "delta must match u";
  auto bc = [&](const ffi::AnyBuffer& x, int64_t* groups, const char* name) -> std::string {
    auto xd = x.dimensions();
    if (xd.size() == 2) {
      *groups = 0;
      if (x.element_type() != ffi::DataType::F32 || !dims_are(x, {p->dim, p->N}))
        return std::string(name) + " (time-invariant) must be float32 (D, N)";
      return "";
    }
    if (xd.size() != 4 || x.element_type() != u.element_type() || xd[0] != p->batch || xd[2] != p->N ||
        xd[3] != p->L || xd[1] < 1 || p->dim % xd[1])
      return std::string(name) + " must be (batch, G, N, L) in u's dtype";
    *groups = xd[1];
    return "";
  };
  std::string e = bc(B, &p->groups_b, "B");
  if (e.empty()) e = bc(C, &p->groups_c, "C");
  if (!e.empty()) return e;
  if (has_D && (D.element_type() != ffi::DataType::F32 || !dims_are(D, {p->dim}))) return "D must be float32 (D,)";
  if (has_z && (z.element_type() != u.element_type() || !dims_are(z, {p->batch, p->dim, p->L})))
    return "z must match u";
  if (has_bias && (bias.element_type() != ffi::DataType::F32 || !dims_are(bias, {p->dim})))
    return "delta_bias must be float32 (D,)";
  if (has_h0 && (h0.element_type() != ffi::DataType::F32 || !dims_are(h0, {p->batch, p->dim, p->N})))
    return "h0 must be float32 (batch, D, N)";
  if (direction < 0 || direction > 2) return "direction must be 0, 1 or 2";
  p->u = u.untyped_data();
  p->delta = delta.untyped_data();
  p->B = B.untyped_data();
  p->C = C.untyped_data();
  p->A = static_cast<const float*>(A.untyped_data());
  p->z = has_z ? z.untyped_data() : nullptr;
  p->Dskip = f32_or_null(D, has_D);
  p->delta_bias = f32_or_null(bias, has_bias);
  p->h0 = f32_or_null(h0, has_h0);
  p->softplus = softplus;
  p->direction = static_cast<int>(direction);
  if (!jss::ss_supported(*p)) return "unsupported size (needs batch, D, L >= 1 and 1 <= N <= 128)";
  return "";
}

float* f32_result(ffi::AnyBuffer& x) {
  return x.element_count() ? static_cast<float*>(x.untyped_data()) : nullptr;
}

ffi::Error check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string(what) + ": " + cudaGetErrorString(err));
}

// The 256-byte aligned start of XLA's scratch result for a plan needing `bytes` (null when 0),
// or an error if the buffer is smaller than the plan about to run (the plan read a different
// device or JAX_SELSCAN_SS_* variable at trace time): never write past it.
ffi::Error scratch_ptr(ffi::AnyBuffer& scratch, size_t bytes, const char* what, void** out) {
  *out = nullptr;
  if (!bytes) return ffi::Error::Success();
  const uintptr_t base = reinterpret_cast<uintptr_t>(scratch.untyped_data());
  const uintptr_t pad = (256 - base % 256) % 256;
  const size_t have = scratch.size_bytes();
  if (!base || have < pad || have - pad < bytes)
    return ffi::Error::InvalidArgument(
        std::string(what) + ": scratch result too small: " + std::to_string(have) + " bytes at offset " +
        std::to_string(pad) + " from 256-byte alignment, the launch needs " + std::to_string(bytes) +
        " (was the plan's device or a JAX_SELSCAN_SS_* variable changed after tracing?)");
  *out = reinterpret_cast<void*>(base + pad);
  return ffi::Error::Success();
}

ffi::Error FwdCore(cudaStream_t stream, ffi::AnyBuffer u, ffi::AnyBuffer delta, ffi::AnyBuffer A,
                   ffi::AnyBuffer B, ffi::AnyBuffer C, ffi::AnyBuffer D, ffi::AnyBuffer z,
                   ffi::AnyBuffer bias, ffi::AnyBuffer h0, ffi::AnyBuffer& out, ffi::AnyBuffer& last_f,
                   ffi::AnyBuffer& last_r, ffi::AnyBuffer* ckpt, ffi::AnyBuffer& scratch, bool softplus,
                   int64_t direction, bool has_D, bool has_z, bool has_bias, bool has_h0) {
  jss::SsProblem p;
  std::string e = describe(u, delta, A, B, C, D, z, bias, h0, softplus, direction, has_D, has_z,
                           has_bias, has_h0, &p);
  if (!e.empty()) return ffi::Error::InvalidArgument("selective_scan (CUDA): " + e);
  if (out.element_type() != u.element_type() || !dims_are(out, {p.batch, p.dim, p.L}))
    return ffi::Error::InvalidArgument("selective_scan (CUDA): out must match u");
  jss::SsForwardOut o;
  o.out = out.untyped_data();
  o.last_fwd = f32_result(last_f);
  o.last_rev = f32_result(last_r);
  if (ckpt) {
    if (ckpt->element_type() != ffi::DataType::F32 || !dims_are(*ckpt, {p.batch, p.dim, jss::ss_ckpt_row(p)}))
      return ffi::Error::InvalidArgument("selective_scan (CUDA): ckpt must be float32 (batch, D, ss_ckpt_row)");
    o.ckpt = static_cast<float*>(ckpt->untyped_data());
  }
  void* buf;
  ffi::Error se = scratch_ptr(scratch, jss::ss_forward_scratch_bytes(p), "selective_scan (CUDA)", &buf);
  if (se.failure()) return se;
  jss::note_capture(stream);
  return check(jss::ss_forward(p, o, buf, stream), "selective_scan forward (CUDA)");
}

ffi::Error FwdImpl(cudaStream_t stream, ffi::AnyBuffer u, ffi::AnyBuffer delta, ffi::AnyBuffer A,
                   ffi::AnyBuffer B, ffi::AnyBuffer C, ffi::AnyBuffer D, ffi::AnyBuffer z,
                   ffi::AnyBuffer bias, ffi::AnyBuffer h0, ffi::Result<ffi::AnyBuffer> out,
                   ffi::Result<ffi::AnyBuffer> last_f, ffi::Result<ffi::AnyBuffer> last_r,
                   ffi::Result<ffi::AnyBuffer> scratch, bool softplus, int64_t direction, bool has_D,
                   bool has_z, bool has_bias, bool has_h0) {
  return FwdCore(stream, u, delta, A, B, C, D, z, bias, h0, *out, *last_f, *last_r, nullptr, *scratch,
                 softplus, direction, has_D, has_z, has_bias, has_h0);
}

ffi::Error FwdCkptImpl(cudaStream_t stream, ffi::AnyBuffer u, ffi::AnyBuffer delta, ffi::AnyBuffer A,
                       ffi::AnyBuffer B, ffi::AnyBuffer C, ffi::AnyBuffer D, ffi::AnyBuffer z,
                       ffi::AnyBuffer bias, ffi::AnyBuffer h0, ffi::Result<ffi::AnyBuffer> out,
                       ffi::Result<ffi::AnyBuffer> last_f, ffi::Result<ffi::AnyBuffer> last_r,
                       ffi::Result<ffi::AnyBuffer> ckpt, ffi::Result<ffi::AnyBuffer> scratch, bool softplus,
                       int64_t direction, bool has_D, bool has_z, bool has_bias, bool has_h0) {
  return FwdCore(stream, u, delta, A, B, C, D, z, bias, h0, *out, *last_f, *last_r, &(*ckpt), *scratch,
                 softplus, direction, has_D, has_z, has_bias, has_h0);
}

ffi::Error BwdImpl(cudaStream_t stream, ffi::AnyBuffer u, ffi::AnyBuffer delta, ffi::AnyBuffer A,
                   ffi::AnyBuffer B, ffi::AnyBuffer C, ffi::AnyBuffer D, ffi::AnyBuffer z,
                   ffi::AnyBuffer bias, ffi::AnyBuffer h0, ffi::AnyBuffer dout,
                   ffi::AnyBuffer dlast_f, ffi::AnyBuffer dlast_r, ffi::AnyBuffer ckpt,
                   ffi::Result<ffi::AnyBuffer> du, ffi::Result<ffi::AnyBuffer> ddelta,
                   ffi::Result<ffi::AnyBuffer> dz, ffi::Result<ffi::AnyBuffer> dA,
                   ffi::Result<ffi::AnyBuffer> dB, ffi::Result<ffi::AnyBuffer> dC,
                   ffi::Result<ffi::AnyBuffer> dD, ffi::Result<ffi::AnyBuffer> dbias,
                   ffi::Result<ffi::AnyBuffer> dh0, ffi::Result<ffi::AnyBuffer> scratch, bool softplus,
                   int64_t direction, bool has_D, bool has_z, bool has_bias, bool has_h0) {
  jss::SsProblem p;
  std::string e = describe(u, delta, A, B, C, D, z, bias, h0, softplus, direction, has_D, has_z,
                           has_bias, has_h0, &p);
  if (!e.empty()) return ffi::Error::InvalidArgument("selective_scan backward (CUDA): " + e);
  if (dout.element_type() != u.element_type() || !dims_are(dout, {p.batch, p.dim, p.L}))
    return ffi::Error::InvalidArgument("selective_scan backward (CUDA): dout must match u");
  jss::SsBackwardIO io;
  io.dout = dout.untyped_data();
  auto last = [&](const ffi::AnyBuffer& x) -> const float* {
    return x.element_count() ? static_cast<const float*>(x.untyped_data()) : nullptr;
  };
  io.dlast_fwd = last(dlast_f);
  io.dlast_rev = last(dlast_r);
  if (ckpt.element_count()) {
    if (ckpt.element_type() != ffi::DataType::F32 || !dims_are(ckpt, {p.batch, p.dim, jss::ss_ckpt_row(p)}))
      return ffi::Error::InvalidArgument("selective_scan backward (CUDA): ckpt must be float32 (batch, D, ss_ckpt_row) or (0,)");
    io.ckpt = static_cast<const float*>(ckpt.untyped_data());
  }
  if ((io.dlast_fwd && !dims_are(dlast_f, {p.batch, p.dim, p.N})) ||
      (io.dlast_rev && !dims_are(dlast_r, {p.batch, p.dim, p.N})))
    return ffi::Error::InvalidArgument("selective_scan backward (CUDA): last-state cotangents must be (batch, D, N)");
  io.du = du->untyped_data();
  io.ddelta = ddelta->untyped_data();
  io.dz = has_z ? dz->untyped_data() : nullptr;
  io.dA = f32_result(*dA);
  // dB / dC in float32, or, for a varying B / C in u's 16-bit dtype, in that dtype (rounded
  // by the reduction that writes them)
  auto bc_grad = [&](ffi::Result<ffi::AnyBuffer>& g, const ffi::AnyBuffer& x, bool varying, bool* in_t) -> bool {
    *in_t = g->element_type() != ffi::DataType::F32;
    return !*in_t || (varying && x.element_type() == u.element_type() && g->element_type() == u.element_type());
  };
  if (!bc_grad(dB, B, p.groups_b != 0, &io.dB_in_t) || !bc_grad(dC, C, p.groups_c != 0, &io.dC_in_t))
    return ffi::Error::InvalidArgument(
        "selective_scan backward (CUDA): dB / dC must be float32, or a varying B / C's own dtype (u's)");
  io.dB = dB->untyped_data();
  io.dC = dC->untyped_data();
  io.dD = has_D ? f32_result(*dD) : nullptr;
  io.ddelta_bias = has_bias ? f32_result(*dbias) : nullptr;
  io.dh0 = has_h0 ? f32_result(*dh0) : nullptr;
  if (du->element_type() != u.element_type() || ddelta->element_type() != u.element_type() ||
      dA->element_count() != A.element_count() || dB->element_count() != B.element_count() ||
      dC->element_count() != C.element_count())
    return ffi::Error::InvalidArgument("selective_scan backward (CUDA): gradient buffers do not match the operands");
  void* buf;
  ffi::Error se = scratch_ptr(*scratch, jss::ss_backward_scratch_bytes(p, io.ckpt != nullptr),
                              "selective_scan backward (CUDA)", &buf);
  if (se.failure()) return se;
  jss::note_capture(stream);
  return check(jss::ss_backward(p, io, buf, stream), "selective_scan backward (CUDA)");
}

// The handlers' shared operands and attributes (ffi_common/selective_scan_binding.h), with the
// stream as their context. Each handler returns a scratch buffer last.
auto bind_ss_fwd() { return jss_ffi::bind_ss_fwd<ffi::PlatformStream<cudaStream_t>>(); }
auto bind_ss_bwd() { return jss_ffi::bind_ss_bwd<ffi::PlatformStream<cudaStream_t>>(); }
using jss_ffi::with_ss_attrs;

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssSelectiveScanFwdCuda, FwdImpl,
                              with_ss_attrs(bind_ss_fwd().Ret<ffi::AnyBuffer>()),  // scratch
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssSelectiveScanFwdCkptCuda, FwdCkptImpl,
                              with_ss_attrs(bind_ss_fwd()
                                                .Ret<ffi::AnyBuffer>()    // ckpt
                                                .Ret<ffi::AnyBuffer>()),  // scratch
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssSelectiveScanBwdCuda, BwdImpl,
                              with_ss_attrs(bind_ss_bwd().Ret<ffi::AnyBuffer>()),  // scratch
                              {ffi::Traits::kCmdBufferCompatible});
