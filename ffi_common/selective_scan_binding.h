// The selective-scan FFI handlers' shared operands and attributes, in the order
// jax_selscan/_ffi.py passes them (operands by position, attributes by name). Both extensions
// bind through these (cpu_arm/selective_scan_ffi.cc with a thread pool, cuda/selective_scan_ffi.cc
// with a CUDA stream as the context), so the contract is written once.
#pragma once

#include <cstdint>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace jss_ffi {

// The context, then u, delta, A, B, C, D, z, delta_bias, h0.
template <class Ctx>
auto bind_ss_operands() {
  return xla::ffi::Ffi::Bind()
      .Ctx<Ctx>()
      .template Arg<xla::ffi::AnyBuffer>()  // u
      .template Arg<xla::ffi::AnyBuffer>()  // delta
      .template Arg<xla::ffi::AnyBuffer>()  // A
      .template Arg<xla::ffi::AnyBuffer>()  // B
      .template Arg<xla::ffi::AnyBuffer>()  // C
      .template Arg<xla::ffi::AnyBuffer>()  // D
      .template Arg<xla::ffi::AnyBuffer>()  // z
      .template Arg<xla::ffi::AnyBuffer>()  // delta_bias
      .template Arg<xla::ffi::AnyBuffer>();  // h0
}

// The forward's operands and first results (an extension appends the rest it returns).
template <class Ctx>
auto bind_ss_fwd() {
  return bind_ss_operands<Ctx>()
      .template Ret<xla::ffi::AnyBuffer>()  // out
      .template Ret<xla::ffi::AnyBuffer>()  // last_fwd
      .template Ret<xla::ffi::AnyBuffer>();  // last_rev
}

// The backward's operands (the forward's, then dout, dlast_fwd, dlast_rev and ckpt, a (0,)
// placeholder when absent) and its gradients.
template <class Ctx>
auto bind_ss_bwd() {
  return bind_ss_operands<Ctx>()
      .template Arg<xla::ffi::AnyBuffer>()  // dout
      .template Arg<xla::ffi::AnyBuffer>()  // dlast_fwd
      .template Arg<xla::ffi::AnyBuffer>()  // dlast_rev
      .template Arg<xla::ffi::AnyBuffer>()  // ckpt
      .template Ret<xla::ffi::AnyBuffer>()  // du
      .template Ret<xla::ffi::AnyBuffer>()  // ddelta
      .template Ret<xla::ffi::AnyBuffer>()  // dz
      .template Ret<xla::ffi::AnyBuffer>()  // dA
      .template Ret<xla::ffi::AnyBuffer>()  // dB
      .template Ret<xla::ffi::AnyBuffer>()  // dC
      .template Ret<xla::ffi::AnyBuffer>()  // dD
      .template Ret<xla::ffi::AnyBuffer>()  // ddelta_bias
      .template Ret<xla::ffi::AnyBuffer>();  // dh0
}

// The attributes every selective-scan handler ends with.
template <class B>
auto with_ss_attrs(B b) {
  return std::move(b)
      .template Attr<bool>("delta_softplus")
      .template Attr<int64_t>("direction")
      .template Attr<bool>("has_D")
      .template Attr<bool>("has_z")
      .template Attr<bool>("has_delta_bias")
      .template Attr<bool>("has_h0");
}

}  // namespace jss_ffi
