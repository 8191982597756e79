// The optimizers' kernels: the ops an optimizer update runs, one tensor or a list of them per call,
// over a backend's memory. A backend hands out its OptimizerKernels as it hands out its WorkQueue
// (Backend::optimizer_kernels()): the CPU's (kernels/cpu/cpu_optimizer_kernels.cpp), the CUDA
// backend's (kernels/cuda/cuda_optimizer_kernels.cu), and the cost recorder's (kernel_costs.cpp),
// which records what each op moves and computes from this same list. Buf (a buffer of backend
// memory and its dtype) is defined here, the seam's first type: backend.h builds on it.
#pragma once
#include <cstdint>

#include "multinorm/config_choices.h"
#include "multinorm/cuda_scratch.h"
#include "multinorm/dtype.h"
#include "multinorm/update_scalars.h"
#include "multinorm/write_back.h"

namespace multinorm {

struct Buf {
  void* ptr = nullptr;
  DType dtype = DType::F32;
  // A matrix whose rows are padded: its row stride in elements (0: rows are dense, as the op's width
  // says). Only the CUDA backend's plan pads (the MLP's activations: ActivationLayout), and only the
  // ops that take them honour it (matmul, swiglu and their fused forms); every other op refuses one.
  // Its padding holds zeros: allocate() zero-fills, ops write only the row's columns, and a GEMM over
  // the padded width writes there a row of its input times zeros (cuda_scratch::gemm_extents).
  int64_t ld = 0;
  Buf at(int64_t elements) const {
    return {static_cast<char*>(ptr) + elements * dtype_bytes(dtype), dtype, ld};
  }
  float* f32() const { return static_cast<float*>(ptr); }
  // The row stride of a matrix of `cols` columns.
  int64_t stride(int64_t cols) const { return ld ? ld : cols; }
};

// Arguments of the per-tensor optimizer ops. Every update computes u in FP32 and writes
//   w <- w * (1 - lr * decoupled_decay) - lr * u      (rounded per WriteBack)
// With `scalars` set, the op takes its learning rate (and what is derived from it), Adam's bias
// corrections and write.step from that slot of the UpdateScalars in backend memory when it runs, and
// changes nothing when the update's statistics say skip (update_scalars.h); lr, step and write.step
// here are then not used.
struct SinkGDArgs {
  float lr = 0, decoupled_decay = 0;
  int iterations = 5;  // L
  float eps = 1e-8f;   // floor on row/column norms
  WriteBack write;
  ScalarsRef scalars;
};
struct SwanArgs {
  float lr = 0, decoupled_decay = 0;
  bool standardize = false;  // rows: subtract mean, divide by std (SWAN paper) instead of l2
  bool exact = false;        // exact FP64 eigendecomposition instead of Newton-Schulz
  int ns_steps = 10;
  float ns_tolerance = 0;    // stop when ||I - Y Z||_F / sqrt(m) < tolerance (0: all steps)
  SwanProducts ns_products = SwanProducts::Auto;  // the CUDA backend's (swan_split_from_k); the CPU's are FP32
  float eps = 1e-8f;
  WriteBack write;
  ScalarsRef scalars;
  SwanStats* stats = nullptr;  // backend memory the op adds its Newton-Schulz statistics to (null: none)
};
// The Gram size from which the CUDA backend splits SWAN's Newton-Schulz products (cuda_scratch::swan_split_tf32).
inline int64_t swan_split_from_k(SwanProducts p) {
  return p == SwanProducts::SplitTf32 ? 0 : p == SwanProducts::Fp32 ? INT64_MAX : cuda_scratch::kSwanSplitTf32MinK;
}
// One tensor of a multi-tensor SWAN update: its buffers, shape and stochastic-rounding tensor id.
struct SwanTensor {
  Buf w, g;
  int64_t m = 0, n = 0;  // rows, columns
  uint64_t tensor = 0;
};
struct AdamArgs {
  float lr = 0, eps = 1e-8f;
  double beta1 = 0.9, beta2 = 0.999;  // double: 1 - beta is formed exactly, then rounded (as torch does)
  float l2_decay = 0;         // torch.optim.Adam's weight_decay: g += l2_decay * w
  float decoupled_decay = 0;  // torch.optim.AdamW's: w *= 1 - lr * decoupled_decay
  int64_t step = 1;           // t of the bias correction, from 1
  WriteBack write;
  ScalarsRef scalars;
};
// One tensor of a multi-tensor SinkGD update: its buffers, shape and stochastic-rounding tensor id.
struct SinkGDTensor {
  Buf w, g;
  int64_t m = 0, n = 0;  // rows, columns
  uint64_t tensor = 0;
};
// One tensor of a multi-tensor Adam update: its buffers, length and stochastic-rounding tensor id;
// where w and g have padded rows (Buf::ld, a matrix of a padded arena), their rows' length.
struct AdamTensor {
  Buf w, g, m, v;
  int64_t n = 0;
  uint64_t tensor = 0;
  int64_t cols = 0;
};
// The element-wise optimizers (each one's step on an element: kernels/common/elementwise_rules.h).
enum class ElementwiseKind { Adam, Sgd };
constexpr int kMaxElementwiseStates = 2;
// One tensor of an element-wise update: its buffers (the states its rule keeps for it: Adam m, v;
// SGD its momentum buffer, or none without momentum), length and stochastic-rounding tensor id;
// where w and g have padded rows (Buf::ld, a matrix of a padded arena: the states stay dense), their
// rows' length.
struct ElementwiseTensor {
  Buf w, g;
  Buf states[kMaxElementwiseStates];
  int nstates = 0;
  int64_t n = 0;
  uint64_t tensor = 0;
  int64_t cols = 0;
  // Whether w or g has padded rows: a device runs its rule through dense copies (the CUDA backend's
  // elementwise_padded; the cost model counts them so).
  bool padded() const { return w.ld != 0 || g.ld != 0; }
};
// An element-wise update's arguments: the rule's scalars for the update (optim_math::rule_scalars
// forms them), the write-back, and with `scalars` set the update's scalars in backend memory, whose
// slot replaces `rule` where the op runs.
struct ElementwiseArgs {
  RuleScalars rule;
  WriteBack write;
  ScalarsRef scalars;
};
struct SgdArgs {
  float lr = 0, momentum = 0, decoupled_decay = 0;
  WriteBack write;
  ScalarsRef scalars;
};
class OptimizerKernels {
 public:
  virtual ~OptimizerKernels() = default;
  // w in the parameter dtype; g the same, or FP32 gradients of BF16 weights (precision.grads = fp32).
  // The FP64 sum of squares of x[n], read back (a host wait: the checkpoint's check that the weights
  // are finite).
  virtual double sum_squares(Buf x, int64_t n) = 0;
  // out[i] = sum_squares(xs[i], ns[i]) for `count` tensors, into backend memory, with no host wait
  // (each the same number as one sum_squares call gives).
  virtual void sum_squares_many(const Buf* xs, const int64_t* ns, int64_t count, double* out) = 0;
  virtual void scale(Buf x, int64_t n, float factor) = 0;
  // An update's statistics where the gradients are, with no host wait: s->stats (backend memory) from
  // the per-tensor sums of squares squares[count] and the loss totals (both backend memory, over every
  // rank), the clip threshold grad_clip (0: none) and s's spike threshold, skip_spikes and
  // token_mean (optim_math::finish_statistics). The host reads them when it likes.
  virtual void update_statistics(UpdateScalars* s, const LossTotals* loss, const double* squares, int64_t count, double grad_clip) = 0;
  // x[n] *= s->stats.clip_factor, read where the op runs; nothing when the factor is 1 or the update
  // is skipped. The same bits as scale(x, n, factor).
  virtual void clip_gradients(Buf x, int64_t n, const UpdateScalars* s) = 0;
  // SinkGD on W[m,n] (fused: X = diag(u) G diag(v) is never materialised); see kernels/cpu/sinkgd.cpp
  virtual void sinkgd_update(Buf w, Buf g, int64_t m, int64_t n, const SinkGDArgs& args) = 0;
  // SinkGD on many tensors with the same arguments (args.write.tensor is replaced by each tensor's
  // id). The results equal sinkgd_update on each tensor; a backend may run them in any order or
  // together (the CPU runs whole tensors on separate cores, so one tensor's memory traffic overlaps
  // another's passes). The default updates them one by one.
  virtual void sinkgd_update_many(const SinkGDTensor* tensors, int64_t count, const SinkGDArgs& args) {
    for (int64_t i = 0; i < count; ++i) {
      SinkGDArgs a = args;
      a.write.tensor = tensors[i].tensor;
      sinkgd_update(tensors[i].w, tensors[i].g, tensors[i].m, tensors[i].n, a);
    }
  }
  // SWAN: row normalisation then whitening sqrt(max(m,n)) (X X^T)^(-1/2) X (X (X^T X)^(-1/2) when
  // m > n), so ||U||_F = sqrt(mn); see kernels/cpu/swan.cpp. On many tensors with the same arguments
  // (args.write.tensor is replaced by each tensor's id): a device batches the Newton-Schulz products
  // of tensors with one Gram size. Each tensor's Newton-Schulz stops where the CPU's would (its
  // residual under ns_tolerance), decided where the op runs; its statistics are added to args.stats.
  virtual void swan_update_many(const SwanTensor* tensors, int64_t count, const SwanArgs& args) = 0;
  void swan_update(Buf w, Buf g, int64_t m, int64_t n, const SwanArgs& args) {
    const SwanTensor t{w, g, m, n, args.write.tensor};
    swan_update_many(&t, 1, args);
  }
  // An element-wise optimizer on many tensors with the same arguments (args.write.tensor is
  // replaced by each tensor's id): each element's step is its Step's, the same bits on every backend
  // (generic kernels made from the list in kernels/common/elementwise_rules.h); a device runs many
  // small tensors in one launch.
  virtual void elementwise_update_many(ElementwiseKind kind, const ElementwiseTensor* tensors, int64_t count, const ElementwiseArgs& args) = 0;
  // The rules' entries (kernels/common/elementwise_ops.cpp): Adam/AdamW with torch semantics, states
  // m, v in their own dtype; on many tensors (the norm weights: one launch on a device); SGD, torch
  // semantics: buf = momentum * buf + g, w -= lr * buf (no buffer when momentum is 0).
  // (cols: as AdamTensor's and ElementwiseTensor's, where w and g have padded rows)
  void adam_update(Buf w, Buf g, Buf m, Buf v, int64_t n, const AdamArgs& args, int64_t cols = 0);
  void adam_update_many(const AdamTensor* tensors, int64_t count, const AdamArgs& args);
  void sgd_update(Buf w, Buf g, Buf momentum_buf, int64_t n, const SgdArgs& args, int64_t cols = 0);
};

}  // namespace multinorm
