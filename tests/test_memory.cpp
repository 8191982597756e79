// The paper's MEM column (weights + optimizer states, BF16, GiB) and the activation plan.
#include <gtest/gtest.h>

#include "multinorm/llama_model.h"
#include "multinorm/memory_estimate.h"
#include "multinorm/optimizer.h"
#include "multinorm/process_memory.h"
#include "test_backends.h"
#include "test_util.h"

#include <fcntl.h>
#include <sys/mman.h>

#include <cstring>
#include <memory>

using namespace multinorm;

static ModelConfig paper_config(const std::string& name) {
  return load_model_config(std::string(MULTINORM_CONFIGS_DIR) + "/models/" + name + ".json");
}

TEST(Memory, ReproducesThePapersMemColumn) {
  // Table 1 of the paper: Adam / SinkGD-SWAN. The paper rounds inconsistently (350M Adam is
  // 2.056 GiB exactly, printed 2.05G): 0.01 GiB is the tolerance the issue states.
  struct Row { const char* model; double adam, multinorm; };
  for (const Row& r : {Row{"llama_60m", 0.32, 0.23}, Row{"llama_130m", 0.75, 0.43}, Row{"llama_350m", 2.05, 0.93},
                       Row{"llama_1b", 7.48, 2.98}}) {
    const auto table = paper_memory_table(paper_config(r.model));
    ASSERT_EQ(table.size(), 3u);
    EXPECT_EQ(table[0].label, "adam");
    EXPECT_NEAR(table[0].total() / kGiB, r.adam, 0.01) << r.model;
    EXPECT_NEAR(table[1].total() / kGiB, r.multinorm, 0.01) << r.model;  // sinkgd
    EXPECT_NEAR(table[2].total() / kGiB, r.multinorm, 0.01) << r.model;  // swan
    EXPECT_EQ(table[1].matrix_state_bytes, 0) << "SinkGD keeps no state for matrix parameters";
    EXPECT_EQ(table[2].matrix_state_bytes, 0);
    EXPECT_GT(table[0].matrix_state_bytes, 0);
  }
  // Exact bytes for 60M: 58,073,600 params x (2 weight + 4 Adam) bytes.
  const auto t60 = paper_memory_table(paper_config("llama_60m"));
  EXPECT_EQ(t60[0].total(), 58073600LL * 6);
  EXPECT_EQ(t60[1].total(), 58073600LL * 2 + (2LL * 32000 * 512 + 17 * 512) * 4);
}

TEST(Memory, ActivationPlanSizes) {
  ModelConfig m;
  m.vocab_size = 100;
  m.hidden_size = 8;
  m.intermediate_size = 12;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 2;
  const int64_t B = 3, T = 5, BT = 15, C = 8, F = 12, V = 100, H = 2;
  const ActivationPlan p = plan_activations(m, B, T, DType::BF16);
  // Per layer: act: input, ln1, attn_out, mid, ln2 (5 BT*C) + qkv 3 BT*C + gate_up 2 BT*F;
  // f32: two rstd (BT each) + lse (B*H*T).
  auto al = [](int64_t bytes) { return (bytes + 63) / 64 * 64; };  // every buffer 64-byte aligned
  const int64_t per_layer = 5 * al(2 * BT * C) + al(2 * 3 * BT * C) + al(2 * 2 * BT * F) + 2 * al(4 * BT) + al(4 * B * H * T);
  // Head: R = min(BT, kHeadChunkRows) = BT rows here: logits f32 + d_logits bf16.
  const int64_t final_saved = 2 * al(2 * BT * C) + al(4 * BT) + al(4 * BT * V) + al(2 * BT * V) + al(4 * BT);
  EXPECT_EQ(p.saved_bytes(), 2 * per_layer + final_saved);
  const int64_t scratch = 2 * al(4 * BT * C) + 2 * al(2 * BT * C) + al(2 * 3 * BT * C) + 2 * al(2 * BT * F) + al(2 * 2 * BT * F);
  EXPECT_EQ(p.scratch_bytes(), scratch);
  EXPECT_EQ(p.offset_bytes("layers.0.input"), 0);
  EXPECT_EQ(p.offset_bytes("layers.0.ln1"), al(2 * BT * C));
  // The head is chunked: the logits buffer does not grow with the micro-batch past kHeadChunkRows.
  EXPECT_EQ(plan_activations(m, 64, 256, DType::BF16).find("logits").elements, kHeadChunkRows * V);
  EXPECT_EQ(plan_activations(m, B, T, DType::F32).bytes() > p.bytes(), true);
  // A backend that fuses the loss head and SwiGLU's backward: logits keeps kFusedLogitsRows rows, or
  // an 8-column chunk of every row when that is more (the CUDA head's narrowest chunk; V = 100 is
  // under R / 8 = 128), and d_swiglu goes; with FP32 activations logits is d_logits too and keeps its
  // rows.
  const ActivationLayout both{true, true};
  const ActivationPlan big = plan_activations(m, 64, 256, DType::BF16), fused = plan_activations(m, 64, 256, DType::BF16, both);
  EXPECT_EQ(fused.find("logits").elements, 8 * kHeadChunkRows);
  EXPECT_FALSE(fused.has("d_swiglu"));
  EXPECT_TRUE(big.has("d_swiglu"));
  EXPECT_EQ(big.bytes() - fused.bytes(), al(4 * kHeadChunkRows * V) - al(4 * 8 * kHeadChunkRows) + al(2 * 64 * 256 * F));
  EXPECT_EQ(plan_activations(m, B, T, DType::F32, both).find("logits").elements, BT * V);
  ModelConfig wide = m;  // past R / 8: kFusedLogitsRows rows
  wide.vocab_size = 1000;
  EXPECT_EQ(plan_activations(wide, 64, 256, DType::BF16, both).find("logits").elements, kFusedLogitsRows * 1000);
}

// The CPU backend's scratch after a training step and an optimizer update (the packed GEMM's buffers
// included, on CPUs with AMX or AVX512_BF16) equals the estimate
// `multinorm info` prints, for SinkGD and SWAN (both paths), BF16 and FP32.
// The same on the CUDA backend (the emulated build): its device scratch after a training step and
// an optimizer update is the plan `multinorm info` and the run log print, for SinkGD, SWAN and Adam.
TEST(Memory, CudaBackendScratchPlanIsWhatItAllocates) {
  const CudaProbe* p = multinorm::testing::test_cuda_plugin();
  if (!p) GTEST_SKIP() << "no CUDA plugin";
  // Adam and SinkGD also with an MLP width of 41 (rows of 82 bytes in BF16, as llama_1b's 5461: the
  // MLP's activations and the down projection's rows in the arenas padded to 128 bytes, Adam's rule on
  // it through dense copies), Adam so in FP32 too (the loss head unfused); SWAN also with split TF32
  // products (six more k x k matrices a tensor: a plan larger than FP32's, checked below). The
  // weights' and gradients' bytes are the arenas' (their padding included).
  int64_t swan_fp32_scratch = 0;
  for (const std::string opt : {"sinkgd", "swan", "swan split", "adam", "adam F41", "adam F41 fp32", "sinkgd F41"}) {
    json j = json::parse(R"({"model": {"config": {"vocab_size": 50, "hidden_size": 16, "intermediate_size": 40,
      "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 16}},
      "batch": {"global_batch": 3, "micro_batch": 3, "seq_len": 7}, "backend": "cuda"})");
    j["optimizer"]["name"] = opt.substr(0, opt.find(' '));
    if (opt.find("F41") != std::string::npos) j["model"]["config"]["intermediate_size"] = 41;
    if (opt.find("fp32") != std::string::npos) j["precision"]["params"] = "fp32";
    if (opt == "swan split") j["optimizer"]["swan"]["ns_products"] = "split_tf32";
    const RunConfig run = run_config_from_json(j, "test");
    auto be = make_cuda_backend(*p);
    LlamaModel model(*be, run.model, run.precision.params, 3, 7);
    model.init_random(1);
    Optimizer optimizer(model.store(), run);
    std::vector<int32_t> tokens(21), targets(21);
    for (int i = 0; i < 21; ++i) tokens[i] = (i * 7) % 50, targets[i] = (i * 11) % 50;
    model.forward_backward({tokens.data(), targets.data(), nullptr, 3, 7}, 1.0f / 21);
    optimizer.step(1, 1);
    const TrainingMemory tm = training_memory(run, true);
    EXPECT_TRUE(tm.cuda);
    EXPECT_EQ(be->workspace_bytes(), tm.backend_scratch) << opt;
    EXPECT_EQ(model.activation_bytes(), tm.activations) << opt;
    EXPECT_EQ(optimizer.state_bytes(), tm.states) << opt;
    EXPECT_EQ(model.store().arena_elements() * dtype_bytes(run.precision.params), tm.weights) << opt;
    EXPECT_EQ(model.store().arena_elements() * dtype_bytes(run.precision.grads), tm.grads) << opt;
    EXPECT_EQ(model.store().arena_elements() > model.num_params(), opt.find("F41") != std::string::npos) << opt;
    if (opt == "swan") swan_fp32_scratch = tm.backend_scratch;
    if (opt == "swan split") {
      EXPECT_GT(tm.backend_scratch, swan_fp32_scratch);
    }
  }
}

TEST(Memory, BackendScratchEstimateIsTheWorkspace) {
  for (const char* opt : {"sinkgd", "swan", "swan-eigh"}) {
    for (DType dt : {DType::BF16, DType::F32}) {
      const bool eigh = std::string(opt) == "swan-eigh";
      json j = json::parse(R"({"model": {"config": {"vocab_size": 50, "hidden_size": 16, "intermediate_size": 40,
        "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 16}},
        "batch": {"global_batch": 3, "micro_batch": 3, "seq_len": 7}, "threads": 2})");
      j["optimizer"]["name"] = eigh ? "swan" : opt;
      if (eigh) j["optimizer"]["swan"]["whitening"] = "eigh";
      j["precision"]["params"] = dt == DType::BF16 ? "bf16" : "fp32";
      const RunConfig run = run_config_from_json(j, "test");
      auto be = make_cpu_backend(2);
      LlamaModel model(*be, run.model, run.precision.params, 3, 7);
      model.init_random(1);
      Optimizer optimizer(model.store(), run);
      std::vector<int32_t> tokens(21), targets(21);
      for (int i = 0; i < 21; ++i) tokens[i] = (i * 7) % 50, targets[i] = (i * 11) % 50;
      model.forward_backward({tokens.data(), targets.data(), nullptr, 3, 7}, 1.0f / 21);
      optimizer.step(1, 1);
      EXPECT_EQ(be->workspace_bytes(), training_memory(run).backend_scratch) << opt << " " << dtype_name(dt);
      // The model's arena is the estimate's plan: the same fused kernels leave the same scratch out.
      EXPECT_EQ(model.activation_bytes(), training_memory(run).activations) << opt << " " << dtype_name(dt);
    }
  }
}

TEST(Memory, ProcessMemoryTellsMappedFilesFromAllocations) {
  // A training run maps its token shards: their pages count in RSS as the run reads them, and must
  // not read as the process's own memory. 32 MiB of a mapped file, then 32 MiB of heap, each touched.
  constexpr int64_t kMiB = 1 << 20, kBytes = 32 * kMiB;
  multinorm::testing::TempDir dir;
  const std::string path = dir.path() + "/mapped.bin";
  {
    std::ofstream out(path, std::ios::binary);
    const std::string block(kMiB, '\x5a');
    for (int i = 0; i < kBytes / kMiB; ++i) out << block;
  }
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  void* map = ::mmap(nullptr, kBytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  ASSERT_NE(map, MAP_FAILED);
  const ProcessMemory before = process_memory();
  ASSERT_GT(before.resident_bytes, 0) << "/proc/self/statm unreadable";
  volatile unsigned sum = 0;
  for (int64_t off = 0; off < kBytes; off += 4096) sum = sum + static_cast<const unsigned char*>(map)[off];
  const ProcessMemory mapped = process_memory();
  // Every page of the file is now resident and file-backed; the anonymous part does not move (measured:
  // +32.00 to +32.06 MiB file-backed, 0 anonymous; the bound leaves room for the test's own allocations).
  EXPECT_GE(mapped.file_backed_bytes - before.file_backed_bytes, kBytes);
  EXPECT_GE(mapped.resident_bytes - before.resident_bytes, kBytes);
  EXPECT_LT(std::abs(mapped.anonymous_bytes() - before.anonymous_bytes()), 2 * kMiB);
  ::munmap(map, kBytes);

  const ProcessMemory unmapped = process_memory();
  std::unique_ptr<char[]> heap(new char[kBytes]);
  std::memset(heap.get(), 1, kBytes);
  const ProcessMemory allocated = process_memory();
  // Measured: +32.004 MiB anonymous (the allocation's header page), 0 file-backed.
  EXPECT_GE(allocated.anonymous_bytes() - unmapped.anonymous_bytes(), kBytes);
  EXPECT_LT(std::abs(allocated.file_backed_bytes - unmapped.file_backed_bytes), 2 * kMiB);
  EXPECT_EQ(sum, static_cast<unsigned>(kBytes / 4096 * 0x5a)) << "one byte of every mapped page was read";
}
