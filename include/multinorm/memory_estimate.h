// Memory accounting: the paper's MEM column (weights + optimizer states, BF16) and the training
// total (weights, gradients, optimizer states, activations of one micro-batch).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "multinorm/activation_plan.h"
#include "multinorm/cuda_scratch.h"
#include "multinorm/model_spec.h"
#include "multinorm/run_config.h"

namespace multinorm {

constexpr double kGiB = 1073741824.0;  // 2^30

struct OptimizerMemory {
  std::string label;         // e.g. "adam", "sinkgd"
  int64_t weight_bytes = 0;
  int64_t state_bytes = 0;   // all optimizer states
  int64_t matrix_state_bytes = 0;  // states of the matrix parameters alone (0 for SinkGD/SWAN)
  int64_t total() const { return weight_bytes + state_bytes; }
};

// Weights and states with every parameter going to `matrix_optimizer` when it matches the paper's
// matrix patterns and to Adam otherwise; dtype sizes as given (the paper: 2 and 2).
OptimizerMemory optimizer_memory(const std::vector<TensorSpec>& specs, OptimizerKind matrix_optimizer,
                                 OptimizerKind fallback, const std::vector<std::string>& matrix_params,
                                 double momentum, int64_t weight_dtype_bytes, int64_t state_dtype_bytes);

// The paper's table: Adam for everything, and SinkGD/SWAN (Adam kept for embedding, norms, lm_head),
// BF16 weights and states.
std::vector<OptimizerMemory> paper_memory_table(const ModelConfig& m);

// The CPU backend's scratch after a training step (kernels/cpu/scratch_plan.cpp: attention's
// per-head tiles with a T x T score matrix per head, RMSNorm's reduction partials, the embedding
// backward's per-thread rows, the matrix optimizer's buffers for `matrices`, the matrix optimizer's
// tensors in tensor order). Kept exact against the backend's Workspace by tests/test_memory.cpp;
// oneDNN's internal scratchpads are not included.
struct MatrixShape {
  int64_t rows = 0, cols = 0;
};
int64_t cpu_backend_scratch_bytes(const ModelConfig& m, int64_t micro_batch, int64_t seq_len, DType act_dtype, DType grad_dtype,
                                  OptimizerKind matrix_optimizer, const std::vector<MatrixShape>& matrices, bool swan_exact, int threads);

// One GEMM of a training step as the CUDA backend runs it: out[M,N] = op(a) op(b) (+ out when
// accumulate), elements of `in` bytes in a and b, `out` bytes in out; `count` of them a micro-batch.
// name: the projection and pass ("qkv backward_input"; "gate ..." and "up ..." where the gate/up
// projection runs by halves: Linear::halves). What the GEMM staging scratch is sized by
// and what `bench gemm -c MODEL` times.
struct GemmCall {
  std::string name;
  int count = 1;
  int64_t M, N, K;
  bool ta, tb, accumulate;
  int64_t in, out;
  int64_t a_ld = 0, b_ld = 0, out_ld = 0;  // an MLP activation's or a padded weight's row stride (0: dense)
};
// The model's projections' (Linear::gemms: forward, input gradient, weight gradient) with their
// outputs' element sizes (an activation, an FP32 input gradient, the gradient arena's), the loss
// head's forward in the backend's vocabulary chunks where it fuses it. Bases are taken as 16-byte
// aligned, as the model's buffers are where hidden_size x element bytes is a multiple of 16. Exact
// against the backend (tests/test_memory.cpp, with a misaligned MLP width).
std::vector<GemmCall> cuda_training_gemm_calls(const ModelConfig& m, int64_t BT, DType act, DType grad);
// A call's operands as stored (the MLP's activations' rows padded where `layout` pads them: the
// call's strides, else dense) and what the backend stages of them (cuda_scratch::gemm_staging).
cuda_scratch::GemmStaging cuda_gemm_call_staging(const GemmCall& c, const ActivationLayout& layout);

// The CUDA backend's device scratch after a training step (include/multinorm/cuda_scratch.h: cuBLASLt's
// workspace, RMSNorm's block partials, attention's row sums, the embedding buckets, the sum of
// squares, the matrix optimizer's buffers for the largest matrix, the GEMM operands staged through
// 128-byte rows). Exact against the backend's workspace_bytes (tests/test_memory.cpp, on the
// emulated build). act: the weights' and activations' dtype; grad: the gradients'; swan_products:
// SWAN's Newton-Schulz products (split TF32 chunks hold more).
int64_t cuda_backend_scratch_bytes(const ModelConfig& m, int64_t micro_batch, int64_t seq_len, DType act, DType grad,
                                   OptimizerKind matrix_optimizer, const std::vector<std::string>& matrix_params, SwanProducts swan_products);

struct TrainingMemory {
  bool cuda = false;  // device memory of the CUDA backend (else host memory of the CPU backend)
  int64_t weights = 0, grads = 0, states = 0, activations = 0, backend_scratch = 0;
  int64_t total() const { return weights + grads + states + activations + backend_scratch; }
};
// The activation plan the model allocates for this run on the CPU backend here, or (cuda) on the CUDA
// backend: the same buffers but for the scratch a backend's fused kernels never write.
ActivationPlan training_activation_plan(const RunConfig& run, bool cuda = false);
// Memory of one rank on the CPU backend, or (cuda) the device memory plan of the CUDA backend: the
// arenas are the same but for that scratch; the backend's own scratch differs.
TrainingMemory training_memory(const RunConfig& run, bool cuda = false);

}  // namespace multinorm
