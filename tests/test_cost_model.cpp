// The cost model of the CUDA kernels (kernel_costs.h): it names the kernels the backend launches,
// as many times, and its roofline.
#include "cuda_vs_cpu.h"

using namespace multinorm;
using namespace multinorm::testing;
using namespace cuda_test;

// The cost model (kernel_costs.h, what `bench model --predict` and the measured table's byte and
// FLOP columns come from) names the kernels the CUDA backend launches, as many times: checked
// against the emulated backend's profiler for a micro-batch (tensor-core attention at D = 64, the
// SIMT kernels at D = 16) and an update of every optimizer, clipped (the recorder's norm is huge).
// SWAN with its default tolerance, with FP32 and with split TF32 products: the device runs every one of its steps whichever matrices are done
// (swan.cu), so the launches do not depend on the data. Its GEMM FLOPs equal the model's own
// list of a step's GEMMs (training_step_gemms), an independent enumeration.
TEST(CudaBackend, CostModelLaunchesWhatTheBackendLaunches) {
  const CudaProbe* p = cuda_plugin();
  if (!p) GTEST_SKIP() << "no CUDA plugin";
  auto be = make_cuda_backend(*p);
  for (const int64_t hidden : {128, 32}) {  // 2 heads: D = 64 (mma.sync) and 16 (SIMT)
    // "F41": an MLP width off 16 bytes (82-byte BF16 rows): its activations and the down projection's
    // arena rows padded, Adam and SGD on that weight through dense copies (elementwise_padded)
    for (const std::string variant : {"sinkgd", "swan", "swan split_tf32", "adam", "sgd", "adam F41", "sgd F41", "sinkgd F41", "swan F41"}) {
      const bool f41 = variant.size() > 4 && variant.substr(variant.size() - 4) == " F41";
      const std::string base = f41 ? variant.substr(0, variant.size() - 4) : variant;
      const std::string name = base.substr(0, base.find(' ')), products = base == name ? "auto" : base.substr(name.size() + 1);
      const json j = json::parse(std::string(R"({
        "model": {"config": {"vocab_size": 101, "hidden_size": )") + std::to_string(hidden) + R"(, "intermediate_size": )" + (f41 ? "41" : "40") + R"(,
                             "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 32}},
        "batch": {"global_batch": 2, "micro_batch": 2, "seq_len": 19},
        "optimizer": {"name": ")" + name + R"(", "grad_clip": 0.5, "momentum": 0.9,
                      "swan": {"ns_steps": 6, "ns_products": ")" + products + R"("}}})");
      const RunConfig run = run_config_from_json(j, "test");
      std::vector<int32_t> tokens = random_ids(38, 101, 21), targets = random_ids(38, 101, 22);
      const MicroBatch mb{tokens.data(), targets.data(), nullptr, 2, 19};
      auto measure = [&](Backend& b) {
        LlamaModel m(b, run.model, DType::BF16, 2, 19);
        m.init_random(4);
        Optimizer o(m.store(), run);
        b.set_profiling(true);
        b.take_profile();
        if (b.name() == "cost-recorder") take_kernel_costs(b);
        m.queue_forward_backward(mb, 0.5f);
        std::vector<std::map<std::string, int64_t>> launches(2);
        std::vector<double> gemm_flops(2, 0.0);
        auto collect = [&](int phase) {
          if (b.name() == "cost-recorder") {
            for (const KernelCost& k : take_kernel_costs(b)) {
              if (k.name != "memset") launches[phase][k.name] = k.launches;  // a memset is not a kernel launch
              if (k.unit == CostUnit::GemmTensorCore) gemm_flops[phase] += k.flops;
            }
          } else {
            for (const KernelTime& t : b.take_profile()) launches[phase][t.name] = t.launches;
          }
        };
        collect(0);
        o.step(1, 1);
        collect(1);
        b.set_profiling(false);
        return std::make_pair(launches, gemm_flops);
      };
      auto rec = make_cost_recorder();
      const auto [predicted, flops] = measure(*rec);
      const auto [launched, unused] = measure(*be);
      (void)unused;
      EXPECT_EQ(predicted[0], launched[0]) << variant << ", hidden " << hidden << ": a micro-batch's kernels";
      EXPECT_EQ(predicted[1], launched[1]) << variant << ", hidden " << hidden << ": an update's kernels";
      if (hidden == 128) {
        EXPECT_TRUE(predicted[0].count("attention_forward_mma")) << "the tensor-core path";
      }
      double expected = 0;
      for (const GemmShape& g : training_step_gemms(run.model, 38)) expected += 2.0 * g.M * g.N * g.K * g.count;
      // (F41: the down projection's GEMMs run over the zero padding, cuda_scratch::gemm_extents: more)
      if (f41) EXPECT_GT(flops[0], expected) << variant << ", hidden " << hidden << ": GEMM FLOPs of a micro-batch";
      else EXPECT_DOUBLE_EQ(flops[0], expected) << variant << ", hidden " << hidden << ": GEMM FLOPs of a micro-batch";
    }
  }
}

// The roofline: a kernel's time is the larger of its compute and memory times at the assumed fractions.
TEST(CostModel, RooflineTakesTheLargerOfComputeAndMemoryTime) {
  const DevicePeak* a100 = find_device_peak("a100");
  ASSERT_NE(a100, nullptr);
  EXPECT_EQ(find_device_peak("v100"), nullptr);
  RooflineAssumptions a;  // GEMMs 70%, memory 80%
  const KernelCost copy{"convert", CostUnit::Memory, 1, 2039e9 * 0.8 * 1e-3, 0};  // 1 ms of bandwidth
  EXPECT_NEAR(roofline_seconds(copy, *a100, a), 1e-3, 1e-12);
  EXPECT_TRUE(roofline_memory_bound(copy, *a100, a));
  const KernelCost gemm{"gemm bf16 (cuBLASLt)", CostUnit::GemmTensorCore, 1, 1e6, 312e12 * 0.7 * 2e-3};  // 2 ms of FLOPs
  EXPECT_NEAR(roofline_seconds(gemm, *a100, a), 2e-3, 1e-12);
  EXPECT_FALSE(roofline_memory_bound(gemm, *a100, a));
}
