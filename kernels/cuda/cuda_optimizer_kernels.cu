// The CUDA backend's optimizer kernels (cuda_optimizer_kernels.h). Built twice, like the backend:
// by nvcc into the plugin and by g++ into the emulated build.
#include "cuda_optimizer_kernels.h"

#include <algorithm>
#include <string>

#include "../common/dtype_dispatch.h"
#include "../common/elementwise_rules.h"
#include "../common/optim_math.h"
#include "multinorm/cuda_scratch.h"
#include "multinorm/error.h"

namespace multinorm::cuda {

using dispatch::as;

namespace {
// The row stride a matrix's weight and gradient share: both live at one offset of their arenas, with
// one row stride (TensorSpec::arena_ld); n where the rows are dense.
int64_t same_rows(const Buf& w, const Buf& g, int64_t n, const char* op) {
  if (w.stride(n) != g.stride(n))
    throw Error(std::string(op) + ": a weight with rows of " + std::to_string(w.stride(n)) + " elements and its gradient with rows of " +
                std::to_string(g.stride(n)));
  return w.stride(n);
}
}  // namespace

CudaOptimizerKernels::CudaOptimizerKernels(CudaQueue& q, LtGemm& gemm, DescriptorCache& descriptors)
    : q_(&q), gemm_(&gemm), descriptors_(descriptors), reduce_scratch_(std::make_unique<Scratch>(q)), opt_scratch_(std::make_unique<Scratch>(q)),
      padded_scratch_(std::make_unique<Scratch>(q)), swan_staging_(std::make_unique<SwanStaging>(q)) {}

double CudaOptimizerKernels::sum_squares(Buf x, int64_t n) {
  auto* d = static_cast<double*>(scratch(reduce_scratch_, cuda_scratch::sum_squares_bytes(), "sum_squares"));
  dispatch::with_type<bf16>(x.dtype, [&](auto* t) { cuda::sum_squares(d, d + 1, as<std::remove_pointer_t<decltype(t)>>(x), n, q_->issue()); });
  double r = 0;
  q_->read(&r, d, sizeof(double), "sum_squares");
  return r;
}
// The per-tensor sums into `out`, their partials (kSumSquaresBlocks x count) in the reduce scratch:
// two launches for each run of tensors of one dtype.
void CudaOptimizerKernels::sum_squares_many(const Buf* xs, const int64_t* ns, int64_t count, double* out) {
  if (count == 0) return;
  auto* partials = static_cast<double*>(scratch(reduce_scratch_, cuda_scratch::sum_squares_many_bytes(count), "sum_squares_many"));
  for (int64_t begin = 0; begin < count;) {
    int64_t end = begin + 1;
    while (end < count && xs[end].dtype == xs[begin].dtype) ++end;
    sum_items_.clear();
    for (int64_t i = begin; i < end; ++i) sum_items_.push_back({xs[i].ptr, ns[i]});
    const auto* items = static_cast<const SumSquaresItem*>(descriptors(sum_items_.data(), sum_items_.size() * sizeof(SumSquaresItem), "sum_squares_many"));
    dispatch::with_type<bf16>(xs[begin].dtype, [&](auto* t) {
      cuda::sum_squares_many<std::remove_pointer_t<decltype(t)>>(out + begin, partials, items, end - begin, q_->issue());
    });
    begin = end;
  }
}
void CudaOptimizerKernels::update_statistics(UpdateScalars* s, const LossTotals* loss, const double* squares, int64_t count, double grad_clip) {
  cuda::update_statistics(s, loss, squares, count, grad_clip, q_->issue());
}
void CudaOptimizerKernels::clip_gradients(Buf x, int64_t n, const UpdateScalars* s) {
  dispatch::with_type<bf16>(x.dtype, [&](auto* t) { cuda::clip_gradients(as<std::remove_pointer_t<decltype(t)>>(x), n, s, q_->issue()); });
}
void CudaOptimizerKernels::scale(Buf x, int64_t n, float factor) {
  dispatch::with_type<bf16>(x.dtype, [&](auto* t) { cuda::scale(as<std::remove_pointer_t<decltype(t)>>(x), n, factor, q_->issue()); });
}
void CudaOptimizerKernels::sinkgd_update(Buf w, Buf g, int64_t m, int64_t n, const SinkGDArgs& a) {
  const SinkGDTensor t{w, g, m, n, a.write.tensor};
  sinkgd_update_many(&t, 1, a);
}
// The tensors in launches of cuda_scratch::sinkgd_many_launch_end's making (one launch per pass for
// all of a launch's tensors), each tensor with its own scratch; one dtype pair per launch.
void CudaOptimizerKernels::sinkgd_update_many(const SinkGDTensor* tensors, int64_t count, const SinkGDArgs& a) {
  const RuleScalars rule = optim_math::rule_scalars(a.lr, a.decoupled_decay);
  auto shape = [&](int64_t i) { return std::pair<int64_t, int64_t>{tensors[i].m, tensors[i].n}; };
  // The launches first, and the scratch grown once to the largest: a table built with the scratch's
  // address stays valid for the whole call (and the next update finds it in the descriptor cache).
  std::vector<std::pair<int64_t, int64_t>> launches;  // (end, floats) of each launch
  int64_t most = 0;
  for (int64_t begin = 0; begin < count;) {
    int64_t floats = 0;
    int64_t end = cuda_scratch::sinkgd_many_launch_end(begin, count, shape, &floats);
    for (int64_t i = begin + 1; i < end; ++i)  // a launch holds one dtype pair
      if (tensors[i].w.dtype != tensors[begin].w.dtype || tensors[i].g.dtype != tensors[begin].g.dtype) end = i, floats = -1;
    if (floats < 0) {  // cut short by a dtype: its own tensors' scratch
      floats = 0;
      for (int64_t i = begin; i < end; ++i) floats += sinkgd_scratch(tensors[i].m, tensors[i].n);
    }
    launches.emplace_back(end, floats);
    most = std::max(most, floats);
    begin = end;
  }
  float* const base = static_cast<float*>(scratch(opt_scratch_, static_cast<size_t>(most) * 4, "sinkgd_update_many"));
  for (int64_t begin = 0, l = 0; begin < count; ++l) {
    const int64_t end = launches[static_cast<size_t>(l)].first;
    float* uv = base;
    sinkgd_items_.clear();
    for (int64_t i = begin; i < end; ++i) {
      const SinkGDTensor& t = tensors[i];
      sinkgd_items_.push_back(cuda::sinkgd_item(t.w.ptr, t.g.ptr, t.m, t.n, same_rows(t.w, t.g, t.n, "sinkgd_update_many"), uv, t.tensor));
      uv += sinkgd_scratch(t.m, t.n);
    }
    const cuda::SinkgdLayout layout =
        cuda::sinkgd_layout(sinkgd_items_.data(), end - begin, dtype_bytes(tensors[begin].w.dtype), dtype_bytes(tensors[begin].g.dtype));
    const auto* dev = static_cast<const cuda::SinkgdManyItem*>(
        descriptors(sinkgd_items_.data(), sinkgd_items_.size() * sizeof(cuda::SinkgdManyItem), "sinkgd_update_many"));
    dispatch::with_types<bf16>(tensors[begin].w.dtype, tensors[begin].g.dtype, "sinkgd_update_many", [&](auto* t, auto* gt) {
      using T = std::remove_pointer_t<decltype(t)>;
      using G = std::remove_pointer_t<decltype(gt)>;
      cuda::sinkgd_many<T, G>(dev, end - begin, layout, a.iterations, a.eps, rule, a.write, a.scalars, q_->issue());
    });
    begin = end;
  }
}
// The tensors in chunks of cuda_scratch::swan_plan's making (one Gram size and dtype pair each),
// the scratch grown once to the largest chunk and the pinned staging to the largest exact-path group;
// a chunk's matrices' table through the descriptor cache.
void CudaOptimizerKernels::swan_update_many(const SwanTensor* tensors, int64_t count, const SwanArgs& a) {
  const cuda_scratch::SwanPlan plan = cuda_scratch::swan_plan(cuda_scratch::swan_shapes(tensors, count, swan_split_from_k(a.ns_products)));
  void* work = scratch(opt_scratch_, static_cast<size_t>(plan.scratch_bytes), "swan_update");
  swan_staging_->reserve(static_cast<size_t>(plan.pinned_bytes));
  const cuda::SwanParams p{a.lr, a.decoupled_decay, a.eps, a.ns_tolerance, a.ns_steps, a.standardize, a.exact, a.write, a.scalars, a.stats, a.ns_products};
  std::vector<cuda::SwanItem> items;
  std::vector<cuda::SwanExactGroup*> groups;
  const cuda::DeviceLoop loop = [this](const cuda::DeviceLoopBody& body) { return q_->device_loop(body); };
  const cuda::Upload upload = [this](const void* table, size_t bytes) { return descriptors(table, bytes, "swan_update"); };
  for (size_t c = 0, begin = 0; c < plan.ends.size(); begin = static_cast<size_t>(plan.ends[c++])) {
    items.clear(), groups.clear();
    for (size_t j = begin; j < static_cast<size_t>(plan.ends[c]); ++j) {
      const SwanTensor& t = tensors[plan.order[j]];
      items.push_back({t.w.ptr, t.g.ptr, t.m, t.n, same_rows(t.w, t.g, t.n, "swan_update_many"), t.tensor});
    }
    const auto shape = [&](int64_t b) { return std::pair<int64_t, int64_t>{items[b].m, items[b].n}; };
    for (const auto& [g0, g1] : cuda_scratch::swan_exact_groups(static_cast<int64_t>(items.size()), shape)) {
      std::vector<std::pair<int64_t, int64_t>> group_shapes;
      for (int64_t b = g0; b < g1; ++b) group_shapes.push_back(shape(b));
      groups.push_back(swan_staging_->group(group_shapes));
    }
    const SwanTensor& first = tensors[plan.order[begin]];
    dispatch::with_types<bf16>(first.w.dtype, first.g.dtype, "swan_update", [&](auto* t, auto* gt) {
      using T = std::remove_pointer_t<decltype(t)>;
      using G = std::remove_pointer_t<decltype(gt)>;
      cuda::swan_chunk<T, G>(items.data(), static_cast<int64_t>(items.size()), p, *gemm_, work, groups.data(), loop, upload, q_->issue());
    });
  }
}
// A list of tensors sharing dtypes and state count: one launch per kElementwiseManyPerLaunch of them
// (their descriptor tables through the cache); one tensor, or a mixed list, a launch each.
void CudaOptimizerKernels::elementwise_update_many(ElementwiseKind kind, const ElementwiseTensor* tensors, int64_t count,
                                                   const ElementwiseArgs& a) {
  if (count == 0) return;
  if (std::any_of(tensors, tensors + count, [](const ElementwiseTensor& t) { return t.padded(); })) {
    std::vector<ElementwiseTensor> dense;
    for (int64_t i = 0; i < count; ++i)
      if (tensors[i].padded()) elementwise_padded(kind, tensors[i], a);
      else dense.push_back(tensors[i]);
    elementwise_update_many(kind, dense.data(), static_cast<int64_t>(dense.size()), a);
    return;
  }
  const ElementwiseTensor& first = tensors[0];
  // The rule's Step and its kernels' names from the list; the dtypes from the first tensor of a launch.
  auto with_step = [&](const ElementwiseTensor& t, auto&& launch_for) {
    dispatch::with_types<bf16>(t.w.dtype, t.g.dtype, "elementwise_update", [&](auto* w, auto* g) {
      dispatch::with_type<bf16>(elementwise::state_dtype(t), [&](auto* st) {
        switch (kind) {
#define MULTINORM_CASE(kind_, Step, name, many_name) \
  case kind_:                                      \
    return launch_for(Step{}, w, g, st, name, many_name);
          MULTINORM_ELEMENTWISE_RULES(MULTINORM_CASE)
#undef MULTINORM_CASE
        }
      });
    });
  };
  if (!elementwise::in_multi_tensor_launches(tensors, count)) {
    for (int64_t i = 0; i < count; ++i) {
      const ElementwiseTensor& t = tensors[i];
      WriteBack wb = a.write;
      wb.tensor = t.tensor;
      with_step(t, [&](auto step, auto* w, auto* g, auto* st, const char* name, const char*) {
        using T = std::remove_pointer_t<decltype(w)>;
        using G = std::remove_pointer_t<decltype(g)>;
        using S = std::remove_pointer_t<decltype(st)>;
        ElementwiseStates<S> states{};
        for (int k = 0; k < t.nstates; ++k) states.p[k] = as<S>(t.states[k]);
        cuda::elementwise<decltype(step), T, G, S>(name, as<T>(t.w), as<G>(t.g), states, t.nstates, t.n, a.rule, wb, a.scalars, q_->issue());
      });
    }
    return;
  }
  for (int64_t begin = 0; begin < count; begin += cuda_scratch::kElementwiseManyPerLaunch) {
    const int64_t end = std::min(count, begin + cuda_scratch::kElementwiseManyPerLaunch);
    many_items_.clear();
    int64_t blocks = 0;
    for (int64_t i = begin; i < end; ++i) {
      const ElementwiseTensor& t = tensors[i];
      many_items_.push_back({t.w.ptr, t.g.ptr, {t.states[0].ptr, t.states[1].ptr}, t.n, t.tensor, blocks});
      blocks += (t.n + kElementwiseManyElementsPerBlock - 1) / kElementwiseManyElementsPerBlock;
    }
    const auto* dev = static_cast<const ElementwiseManyItem*>(
        descriptors(many_items_.data(), many_items_.size() * sizeof(ElementwiseManyItem), "elementwise_update_many"));
    with_step(first, [&](auto step, auto* w, auto* g, auto* st, const char*, const char* many_name) {
      using T = std::remove_pointer_t<decltype(w)>;
      using G = std::remove_pointer_t<decltype(g)>;
      using S = std::remove_pointer_t<decltype(st)>;
      cuda::elementwise_many<decltype(step), T, G, S>(many_name, dev, first.nstates, static_cast<int64_t>(many_items_.size()), blocks, a.rule,
                                                      a.write, a.scalars, q_->issue());
    });
  }
}

// An element-wise rule on a weight with padded rows (a matrix of a padded arena under Adam or SGD:
// optimizer.name = adam): w and g copied into dense rows in scratch, the rule run there over its
// dense states (the same elements, rounding indices and bits), w copied back. Three copies of the
// tensor an update, where SinkGD and SWAN read the padded rows as they are.
void CudaOptimizerKernels::elementwise_padded(ElementwiseKind kind, const ElementwiseTensor& t, const ElementwiseArgs& a) {
  if (t.cols <= 0 || t.n % t.cols != 0)
    throw Error("elementwise_update: a tensor with padded rows (Buf::ld) and no rows' length (ElementwiseTensor::cols)");
  const int64_t cols = t.cols, rows = t.n / cols, ld = same_rows(t.w, t.g, cols, "elementwise_update");
  const int64_t wb = dtype_bytes(t.w.dtype), gb = dtype_bytes(t.g.dtype);
  char* dense = static_cast<char*>(scratch(padded_scratch_, static_cast<size_t>(cuda_scratch::padded_rule_bytes(t.n, wb, gb)), "elementwise_update"));
  char* dense_g = dense + cuda_scratch::padded_rule_g_offset(t.n, wb);
  cuda::copy_rows(dense, cols, t.w.ptr, ld, rows, cols, static_cast<int>(wb), q_->issue());
  cuda::copy_rows(dense_g, cols, t.g.ptr, ld, rows, cols, static_cast<int>(gb), q_->issue());
  ElementwiseTensor d = t;
  d.w = {dense, t.w.dtype}, d.g = {dense_g, t.g.dtype}, d.cols = 0;
  elementwise_update_many(kind, &d, 1, a);
  cuda::copy_rows(t.w.ptr, ld, dense, cols, rows, cols, static_cast<int>(wb), q_->issue());
}

}  // namespace multinorm::cuda
