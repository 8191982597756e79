// Dispatch from a buffer's runtime dtype to the storage type a templated kernel is instantiated
// for, shared by the CPU and CUDA backends (each passes its own BF16 type: multinorm::bf16 on the
// CPU, __nv_bfloat16 on CUDA).
#pragma once
#include <initializer_list>
#include <string>

#include "multinorm/backend.h"
#include "multinorm/error.h"

namespace multinorm::dispatch {

// Calls fn(T*) with a null pointer of the storage type: Bf16 or float.
template <class Bf16, class Fn>
void with_type(DType t, Fn&& fn) {
  if (t == DType::BF16) fn(static_cast<Bf16*>(nullptr));
  else fn(static_cast<float*>(nullptr));
}

// Calls fn(T*, G*) for a weight (or activation) dtype and a gradient dtype: the same dtype, or BF16
// with an FP32 gradient arena (precision.grads = fp32).
template <class Bf16, class Fn>
void with_types(DType t, DType g, const char* op, Fn&& fn) {
  if (t == g) return with_type<Bf16>(t, [&](auto* p) { fn(p, p); });
  if (t == DType::BF16 && g == DType::F32) return fn(static_cast<Bf16*>(nullptr), static_cast<float*>(nullptr));
  throw Error(std::string(op) + ": " + dtype_name(g) + " gradients of " + dtype_name(t) + " weights are not supported");
}

template <class T>
T* as(Buf b) {
  return static_cast<T*>(b.ptr);
}

inline void same_dtype(std::initializer_list<Buf> bufs, const char* op) {
  const DType t = bufs.begin()->dtype;
  for (const Buf& b : bufs)
    if (b.dtype != t) throw Error(std::string(op) + ": buffers must share a dtype");
}

}  // namespace multinorm::dispatch
