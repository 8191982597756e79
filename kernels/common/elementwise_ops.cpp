// The element-wise rules' entries of OptimizerKernels (optimizer_kernels.h): each forms its rule's
// scalars on the host (optim_math) and hands its tensors to the backend's one element-wise op.
#include "dtype_dispatch.h"
#include "elementwise_rules.h"
#include "multinorm/optimizer_kernels.h"
#include "optim_math.h"

#include <vector>

namespace multinorm {

namespace {
ElementwiseArgs elementwise_args(const RuleScalars& rule, const WriteBack& write, ScalarsRef scalars) { return {rule, write, scalars}; }
}  // namespace

void OptimizerKernels::adam_update(Buf w, Buf g, Buf m, Buf v, int64_t n, const AdamArgs& args, int64_t cols) {
  const AdamTensor t{w, g, m, v, n, args.write.tensor, cols};
  adam_update_many(&t, 1, args);
}

void OptimizerKernels::adam_update_many(const AdamTensor* tensors, int64_t count, const AdamArgs& args) {
  std::vector<ElementwiseTensor> items;
  items.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const AdamTensor& t = tensors[i];
    dispatch::same_dtype({t.m, t.v}, "adam_update states");
    items.push_back({t.w, t.g, {t.m, t.v}, 2, t.n, t.tensor, t.cols});
  }
  elementwise_update_many(ElementwiseKind::Adam, items.data(), count, elementwise_args(optim_math::rule_scalars(args), args.write, args.scalars));
}

void OptimizerKernels::sgd_update(Buf w, Buf g, Buf momentum_buf, int64_t n, const SgdArgs& args, int64_t cols) {
  const ElementwiseTensor t{w, g, {momentum_buf, Buf{}}, momentum_buf.ptr ? 1 : 0, n, args.write.tensor, cols};
  elementwise_update_many(ElementwiseKind::Sgd, &t, 1, elementwise_args(optim_math::rule_scalars(args), args.write, args.scalars));
}

}  // namespace multinorm
