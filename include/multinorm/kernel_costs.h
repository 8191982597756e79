// What the CUDA backend's kernels cost, computed from the ops a step really issues. make_cost_recorder()
// is a Backend that executes nothing: each op records the kernels the CUDA backend launches for it
// (the same names as its profiler's, the same launch counts, tested against the emulated backend)
// with the bytes they move through device memory and the FLOPs they do. `multinorm bench model
// --predict a100|h100` turns the records into a roofline; on a GPU, `bench model --backend cuda`
// puts them beside the measured per-kernel times. The formulas are docs/cuda.md's kernel table.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "multinorm/backend.h"
#include "multinorm/llama_model.h"
#include "multinorm/run_config.h"

namespace multinorm {

// What bounds a kernel's compute: the BF16 tensor cores through cuBLASLt, our own mma.sync kernels
// (attention), FP32 GEMMs through cuBLASLt (SWAN), TF32 tensor-core GEMMs through cuBLASLt (SWAN's
// split TF32 products), FP32 FMAs in our kernels, or nothing (memory).
enum class CostUnit { GemmTensorCore, KernelTensorCore, GemmFp32, GemmTf32, KernelFp32, Memory };
const char* cost_unit_name(CostUnit u);

struct KernelCost {
  std::string name;  // as the CUDA profiler names it ("rmsnorm_forward", "gemm bf16 (cuBLASLt)", ...)
  CostUnit unit = CostUnit::Memory;
  int64_t launches = 0;
  double bytes = 0, flops = 0;  // device-memory traffic (each byte read or written once) and FLOPs
};

// A Backend that records instead of computing (allocate() hands out addresses that must never be
// dereferenced: every op and copy is a no-op). The update's clip_gradients launch is counted as
// clipping (a read and a write of the gradients), the worst case. SWAN is recorded with every
// Newton-Schulz step, as the device runs them (a matrix done early keeps its iterate, not its cost).
// Its activation and arena layout is the CUDA backend's, or with cuda_layout false the CPU backend's
// (a CPU run's plans, as `info` makes them: a backend that allocates nothing).
std::unique_ptr<Backend> make_cost_recorder(bool cuda_layout = true);
// The kernels recorded since the last take, by name in first-launch order (launches, bytes and
// FLOPs summed). `recorder` must come from make_cost_recorder().
std::vector<KernelCost> take_kernel_costs(Backend& recorder);

// Model FLOPs per token, the convention `bench model` and `doctor` report MFU with: 6 x (GEMM
// parameters, lm_head included) + 12 x layers x T x C (attention without the causal saving).
double model_flops_per_token(const LlamaModel& model, int64_t T, int64_t* gemm_params = nullptr);

// The kernels of one micro-batch's forward and backward and of one optimizer update of `run`'s
// model and optimizer at B x T, recorded from the model and optimizer code itself.
struct StepCosts {
  std::vector<KernelCost> micro_batch, update;
  double flops_per_token = 0;  // model_flops_per_token
  int64_t gemm_params = 0;
};
StepCosts record_step_costs(const RunConfig& run, DType dtype, int64_t B, int64_t T);
// The model's GEMM row widths off 16 bytes in `dtype` (cuda_scratch::gemm_operand_staged), as
// "intermediate_size 5461, 2 x intermediate_size 10922"; "" when none. On the CUDA backend the MLP's
// activations of those widths are padded in the plan, the down projection's weight and gradient in
// the arenas (layout_arena).
std::string staged_gemm_widths(const ModelConfig& m, DType dtype);
// What the CUDA backend does with them, for the line that lists them (doctor, bench model).
constexpr const char* kStagedGemmWidthsNote =
    "the MLP's activations and the down projection's weight and gradient padded to 128-byte rows, the up half on a 16-byte pack, the gate "
    "and up weights and gradients given zero rows up to it; the down projection's GEMMs and the gate/up projection's, by halves, run over the "
    "zero padding";

// The fractions of peak the roofline assumes: stated, not measured (docs/cuda.md gives the sources).
struct RooflineAssumptions {
  double gemm = 0.7;       // cuBLASLt's BF16 and FP32 GEMMs
  double attention = 0.35; // our mma.sync attention kernels
  double simt = 0.5;       // FP32 FMA kernels
  double memory = 0.8;     // memory-bound kernels, of the peak bandwidth
};

// A GPU's peaks (dense, no sparsity) from its datasheet, and what the roofline assumes of it.
struct DevicePeak {
  std::string name;
  double bf16_tflops = 0, fp32_tflops = 0, tf32_tflops = 0, bandwidth_gbs = 0;
  // FlashAttention-2's forward + backward fraction of the BF16 peak on this architecture at the
  // paper's shapes (T 256-2048, D 64-128, causal); our attention is estimated at kAttentionOfFa2 of it.
  double fa2_of_peak = 0;
  RooflineAssumptions assume;  // gemm, simt, memory; attention = fa2_of_peak x kAttentionOfFa2
};
// Our mma.sync attention against FlashAttention-2 on the same GPU (forward + backward): an estimate
// from a review of the kernels (35-50% at T = 256, 50-70% forward at 1-2k, 25-45% backward) until a
// GPU measures it (scripts/gpu_check.sh compares it with scaled_dot_product_attention).
constexpr double kAttentionOfFa2 = 0.45;
// "a100" (A100 SXM4 80 GB), "h100" (H100 SXM5) or "h200" (H200 SXM); nullptr for another name.
const DevicePeak* find_device_peak(const std::string& name);

// The kernel's time on `peak`: the larger of its compute time and its memory time.
double roofline_seconds(const KernelCost& k, const DevicePeak& peak, const RooflineAssumptions& a);
bool roofline_memory_bound(const KernelCost& k, const DevicePeak& peak, const RooflineAssumptions& a);

}  // namespace multinorm
