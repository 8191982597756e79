// Benchmarks (`multinorm bench ...`): speed figures printed as ratios against baselines measured in
// the same run, never asserted in tests.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace multinorm {

struct ModelBenchOptions {
  std::string config;     // model config or run config
  int64_t batch = 16;
  int64_t seq = 256;
  int64_t steps = 5;
  int64_t warmup = 2;
  int threads = 0;
  std::string backend = "cpu";  // cpu | cuda | auto
  std::string precision = "bf16";
  std::string torch = "auto";  // auto | off: run bench/torch_llama_bench.py for the PyTorch baseline
  bool json = false;
  // a100 | h100: no run; the CUDA kernels' roofline on that GPU from their byte and FLOP counts
  std::string predict;
  // With a CUDA backend: the GPU whose peaks the measured table's MFU and predicted column use.
  std::string peak = "a100";
  // The roofline's fractions of peak; 0: the GPU's own (DevicePeak::assume, kernel_costs.h).
  double gemm_efficiency = 0, attention_efficiency = 0;
  // With predict: the data-parallel step on 1, 2, 4, ... up to this many GPUs, 8 a node; 0: not shown.
  int ranks = 0;
};

void bench_model(const ModelBenchOptions& o);
// `bench model --predict`: the per-kernel roofline of a micro-batch and an optimizer update.
void bench_model_predict(const ModelBenchOptions& o);
// `bench model --predict --ranks N`: what data parallelism adds to that step and the scaling efficiency
// (scaling_model.h), printed as a table, or as JSON with --json (src/bench/bench_scaling.cpp).
struct RunConfig;
struct DevicePeak;
struct RooflineAssumptions;
void bench_scaling_predict(const ModelBenchOptions& o, const RunConfig& run, const DevicePeak& peak, const RooflineAssumptions& a);

struct OptimBenchOptions {
  std::string config;  // model config or run config (its optimizer settings)
  std::string precision = "bf16";
  int steps = 7;  // interleaved rounds (SWAN runs in the first three)
  int threads = 0;
  std::string backend = "cpu";  // cpu | cuda | auto
  bool json = false;
  // After the timings, one more step of each optimizer with the backend's per-kernel profile (a
  // device backend's CUDA events; the step then runs eagerly), beside each kernel's roofline time on
  // `peak` (a100 | h100 | h200; "": no prediction).
  bool profile = false;
  std::string peak;
};

void bench_optim(const OptimBenchOptions& o);

struct DataBenchOptions {
  std::string inputs;     // C4 json.gz globs
  std::string tokenizer;
  double train_tokens_per_s = 15000;  // the trainer rate the loader is compared with (bench model, llama_tiny)
};

void bench_data(const DataBenchOptions& o);

// CRC-32C throughput (what verifying a checkpoint costs) against a memcpy of the same bytes, same run.
void bench_checksum(int64_t bytes);

// `bench attention`: Backend::attention_forward and forward + attention_backward alone on [B, T, H, D]
// (src/bench/bench_attention.cpp), in TFLOP/s, FLOPs counted as FlashAttention counts them.
struct AttentionBenchOptions {
  int64_t batch = 16, heads = 32, seq = 1024, head_dim = 64;  // 16k tokens of width 2048: FlashAttention-2's benchmark
  std::vector<std::string> shapes;  // "BxHxTxD" each, all in this process; empty: the one shape above
  int64_t steps = 20;  // timed calls of each, at least
  int64_t warmup = 3;  // untimed forward + backward calls first, at least
  double warmup_ms = 150;  // ... and at least this long, per shape
  double min_ms = 50;      // each timed window at least this long (more calls than --steps where they are short)
  int threads = 0;
  std::string backend = "auto";  // cpu | cuda | auto
  std::string precision = "bf16";
  bool json = false;
};

void bench_attention(const AttentionBenchOptions& o);
// A causal attention forward's FLOPs: 4 x B x H x D x T(T+1)/2 (QK^T and PV over the pairs a query sees).
double attention_forward_flops(int64_t B, int64_t H, int64_t T, int64_t D);

// `bench gemm`: Backend::matmul alone (src/bench/bench_gemm.cpp), each product against an n^3 GEMM
// timed in the same run: a model's training GEMMs as the backend runs them (config), or any products
// (shapes), each beside the same product with M, N, K rounded up to multiples of 64.
struct GemmBenchOptions {
  std::string config;  // a model config or a shipped model's name; "": only `shapes`
  int64_t batch = 32, seq = 256;  // the model's micro-batch
  std::vector<std::string> shapes;  // "MxNxK" or "MxNxK:OPS" (OPS: op(a) op(b), n or t)
  int64_t reference = 8192;  // the square reference GEMM's size
  int64_t steps = 10;         // timed calls of each, at least
  double warmup_ms = 50;      // untimed calls first, at least this long
  double min_ms = 30;         // each timed window at least this long
  int threads = 0;
  std::string backend = "auto";  // cpu | cuda | auto
  std::string precision = "bf16";
  bool json = false;
};

void bench_gemm(const GemmBenchOptions& o);

}  // namespace multinorm
