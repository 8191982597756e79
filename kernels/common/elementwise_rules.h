// The element-wise optimizers: each one's step on one element, in FP32, and the one list the CPU's
// and the CUDA backend's generic kernels (kernels/cpu/elementwise.cpp, kernels/cuda/elementwise.cu),
// the op's dispatch and the cost recorder are made from. A new element-wise optimizer is a Step here,
// a line in the list (and its ElementwiseKind), and its TensorRule (src/optim/).
//
// A Step reads the element's weight, gradient and NS state values (NS: the tensor's state count,
// kStates or fewer where a rule keeps a state only sometimes) and returns the new weight; it updates
// the states in place. The caller rounds the weight per WriteBack and the states to their dtype.
// The scalars are the update's RuleScalars (update_scalars.h), formed on the host.
#pragma once
#include "host_device.h"
#include "optim_math.h"

namespace multinorm::elementwise {

// Adam/AdamW (torch semantics; optim_math::adam_element): states m, v.
struct AdamStep {
  static constexpr int kStates = 2;
  static constexpr double kFlops = 15;  // per element, for the cost model
  template <int NS>
  MN_HOST_DEVICE static float apply(float w, float g, float* s, const RuleScalars& r) {
    static_assert(NS == 2, "Adam keeps m and v");
    return optim_math::adam_element(w, g, s[0], s[1], r.adam);
  }
};

// SGD (torch.optim.SGD, dampening 0): buf = momentum buf + g, w <- w (1 - lr wd) - lr buf; no state
// (NS = 0) when the momentum is 0.
struct SgdStep {
  static constexpr int kStates = 1;
  static constexpr double kFlops = 3;
  template <int NS>
  MN_HOST_DEVICE static float apply(float w, float g, float* s, const RuleScalars& r) {
    float d = g;
    if constexpr (NS > 0) {
      d = r.momentum * s[0] + d;
      s[0] = d;
    }
    return w * r.keep - r.lr * d;
  }
};

// X(kind, Step, name of its kernel, of its multi-tensor kernel): every element-wise optimizer, once.
#define MULTINORM_ELEMENTWISE_RULES(X)                                    \
  X(ElementwiseKind::Adam, elementwise::AdamStep, "adam", "adam_many") \
  X(ElementwiseKind::Sgd, elementwise::SgdStep, "sgd", "sgd_many")

// The dtype of a tensor's states (its weights' where it keeps none).
inline DType state_dtype(const ElementwiseTensor& t) { return t.nstates > 0 ? t.states[0].dtype : t.w.dtype; }

// Whether a device runs `count` tensors in multi-tensor launches: more than one, all of one weight,
// gradient and state dtype and one state count. Otherwise a launch each (the CUDA backend, and the
// cost recorder that counts its launches).
inline bool in_multi_tensor_launches(const ElementwiseTensor* t, int64_t count) {
  for (int64_t i = 1; i < count; ++i)
    if (t[i].w.dtype != t[0].w.dtype || t[i].g.dtype != t[0].g.dtype || t[i].nstates != t[0].nstates || state_dtype(t[i]) != state_dtype(t[0]))
      return false;
  return count > 1;
}

static_assert(AdamStep::kStates <= kMaxElementwiseStates && SgdStep::kStates <= kMaxElementwiseStates, "ElementwiseTensor::states");

}  // namespace multinorm::elementwise
