// The linear-scan FFI handlers' shared operands and attributes, in the order
// jax_selscan/_ffi.py passes them (operands by position, attributes by name). Both extensions
// bind through these (cpu_arm/ffi_module.cc with a thread pool, cuda/ffi_module.cc with a CUDA
// stream as the context, which appends its scratch result), so the contract is written once.
#pragma once

#include <cstdint>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace jss_ffi {

// The context, then a, b, h0; the result h.
template <class Ctx>
auto bind_ls_operands() {
  return xla::ffi::Ffi::Bind()
      .Ctx<Ctx>()
      .template Arg<xla::ffi::AnyBuffer>()  // a
      .template Arg<xla::ffi::AnyBuffer>()  // b
      .template Arg<xla::ffi::AnyBuffer>()  // h0
      .template Ret<xla::ffi::AnyBuffer>();  // h
}

// The operands and results of both handlers: the _prod handler (kProd) also returns a_prod.
// (Each branch returns a fresh binding: a Binding cannot be moved out of a variable.)
template <class Ctx, bool kProd>
auto bind_ls() {
  if constexpr (kProd)
    return bind_ls_operands<Ctx>().template Ret<xla::ffi::AnyBuffer>();  // a_prod
  else
    return bind_ls_operands<Ctx>();
}

// The attributes every linear-scan handler ends with (algorithm: an index into
// primitives.ALGORITHMS; the CPU handlers ignore it).
template <class B>
auto with_ls_attrs(B b) {
  return std::move(b)
      .template Attr<int64_t>("axis")
      .template Attr<bool>("reverse")
      .template Attr<int64_t>("algorithm");
}

}  // namespace jss_ffi
