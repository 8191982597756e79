// Shared by the tests of the CUDA backend against the CPU backend (test_cuda_ops.cpp,
// test_cuda_optimizers.cpp, test_cuda_queue.cpp, test_cost_model.cpp): the CudaVsCpu fixture and its
// emulation modes, buffer pairs, random ids, small model and run configs. In CI the CUDA backend is
// the emulated build (the same kernel sources executed on the CPU) under two fiber orders and
// several worker threads; with MULTINORM_TEST_CUDA_PLUGIN=build/libmultinorm_cuda.so on a GPU
// machine the same tests run on the device.
//
// Tolerances, per op, from measured errors (MULTINORM_TEST_ERRORS=1 prints them):
//   FP32 outputs: the CUDA kernels sum in a different order (warp trees, online softmax), so they
//   agree to a few FP32 ulps of the data's scale: 1e-5 relative to the largest element (measured:
//   attention 2.8e-7, rmsnorm 2.7e-7, cross-entropy 3.0e-7, GEMMs 2.7e-6 with K = 5461).
//   BF16 outputs: a different FP32 sum may round to the neighbouring BF16 value: one BF16 ulp of the
//   largest element is 2^-8 = 3.9e-3, so 8e-3 (two ulps) bounds it (measured: attention's dqkv
//   4.3e-3, every other op 0: the same BF16 values).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <numeric>
#include <tuple>

#include "multinorm/device.h"
#include "multinorm/error.h"
#include "multinorm/kernel_costs.h"
#include "multinorm/llama_model.h"
#include "multinorm/optimizer.h"
#include "multinorm/run_config.h"
#include "test_backends.h"
#include "test_support.h"

namespace cuda_test {

using namespace multinorm;
using namespace multinorm::testing;

constexpr double kF32 = 1e-5, kBf16 = 8e-3;
inline double tol(DType t) { return t == DType::F32 ? kF32 : kBf16; }

inline const CudaProbe* cuda_plugin() { return test_cuda_plugin(); }

// (fiber order, worker threads) of the emulation; ignored on a real GPU. An order list ("a,b,c") runs
// every launch under each order from the same device memory and requires the same bytes after each.
struct Mode {
  const char* order;
  const char* workers;
};
inline std::ostream& operator<<(std::ostream& os, const Mode& m) { return os << m.order << "_" << m.workers; }
inline void set_emulation_mode(const Mode& m) {
  const bool list = std::strchr(m.order, ',') != nullptr;
  ::unsetenv(list ? "MULTINORM_EMU_ORDER" : "MULTINORM_EMU_ORDERS");
  ::setenv(list ? "MULTINORM_EMU_ORDERS" : "MULTINORM_EMU_ORDER", m.order, 1);
  ::setenv("MULTINORM_EMU_WORKERS", m.workers, 1);
}
inline void clear_emulation_mode() {
  for (const char* v : {"MULTINORM_EMU_ORDER", "MULTINORM_EMU_ORDERS", "MULTINORM_EMU_WORKERS"}) ::unsetenv(v);
}

class CudaVsCpu : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    const CudaProbe* p = cuda_plugin();
    if (!p) GTEST_SKIP() << "no CUDA plugin (emulated or real) was built";
    set_emulation_mode(GetParam());
    ::setenv("MULTINORM_EMU_SEED", "7", 1);
    cuda = make_cuda_backend(*p);
  }
  void TearDown() override { clear_emulation_mode(); }
  // MULTINORM_TEST_CPU_THREADS=1 keeps the CPU reference single-threaded (the TSan run: libgomp is
  // not instrumented).
  std::unique_ptr<Backend> cpu = make_cpu_backend(std::getenv("MULTINORM_TEST_CPU_THREADS") ? std::atoi(std::getenv("MULTINORM_TEST_CPU_THREADS")) : 2);
  std::unique_ptr<Backend> cuda;
};

// A pair of buffers holding the same values on both backends.
struct Pair {
  DeviceBuffer c, g;  // cpu, cuda
  Pair(Backend& cpu, Backend& cuda, const Vec& v, DType t) : c(cpu, v, t), g(cuda, v, t) {}
  ::testing::AssertionResult same(double rtol) const { return close(g.get(), c.get(), rtol); }
};

// Token ids (as doubles for DeviceBuffer's F32 path would round: stored as int32 bit patterns).
struct Ids {
  void *c, *g;
  Backend &cb, &gb;
  Ids(Backend& cpu, Backend& cuda, const std::vector<int32_t>& ids) : cb(cpu), gb(cuda) {
    const int64_t bytes = static_cast<int64_t>(ids.size()) * 4;
    c = cpu.allocate(bytes), g = cuda.allocate(bytes);
    cpu.to_device(c, ids.data(), bytes);
    cuda.to_device(g, ids.data(), bytes);
  }
  ~Ids() { cb.release(c), gb.release(g); }
};

inline std::vector<int32_t> random_ids(size_t n, int32_t V, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = static_cast<int32_t>(gen() % V);
  return v;
}

inline std::vector<float> rope_table(int64_t T, int64_t D) {
  std::vector<float> cs(T * D);
  for (int64_t p = 0; p < T; ++p)
    for (int64_t i = 0; i < D / 2; ++i) {
      cs[(p * D / 2 + i) * 2] = static_cast<float>(std::cos(p * std::pow(10000.0, -2.0 * i / D)));
      cs[(p * D / 2 + i) * 2 + 1] = static_cast<float>(std::sin(p * std::pow(10000.0, -2.0 * i / D)));
    }
  return cs;
}

inline const DType kTypes[] = {DType::F32, DType::BF16};


// A small model of two heads (vocabulary 101, MLP 40) for the graph tests.
inline ModelConfig graph_test_config(int64_t hidden, int64_t layers) {
  ModelConfig cfg;
  cfg.name = "graph_test";
  cfg.vocab_size = 101;
  cfg.hidden_size = hidden;
  cfg.intermediate_size = 40;
  cfg.num_hidden_layers = layers;
  cfg.num_attention_heads = 2;
  cfg.max_position_embeddings = 32;
  return cfg;
}
// A small run config for the optimizer-update tests: a layer of 32, the given optimizer, a
// warm-up and cosine schedule over 5 updates, clipping at `clip`, stochastic rounding.
inline RunConfig update_test_run(const std::string& optimizer, double clip) {
  const json j = json::parse(R"({
    "model": {"config": {"vocab_size": 101, "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 1,
                         "num_attention_heads": 2, "max_position_embeddings": 32}},
    "batch": {"global_batch": 2, "micro_batch": 2, "seq_len": 19},
    "schedule": {"total_steps": 5, "warmup_steps": 1},
    "optimizer": {"momentum": 0.9, "rounding": "stochastic"}})");
  return run_config_from_json(j, "test", {"optimizer.name=" + optimizer, "optimizer.grad_clip=" + std::to_string(clip)});
}

// Weight dtype, gradient dtype: the three pairs the optimizer seam supports.
inline const std::pair<DType, DType> kWeightGrad[] = {{DType::F32, DType::F32}, {DType::BF16, DType::BF16}, {DType::BF16, DType::F32}};

}  // namespace cuda_test
