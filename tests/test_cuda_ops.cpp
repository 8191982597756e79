// The CUDA backend's ops against the CPU backend's (itself verified against FP64 references and
// PyTorch): every op on small, awkward shapes (odd widths, T not a multiple of a tile, 5461-wide
// GEMMs), FP32 and BF16, then the whole model's forward and backward (cuda_vs_cpu.h: the modes and
// the tolerances).
#include "cuda_vs_cpu.h"
#include "multinorm/cuda_scratch.h"
#include "multinorm/llama_model.h"

using namespace multinorm;
using namespace multinorm::testing;
using namespace cuda_test;

// Each backend's GEMM against the exact product of the stored operands (FP64), within a bound that
// FP32 accumulation over K terms meets in any summation order, on any hardware: Higham and Mary's
// probabilistic bound (SIAM J. Sci. Comput. 41(5), 2019), |computed - exact| <= lambda sqrt(K) u
// sum_k |a_ik b_kj|, u = 2^-24, which holds with probability >= 1 - 2 exp(-lambda^2 / 2) per element
// when the rounding errors are independent: lambda = 6 (1 - 3e-8). Plus, with accumulate, the
// rounding of adding the old output (u |c|), and for a BF16 output its rounding (2^-8 of the result:
// the FP32 value may round either way). Two implementations (the CPU's blocked AMX/AVX512 sums, the
// GPU's tensor-core tiles) may each sit anywhere inside it; the worst-case bound (K u sum |a b|) is
// about sqrt(K) / 6 times larger and would let a dropped term pass at K = 5461.
// Measured (MULTINORM_TEST_ERRORS=1), the worst element's error over its bound: FP32 outputs at
// 5 x 6 x 5461 2.7e-3 (CPU) and 5.7e-3 (emulated CUDA), at K = 9 and 11 up to 0.20; BF16 outputs up
// to 0.995, the output's rounding (half an ulp is its term's whole size, met where a value sits just
// above a power of two). One H100, 2026-11-27: 1.69e-3 against the CPU at 5 x 6 x 5461, about 2% of
// the bound there (sum |a b| ~ 3,500 at K = 5461 for normal operands).
// `product_rounded`: a BF16 output may hold the old output plus the product already rounded to BF16
// (as PyTorch's `x + a @ b` does), so that rounding, half an ulp of the product, is in the bound too:
// what a GPU's in-place accumulation gave (ResidualProjectionReadsTheResidualAsTheGemmsAddend). Which
// cuBLASLt kernel does so depends on the shape: on an H200 (2026-11-28) 3 x 5456 x 9 and
// 16 x 16 x 27 did, each failing element exactly bf16(bf16(a b) + c) (1.07x to 2.5x the one-rounding
// bound), where 3 x 5461 x 9 in one GEMM had rounded once, and an unsplit 5 x 41 x 40 (the residual
// test's copy) did too. Tests of accumulating BF16 GEMMs allow it on a GPU, split or not.
static ::testing::AssertionResult gemm_within_bound(const Vec& out, const Vec& a, const Vec& b, const Vec& before, int64_t M, int64_t N, int64_t K,
                                                    bool ta, bool tb, bool acc, DType out_type, bool product_rounded = false) {
  constexpr double kLambda = 6.0, kU = 1.0 / (1 << 24);
  double worst = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double exact = 0, magnitude = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = (ta ? a[k * M + i] : a[i * K + k]) * (tb ? b[j * K + k] : b[k * N + j]);
        exact += p, magnitude += std::fabs(p);
      }
      double bound = kLambda * std::sqrt(double(K)) * kU * magnitude;
      if (out_type == DType::BF16 && product_rounded) bound += std::ldexp(std::fabs(exact) + bound, -8);
      if (acc) exact += before[i * N + j], bound += kU * std::fabs(exact);
      // BF16 output: the FP32 result y rounds to within half a BF16 ulp, 2^-8 |y| at most, and
      // |y| <= |exact| + bound
      if (out_type == DType::BF16) bound += std::ldexp(std::fabs(exact) + bound, -8);
      const double e = std::fabs(out[i * N + j] - exact);
      worst = std::max(worst, e / bound);
      if (!(e <= bound))
        return ::testing::AssertionFailure() << "element (" << i << ", " << j << "): " << out[i * N + j] << ", exactly " << exact << ": error " << e
                                             << " over the bound " << bound << " (sum |a b| = " << magnitude << ")";
    }
  if (std::getenv("MULTINORM_TEST_ERRORS"))
    std::printf("[ measured ] gemm %lldx%lldx%lld %s out: %.3g of the bound\n", (long long)M, (long long)N, (long long)K, dtype_name(out_type), worst);
  return ::testing::AssertionSuccess();
}

TEST_P(CudaVsCpu, MatmulLayoutsAccumulateAndOddWidths) {
  struct Shape {
    int64_t M, N, K;
  };
  // 5461: the 1B model's intermediate size (odd: no row is 16-byte aligned in BF16)
  for (const Shape s : {Shape{7, 5, 11}, Shape{3, 5461, 9}, Shape{5, 6, 5461}}) {
    for (DType in : kTypes)
      for (DType out : kTypes) {
        if (in == DType::F32 && out == DType::BF16) continue;  // not a path of the seam
        for (int ta = 0; ta < 2; ++ta)
          for (int tb = 0; tb < 2; ++tb)
            for (int acc = 0; acc < 2; ++acc) {
              Pair a(*cpu, *cuda, random_vec(s.M * s.K, 1), in), b(*cpu, *cuda, random_vec(s.K * s.N, 2), in),
                  o(*cpu, *cuda, random_vec(s.M * s.N, 3), out);
              const Vec av = a.c.get(), bv = b.c.get(), before = o.c.get();  // the stored (rounded) values
              cpu->matmul(o.c.buf(), a.c.buf(), b.c.buf(), s.M, s.N, s.K, ta, tb, acc);
              cuda->matmul(o.g.buf(), a.g.buf(), b.g.buf(), s.M, s.N, s.K, ta, tb, acc);
              const std::string what = std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K) + " ta " + std::to_string(ta) +
                                       " tb " + std::to_string(tb) + " acc " + std::to_string(acc) + " in " + dtype_name(in) + " out " + dtype_name(out);
              EXPECT_TRUE(gemm_within_bound(o.g.get(), av, bv, before, s.M, s.N, s.K, ta, tb, acc, out, acc && !cuda_plugin()->emulated))
                  << "cuda " << what;
              EXPECT_TRUE(gemm_within_bound(o.c.get(), av, bv, before, s.M, s.N, s.K, ta, tb, acc, out)) << "cpu " << what;
            }
      }
  }
}

// A residual projection (out = residual + a b^T) on the CUDA backend reads the residual as cuBLASLt's
// addend: no convert launched, the residual untouched; a residual whose base is off 16 bytes, or an
// output whose rows are (staged through 128-byte rows: N = 41), takes the copy (the residual copied
// into out, then the accumulating GEMM: the Backend's default). Both within the GEMM bound of the
// exact sum, as the CPU's. In the emulated build the two give the same bits. On a GPU they need not:
// an H200 (cuBLASLt of CUDA 13, 2026-11-28) gave the copy's in-place accumulation (C = D, BF16)
// results as if the product were rounded to BF16 before the old output was added (PyTorch's
// `x + a @ b`): 0.0304 from the exact -6.2804, 0.0025 from -0.0337 (10 ulps of the result, half an
// ulp of the product), where the addend's single rounding stayed within 0.99 of its bound. There
// the copy is held to the bound of that double rounding.
TEST_P(CudaVsCpu, ResidualProjectionReadsTheResidualAsTheGemmsAddend) {
  const int64_t M = 5, K = 40;
  for (int64_t N : {64, 41})
    for (DType t : kTypes)
      for (int64_t offset : {0, 1}) {  // elements into the residual's buffer
        Pair a(*cpu, *cuda, random_vec(M * K, 1), t), b(*cpu, *cuda, random_vec(N * K, 2), t), r(*cpu, *cuda, random_vec(M * N + offset, 3), t),
            fused(*cpu, *cuda, Vec(M * N, 0.0), t), unfused(*cpu, *cuda, Vec(M * N, 0.0), t);
        const Vec before = r.c.get();
        const Buf rg = r.g.buf().at(offset), rc = r.c.buf().at(offset);
        cuda->set_profiling(true);
        cuda->take_profile();
        cuda->matmul_residual(fused.g.buf(), rg, a.g.buf(), b.g.buf(), M, N, K, false, true);
        int64_t converts = 0;
        for (const KernelTime& k : cuda->take_profile())
          if (k.name == "convert") converts += k.launches;
        cuda->set_profiling(false);
        const std::string what = std::string(dtype_name(t)) + " N " + std::to_string(N) + " offset " + std::to_string(offset);
        const bool out_staged = (N * dtype_bytes(t)) % 16 != 0;
        EXPECT_EQ(converts, offset || out_staged ? 1 : 0) << what;
        cuda->Backend::matmul_residual(unfused.g.buf(), rg, a.g.buf(), b.g.buf(), M, N, K, false, true);
        const bool emulated = cuda_plugin()->emulated;
        if (emulated) {
          EXPECT_EQ(fused.g.get(), unfused.g.get()) << what;
        }
        EXPECT_EQ(r.g.get(), before) << what;
        cpu->matmul_residual(fused.c.buf(), rc, a.c.buf(), b.c.buf(), M, N, K, false, true);
        const Vec residual(before.begin() + offset, before.end());
        const bool copy_rounds_product = !emulated;  // the copy's in-place accumulation on a GPU: above
        EXPECT_TRUE(gemm_within_bound(fused.g.get(), a.c.get(), b.c.get(), residual, M, N, K, false, true, true, t,
                                      (offset || out_staged) && copy_rounds_product))
            << "cuda " << what;
        EXPECT_TRUE(gemm_within_bound(unfused.g.get(), a.c.get(), b.c.get(), residual, M, N, K, false, true, true, t, copy_rounds_product))
            << "cuda, the default " << what;
        EXPECT_TRUE(gemm_within_bound(fused.c.get(), a.c.get(), b.c.get(), residual, M, N, K, false, true, true, t)) << "cpu " << what;
      }
}

// cuBLASLt runs slowly on operands whose rows or base are off 16 bytes (llama_1b's MLP width 5461 in
// BF16: 133 TFLOP/s against 725 on an H100). The backend stages such an operand through 128-byte rows
// (cuda_scratch::gemm_staging, a copy_rows launch each way): the same product, within the FP32
// bound, and no staging where every operand is aligned.
TEST_P(CudaVsCpu, GemmOperandsOffSixteenBytesAreStagedThroughAlignedRows) {
  struct Case {
    int64_t M, N, K;
    bool ta, tb, acc;
    int64_t offset;  // elements into the buffers: a base off 16 bytes
    int copies;      // copy_rows launches expected
  };
  const Case cases[] = {
      {16, 64, 32, false, true, false, 0, 0},   // every row 64 or 128 bytes: nothing staged
      {5, 6, 5461, false, true, false, 0, 3},   // a and b rows of 5461, out rows of 6: three copies in, out back
      {5, 6, 5461, false, true, true, 0, 4},    // accumulating: out copied in too
      {8, 5461, 16, false, false, false, 0, 2}, // b and out rows of 5461
      {16, 64, 32, false, true, false, 1, 3},   // aligned widths, bases 2 bytes off: a and b in, out back
  };
  for (const Case& c : cases) {
    const int64_t pad = c.offset;
    Pair a(*cpu, *cuda, random_vec(c.M * c.K + pad, 1), DType::BF16), b(*cpu, *cuda, random_vec(c.K * c.N + pad, 2), DType::BF16),
        o(*cpu, *cuda, random_vec(c.M * c.N + pad, 3), DType::BF16);
    const Vec av = a.c.get(), bv = b.c.get(), before = o.c.get();
    cuda->set_profiling(true);
    cuda->take_profile();
    cuda->matmul(o.g.buf().at(pad), a.g.buf().at(pad), b.g.buf().at(pad), c.M, c.N, c.K, c.ta, c.tb, c.acc);
    int copies = 0;
    for (const KernelTime& t : cuda->take_profile())
      if (t.name == "copy_rows") copies += static_cast<int>(t.launches);
    cuda->set_profiling(false);
    const std::string what = std::to_string(c.M) + "x" + std::to_string(c.N) + "x" + std::to_string(c.K) + (c.acc ? " acc" : "") + " offset " +
                             std::to_string(pad);
    EXPECT_EQ(copies, c.copies) << what;
    const Vec got = o.g.get();
    auto tail = [pad](const Vec& v) { return Vec(v.begin() + pad, v.end()); };
    EXPECT_TRUE(gemm_within_bound(tail(got), tail(av), tail(bv), tail(before), c.M, c.N, c.K, c.ta, c.tb, c.acc, DType::BF16)) << what;
    for (int64_t i = 0; i < pad; ++i) EXPECT_EQ(got[i], before[i]) << what << ": an element before the output was written";
  }
}

// An accumulating GEMM whose FP32 output is staged (the down projection's weight gradient, rows of
// F = 5461 floats) writes the staged copy afresh and adds it back into out (cuda_scratch::
// gemm_adds_back): out is never copied in, only b (rows of 5461 BF16) is; the sum within the FP32
// accumulation bound of out's values before plus the product. The emulated scratch starts as NaN: a
// staged element the GEMM left unwritten would show.
TEST_P(CudaVsCpu, AnAccumulatingFp32OutputStagedIsWrittenAfreshAndAddedBack) {
  const int64_t M = 8, N = 5461, K = 16;  // dW[M, N] += dy^T s: a stored [K, M], b [K, N]
  Pair a(*cpu, *cuda, random_vec(K * M, 1), DType::BF16), b(*cpu, *cuda, random_vec(K * N, 2), DType::BF16), o(*cpu, *cuda, random_vec(M * N, 3), DType::F32);
  const Vec av = a.c.get(), bv = b.c.get(), before = o.c.get();
  cuda->set_profiling(true);
  cuda->take_profile();
  cuda->matmul(o.g.buf(), a.g.buf(), b.g.buf(), M, N, K, true, false, true);
  std::map<std::string, int64_t> launches;
  for (const KernelTime& t : cuda->take_profile()) launches[t.name] += t.launches;
  cuda->set_profiling(false);
  EXPECT_EQ(launches["copy_rows"], 1);  // b in; out neither in nor back
  EXPECT_EQ(launches["add_rows"], 1);
  EXPECT_TRUE(gemm_within_bound(o.g.get(), av, bv, before, M, N, K, true, false, true, DType::F32));
  // In a model with FP32 gradients of BF16 weights at F = 41 (dW_down's rows 164 bytes) the down
  // projection's weight and gradient have rows of 64 elements in the arenas (layout_arena: 128 bytes
  // BF16, 256 FP32): over two micro-batches' accumulation no operand is staged and nothing is added
  // back; the gradients as the CPU backend's with FP32 gradients (BF16 activations: 5e-2 of each
  // tensor's largest, ModelForwardBackwardMatchesTheCpuBackend's bound; measured 8.3e-3).
  ModelConfig cfg;
  cfg.vocab_size = 64, cfg.hidden_size = 32, cfg.intermediate_size = 41, cfg.num_hidden_layers = 2, cfg.num_attention_heads = 2;
  cfg.max_position_embeddings = 16;
  const int64_t B = 2, T = 8;
  const std::vector<int32_t> tokens = random_ids(B * T, 64, 4), targets = random_ids(B * T, 64, 5);
  LlamaModel mc(*cpu, cfg, DType::BF16, B, T, DType::F32), mg(*cuda, cfg, DType::BF16, B, T, DType::F32);
  mc.init_random(7);
  mg.params_from_host(mc.params_to_host());
  cuda->set_profiling(true);
  cuda->take_profile();
  for (LlamaModel* m : {&mc, &mg})
    for (int pass = 0; pass < 2; ++pass) m->forward_backward({tokens.data(), targets.data(), nullptr, B, T}, 1.0f / (B * T));
  launches.clear();
  for (const KernelTime& t : cuda->take_profile()) launches[t.name] += t.launches;
  cuda->set_profiling(false);
  EXPECT_EQ(mg.store().tensor("model.layers.0.mlp.down_proj.weight").arena_ld, 64);
  EXPECT_EQ(launches["copy_rows"], 0);
  EXPECT_EQ(launches["add_rows"], 0);
  const std::vector<float> gc = mc.grads_to_host(), gg = mg.grads_to_host();
  for (const auto& t : mc.tensors()) {
    const Vec a(gg.begin() + t.offset, gg.begin() + t.offset + t.numel()), e(gc.begin() + t.offset, gc.begin() + t.offset + t.numel());
    EXPECT_TRUE(close(a, e, 5e-2)) << t.name;
  }
}

// The CUDA plan pads the MLP's activations (gate_up, swiglu and their gradients) to 128-byte rows
// where F's rows are off 16 bytes (ActivationLayout::pad_mlp_rows), gate_up's up half on a 16-byte
// pack, and the arenas the down projection's weight and gradient (layout_arena), so their GEMMs (the
// gate/up projection's by halves: Linear::halves) and SwiGLU take them as they are: at F = 41 no
// operand is staged; the CPU's plan and arenas stay dense; both give the same training step
// (ModelForwardBackwardMatchesTheCpuBackend compares them at F = 86, tests/cuda_training.sh trains at 86).
TEST_P(CudaVsCpu, PaddedMlpRowsAndArenaRowsStageNoOperand) {
  ModelConfig cfg;
  cfg.name = "padded_mlp";
  cfg.vocab_size = 64;
  cfg.hidden_size = 32;
  cfg.intermediate_size = 41;  // 82-byte BF16 rows
  cfg.num_hidden_layers = 2;
  cfg.num_attention_heads = 2;
  cfg.max_position_embeddings = 16;
  const int64_t B = 2, T = 8;
  const ActivationPlan gpu_plan = plan_activations(cfg, B, T, DType::BF16, cuda->activation_layout(DType::BF16));
  const ActivationPlan cpu_plan = plan_activations(cfg, B, T, DType::BF16, cpu->activation_layout(DType::BF16));
  for (const char* name : {"layers.0.gate_up", "swiglu", "d_swiglu", "d_gate_up"}) {
    const int64_t width = std::string(name).find("gate_up") != std::string::npos ? 82 : 41;
    EXPECT_EQ(gpu_plan.find(name).ld, width == 82 ? 128 : 64) << name;  // 128-byte rows: 64 BF16 elements
    EXPECT_EQ(gpu_plan.find(name).elements, B * T * gpu_plan.find(name).ld) << name;
    if (cpu_plan.has(name)) {  // (the CPU may fuse d_swiglu away)
      EXPECT_EQ(cpu_plan.find(name).ld, 0) << name;
    }
  }
  EXPECT_EQ(gpu_plan.find("layers.0.ln2").ld, 0);
  std::vector<int32_t> tokens = random_ids(B * T, 64, 4), targets = random_ids(B * T, 64, 5);
  LlamaModel mc(*cpu, cfg, DType::BF16, B, T), mg(*cuda, cfg, DType::BF16, B, T);
  mc.init_random(7);
  mg.params_from_host(mc.params_to_host());
  cuda->set_profiling(true);
  cuda->take_profile();
  mg.forward_backward({tokens.data(), targets.data(), nullptr, B, T}, 1.0f / (B * T));  // a pass before: the gaps below stay zeros over passes
  cuda->take_profile();
  const LossSum lg = mg.forward_backward({tokens.data(), targets.data(), nullptr, B, T}, 1.0f / (B * T));
  int64_t copies = 0, adds = 0, packed_swiglu = 0, elementwise_swiglu = 0;
  for (const KernelTime& k : cuda->take_profile()) {
    if (k.name == "copy_rows") copies += k.launches;
    if (k.name == "add_rows") adds += k.launches;
    if (k.name == "swiglu_forward" || k.name == "swiglu_backward") packed_swiglu += k.launches;
    if (k.name.find("swiglu") != std::string::npos && k.name.find("elementwise") != std::string::npos) elementwise_swiglu += k.launches;
  }
  cuda->set_profiling(false);
  // W_down and dW_down (the paper's BF16 gradients) in rows of 64 elements where they live; the gate
  // and up projections' 41 rows each followed by 7 zero rows (the up half's column, 48)
  for (const auto& t : mg.tensors()) {
    const bool gate_or_up = t.role == TensorRole::MlpGate || t.role == TensorRole::MlpUp;
    EXPECT_EQ(t.arena_ld, t.role == TensorRole::MlpDown ? 64 : 0) << t.name;
    EXPECT_EQ(t.arena_rows, gate_or_up ? 48 : 0) << t.name;
    EXPECT_EQ(mc.store().tensor(t.name).arena_ld, 0) << t.name;
    EXPECT_EQ(mc.store().tensor(t.name).arena_rows, 0) << t.name;
  }
  EXPECT_EQ(copies, 0);
  EXPECT_EQ(adds, 0);
  // SwiGLU in 16-byte packs over the padded rows (cuda_scratch::swiglu_packed), forward and backward a layer
  EXPECT_EQ(packed_swiglu, 2 * cfg.num_hidden_layers);
  EXPECT_EQ(elementwise_swiglu, 0);
  const LossSum lc = mc.forward_backward({tokens.data(), targets.data(), nullptr, B, T}, 1.0f / (B * T));
  EXPECT_NEAR(lg.mean(), lc.mean(), 2e-3 * lc.mean());  // BF16 activations: the model test's bound
  // The padding still holds zeros after two forward and backward passes (Buf::ld: the GEMMs run over it,
  // cuda_scratch::gemm_extents), though the emulated device memory starts as NaN.
  // gate_up's rows: gate in [0, 41), up in [48, 89) (its first 16-byte pack from 41), zeros elsewhere.
  for (const char* name : {"layers.0.gate_up", "layers.1.gate_up", "swiglu", "d_swiglu", "d_gate_up"}) {
    const BufferSpec& spec = mg.activation_plan().find(name);
    std::vector<uint16_t> rows(static_cast<size_t>(spec.elements));
    cuda->to_host(rows.data(), mg.activation(name).ptr, spec.bytes());
    const bool gate_up = std::string(name).find("gate_up") != std::string::npos;
    auto value = [&](int64_t c) { return c < 41 || (gate_up && c >= 48 && c < 89); };
    int64_t nonzero = 0, values = 0;
    for (int64_t r = 0; r < B * T; ++r)
      for (int64_t c = 0; c < spec.ld; ++c) (value(c) ? values : nonzero) += rows[static_cast<size_t>(r * spec.ld + c)] != 0;
    EXPECT_EQ(nonzero, 0) << name;
    EXPECT_GT(values, B * T * (gate_up ? 82 : 41) * 9 / 10) << name;  // the values are where the layout says (a few may round to 0)
  }
  // The arenas' padding (the down projection's columns 41-63, the gate and up projections' rows
  // 41-47) too: the weights' after a load, the gradients' after two passes (the gate/up GEMMs run
  // over those rows); the host's copies have no padding (the CPU's logical order).
  for (const Buf arena : {mg.store().params(), mg.store().grads()}) {
    std::vector<uint16_t> raw(static_cast<size_t>(mg.store().arena_elements()));
    cuda->to_host(raw.data(), arena.ptr, mg.store().arena_elements() * 2);
    int64_t nonzero = 0, values = 0, zero_rows = 0;
    for (const auto& t : mg.tensors()) {
      for (int64_t r = 0; t.arena_ld && r < t.rows(); ++r)
        for (int64_t c = 0; c < t.arena_ld; ++c) (c < t.cols() ? values : nonzero) += raw[static_cast<size_t>(t.arena_offset + r * t.arena_ld + c)] != 0;
      for (int64_t e = t.rows() * t.row_stride(); t.arena_rows && e < t.arena_numel(); ++e, ++zero_rows)
        nonzero += raw[static_cast<size_t>(t.arena_offset + e)] != 0;
    }
    EXPECT_EQ(nonzero, 0);
    EXPECT_EQ(zero_rows, cfg.num_hidden_layers * 2 * 7 * 32);
    EXPECT_GT(values, cfg.num_hidden_layers * 32 * 41 * 9 / 10);
  }
  EXPECT_EQ(mg.params_to_host(), mc.params_to_host());
  // The down projection's GEMMs read that padding (they run over it): NaN planted there reaches the loss.
  const BufferSpec& s = mg.activation_plan().find("swiglu");
  std::vector<uint16_t> planted(static_cast<size_t>(s.elements), 0);
  for (int64_t r = 0; r < B * T; ++r) planted[static_cast<size_t>(r * s.ld + s.ld - 1)] = 0x7fc0;  // a BF16 NaN in the last column
  cuda->to_device(mg.activation("swiglu").ptr, planted.data(), s.bytes());
  EXPECT_TRUE(std::isnan(mg.forward({tokens.data(), targets.data(), nullptr, B, T}).mean()));
}

// Where every operand carrying K (or N) as its rows' length is padded, the GEMM runs over the
// padding (zeros); never over a dimension that is some operand's row count, nor over dense rows.
TEST(GemmExtents, WidenKAndNOnlyWhereEveryOperandCarryingThemIsPadded) {
  namespace cs = cuda_scratch;
  const int64_t T = 64, C = 32, F = 41, Fp = 64;  // F = 41 BF16: 82-byte rows, padded to 128 bytes
  auto extents = [](int64_t M, int64_t N, int64_t K, bool ta, bool tb, int64_t a_ld, int64_t b_ld, int64_t out_ld, int64_t out_bytes = 2) {
    const cs::GemmStaging st = cs::gemm_staging(M, N, K, ta, tb, 2, out_bytes, 0, 0, 0, a_ld, b_ld, out_ld);
    return cs::gemm_extents(st, N, K, ta, tb, 2, out_bytes);
  };
  // the down projection: forward s[T,F] Wd[C,F]^T (K = F), input gradient dy Wd (N = F), weight gradient dy^T s (N = F)
  EXPECT_EQ(extents(T, C, F, false, true, Fp, 0, 0).K, Fp);   // s padded, Wd staged
  EXPECT_EQ(extents(T, F, C, false, false, 0, 0, Fp).N, Fp);  // Wd staged, ds padded
  EXPECT_EQ(extents(C, F, T, true, false, 0, Fp, 0).N, Fp);   // s padded, dWd staged
  EXPECT_EQ(extents(C, 5461, T, true, false, 0, 5504, 0, 4).N, 5472);  // an FP32 gradient's 128-byte rows (32 floats) bound it
  // a half of the gate/up projection (Linear::halves): W's F rows, never more: nothing widened
  const cs::GemmExtents g1 = extents(T, F, C, false, true, 0, 0, 128), g2 = extents(T, C, F, false, false, 128, 0, 0),
                        g3 = extents(F, C, T, true, false, 128, 0, 0);
  EXPECT_EQ(g1.N, F);
  EXPECT_EQ(g2.K, F);
  EXPECT_EQ(g3.N, C);
  EXPECT_EQ(g3.K, T);
  // aligned widths: as they are
  EXPECT_EQ(extents(T, C, 40, false, true, 64, 64, 0).K, 40);
}

// SWAN's plan over a model's matrices listed layer by layer (the quickstart's llama_20m: 8 layers of
// q, k, v, o 384 x 384, gate and up 1024 x 384, down 384 x 1024; all of k = 384): one chunk, its
// tensors ordered by shape, so 3 runs (one strided-batched GEMM each); the exact path's staging in
// groups of at most kSwanPinnedGroupBytes (2 here: 113 MB in all), each tensor after the last, the
// plan's pinned bytes the largest group's. At llama_1b a 5461 x 2048 tensor's staging (89 MB) is a
// group alone.
TEST(SwanPlan, OrdersAChunkByShapeAndStagesTheExactPathInGroups) {
  namespace cs = cuda_scratch;
  std::vector<cs::SwanShape> shapes;
  for (int l = 0; l < 8; ++l)
    for (const auto& [m, n] : {std::pair<int64_t, int64_t>{384, 384}, {384, 384}, {384, 384}, {384, 384}, {1024, 384}, {1024, 384}, {384, 1024}})
      shapes.push_back({m, n, 0});
  const cs::SwanPlan plan = cs::swan_plan(shapes);
  ASSERT_EQ(plan.ends, std::vector<int64_t>{56});
  auto shape = [&](int64_t b) { return std::pair<int64_t, int64_t>{shapes[plan.order[b]].m, shapes[plan.order[b]].n}; };
  const auto runs = cs::swan_shape_runs(56, shape);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0], (std::pair<int64_t, int64_t>{0, 32}));   // 384 x 384
  EXPECT_EQ(runs[1], (std::pair<int64_t, int64_t>{32, 40}));  // 384 x 1024
  EXPECT_EQ(runs[2], (std::pair<int64_t, int64_t>{40, 56}));  // 1024 x 384
  for (int64_t b = 1; b < 32; ++b) EXPECT_LT(plan.order[b - 1], plan.order[b]);  // stable: model order within a shape
  const auto groups = cs::swan_exact_groups(56, shape);
  ASSERT_EQ(groups.size(), 2u);
  int64_t largest = 0, at = 0;
  for (const auto& [g0, g1] : groups) {
    EXPECT_EQ(g0, at);
    int64_t bytes = 0;
    for (int64_t b = g0; b < g1; ++b) bytes += cs::swan_pinned_bytes(shape(b).first, shape(b).second);
    EXPECT_LE(bytes, cs::kSwanPinnedGroupBytes);
    if (g1 < 56) {
      EXPECT_GT(bytes + cs::swan_pinned_bytes(shape(g1).first, shape(g1).second), cs::kSwanPinnedGroupBytes);  // as full as it gets
    }
    largest = std::max(largest, bytes), at = g1;
  }
  EXPECT_EQ(at, 56);
  EXPECT_EQ(plan.pinned_bytes, largest);
  // A tensor staged alone past the cap; more than kSwanChunkTensors of one k: another chunk.
  EXPECT_EQ(cs::swan_exact_groups(2, [](int64_t) { return std::pair<int64_t, int64_t>{5461, 2048}; }).size(), 2u);
  EXPECT_EQ(cs::swan_plan(std::vector<cs::SwanShape>(300, {4, 4, 0})).ends, (std::vector<int64_t>{256, 300}));
}

// An extent off whole 16-byte packs of the inputs (llama_1b's gate/up weight's halves of 5461 rows)
// runs as a bulk of whole packs and a rest; K only into an FP32 output. The parts tile the product.
TEST(GemmParts, ExtentsOffWholePacksSplitIntoABulkAndARest) {
  namespace cs = cuda_scratch;
  auto parts = [](int64_t M, int64_t N, int64_t K, int64_t in, int64_t out) {
    const cs::GemmParts p = cs::gemm_parts(M, N, K, in, out);
    return std::vector<cs::GemmPart>(p.part, p.part + p.count);
  };
  auto same = [](const cs::GemmPart& x, const cs::GemmPart& y) {
    return x.m0 == y.m0 && x.m == y.m && x.n0 == y.n0 && x.n == y.n && x.k0 == y.k0 && x.k == y.k;
  };
  // a half of llama_1b's gate/up projection at 32 x 256: forward (N), input gradient (K, FP32), weight gradient (M)
  const auto fwd = parts(8192, 5461, 2048, 2, 2), dx = parts(8192, 2048, 5461, 2, 4), dw = parts(5461, 2048, 8192, 2, 2);
  ASSERT_EQ(fwd.size(), 2u);
  EXPECT_TRUE(same(fwd[0], {0, 8192, 0, 5456, 0, 2048}) && same(fwd[1], {0, 8192, 5456, 5, 0, 2048}));
  ASSERT_EQ(dx.size(), 2u);
  EXPECT_TRUE(same(dx[0], {0, 8192, 0, 2048, 0, 5456}) && same(dx[1], {0, 8192, 0, 2048, 5456, 5}));
  ASSERT_EQ(dw.size(), 2u);
  EXPECT_TRUE(same(dw[0], {0, 5456, 0, 2048, 0, 8192}) && same(dw[1], {5456, 5, 0, 2048, 0, 8192}));
  EXPECT_EQ(parts(8192, 2048, 5461, 2, 2).size(), 1u);  // K into a BF16 output: not split (two roundings)
  EXPECT_EQ(parts(5, 7, 3, 2, 4).size(), 1u);            // every extent under a pack
  EXPECT_EQ(parts(8192, 2048, 2048, 2, 2).size(), 1u);   // whole packs
  EXPECT_EQ(parts(14, 8, 8, 4, 4).size(), 2u);           // FP32 inputs: packs of 4 (12 + 2)
  // Any shape: the parts tile [0,M) x [0,N) x [0,K), bulks of whole packs, K parts of one output
  // block in order (the first one writes it).
  std::mt19937 gen(5);
  for (int trial = 0; trial < 500; ++trial) {
    const int64_t M = 1 + gen() % 40, N = 1 + gen() % 40, K = 1 + gen() % 40, in = trial % 2 ? 2 : 4, out = trial % 3 ? 4 : 2;
    std::vector<int> cover(static_cast<size_t>(M * N * K), 0);
    const auto ps = parts(M, N, K, in, out);
    for (size_t i = 0; i < ps.size(); ++i) {
      const cs::GemmPart& p = ps[i];
      for (int64_t m = p.m0; m < p.m0 + p.m; ++m)
        for (int64_t n = p.n0; n < p.n0 + p.n; ++n)
          for (int64_t k = p.k0; k < p.k0 + p.k; ++k) ++cover[static_cast<size_t>((m * N + n) * K + k)];
      for (int64_t start : {p.m0, p.n0, p.k0}) EXPECT_EQ(start % (16 / in), 0);
      if (p.k0 > 0) {
        EXPECT_TRUE(i > 0 && ps[i - 1].m0 == p.m0 && ps[i - 1].n0 == p.n0 && ps[i - 1].k0 == 0);
      }
    }
    EXPECT_TRUE(std::all_of(cover.begin(), cover.end(), [](int c) { return c == 1; })) << M << "x" << N << "x" << K;
    EXPECT_EQ(ps.size(), static_cast<size_t>((M % (16 / in) && M > 16 / in ? 2 : 1) * (N % (16 / in) && N > 16 / in ? 2 : 1) *
                                              (out == 4 && K % (16 / in) && K > 16 / in ? 2 : 1)));
  }
}

// The backend runs those parts: a GEMM launch each, the product within the bound, the residual read
// as the addend by the bulk and the rest of M alike.
TEST_P(CudaVsCpu, GemmExtentsOffWholePacksRunAsABulkAndARest) {
  struct Case {
    int64_t M, N, K;
    bool residual;
  };
  int split = 0;  // calls that ran as more than one GEMM
  for (const Case c : {Case{19, 21, 27, false}, Case{19, 64, 40, true}, Case{16, 64, 35, false}})
    for (DType out : kTypes)
      for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb)
          for (int acc = 0; acc < 2; ++acc) {
            if (c.residual && (ta || !tb || !acc)) continue;  // a residual projection: x W^T, accumulating onto the residual
            Pair a(*cpu, *cuda, random_vec(c.M * c.K, 1), DType::BF16), b(*cpu, *cuda, random_vec(c.K * c.N, 2), DType::BF16),
                o(*cpu, *cuda, random_vec(c.M * c.N, 3), out), r(*cpu, *cuda, random_vec(c.M * c.N, 4), out);
            const Vec av = a.c.get(), bv = b.c.get(), before = c.residual ? r.c.get() : o.c.get();
            cuda->set_profiling(true);
            cuda->take_profile();
            if (c.residual) cuda->matmul_residual(o.g.buf(), r.g.buf(), a.g.buf(), b.g.buf(), c.M, c.N, c.K, false, true);
            else cuda->matmul(o.g.buf(), a.g.buf(), b.g.buf(), c.M, c.N, c.K, ta, tb, acc);
            int64_t gemms = 0, converts = 0;
            for (const KernelTime& k : cuda->take_profile()) {
              if (k.name.rfind("gemm ", 0) == 0) gemms += k.launches;
              if (k.name == "convert") converts += k.launches;
            }
            cuda->set_profiling(false);
            const std::string what = std::to_string(c.M) + "x" + std::to_string(c.N) + "x" + std::to_string(c.K) + " ta " + std::to_string(ta) +
                                     " tb " + std::to_string(tb) + " acc " + std::to_string(acc) + " out " + dtype_name(out) +
                                     (c.residual ? " residual" : "");
            // the parts of the extents the GEMM runs over (staged rows padded: cuda_scratch::gemm_extents)
            const cuda_scratch::GemmStaging st = cuda_scratch::gemm_staging(c.M, c.N, c.K, ta, tb, 2, dtype_bytes(out), 0, 0, 0);
            const cuda_scratch::GemmExtents e = cuda_scratch::gemm_extents(st, c.N, c.K, ta, tb, 2, dtype_bytes(out));
            const int expected = cuda_scratch::gemm_parts(c.M, e.N, e.K, 2, dtype_bytes(out)).count;
            EXPECT_EQ(gemms, expected) << what;
            split += expected > 1;
            if (c.residual) {
              EXPECT_EQ(converts, 0) << what;  // read as the addend, not copied
            }
            EXPECT_TRUE(gemm_within_bound(o.g.get(), av, bv, before, c.M, c.N, c.K, ta, tb, acc, out, acc && !cuda_plugin()->emulated)) << what;
          }
  EXPECT_EQ(split, 24);  // of the 34 calls: every one whose parts are more than one, counted by hand
}

// K = 0, an empty sum: out cleared (or kept when accumulating, or the residual copied), its rows
// only: a split N (8 + 4) or a row width the staging pads (41 BF16) once cleared past the output.
TEST_P(CudaVsCpu, EmptySumsTouchOnlyTheOutput) {
  struct Case {
    int64_t M, N;
    DType out;
    bool acc, residual;
  };
  const int64_t guard = 64;  // elements after the output, never written
  for (const Case c : {Case{3, 12, DType::F32, false, false}, Case{4, 41, DType::BF16, false, false}, Case{4, 41, DType::BF16, true, false},
                       Case{5, 64, DType::BF16, true, true}}) {
    Pair a(*cpu, *cuda, random_vec(c.M * 8, 1), DType::BF16), b(*cpu, *cuda, random_vec(c.N * 8, 2), DType::BF16),
        o(*cpu, *cuda, random_vec(c.M * c.N + guard, 3), c.out), r(*cpu, *cuda, random_vec(c.M * c.N, 4), c.out);
    const Vec before = o.g.get(), residual = r.g.get();
    if (c.residual) cuda->matmul_residual(o.g.buf(), r.g.buf(), a.g.buf(), b.g.buf(), c.M, c.N, 0, false, true);
    else cuda->matmul(o.g.buf(), a.g.buf(), b.g.buf(), c.M, c.N, 0, false, true, c.acc);
    const Vec got = o.g.get();
    const std::string what = std::to_string(c.M) + "x" + std::to_string(c.N) + " " + dtype_name(c.out) + (c.acc ? " acc" : "") + (c.residual ? " residual" : "");
    for (int64_t e = 0; e < c.M * c.N; ++e)
      ASSERT_EQ(got[e], c.residual ? residual[e] : c.acc ? before[e] : 0.0) << what << ": element " << e;
    for (int64_t e = c.M * c.N; e < c.M * c.N + guard; ++e) ASSERT_EQ(got[e], before[e]) << what << ": past the output, element " << e;
  }
}

TEST_P(CudaVsCpu, EmbeddingForwardBackward) {
  // BT 37: one shared-memory sort chunk; BT 5000: the device sort's global stages (8192 keys in
  // chunks of 2048), 5000 draws of 300 ids: runs of ~17 positions, many crossing the backward
  // blocks' 32-key chunks; 4000 draws of 3 ids: runs of ~1300 positions (padding, a frequent token)
  // summed as ~40 pieces in parallel and added in chunk order.
  for (const auto& [BT, V, C] :
       {std::tuple<int64_t, int64_t, int64_t>{37, 11, 13}, {37, 11, 40}, {5000, 300, 40}, {4000, 3, 24}}) {  // C 13: no 16-byte packs
    for (DType t : kTypes)
      for (DType g : {t, DType::F32}) {
        const Ids tok(*cpu, *cuda, random_ids(static_cast<size_t>(BT), static_cast<int32_t>(V), 5));
        Pair wte(*cpu, *cuda, random_vec(V * C, 6), t), out(*cpu, *cuda, Vec(BT * C, 0.0), t), dout(*cpu, *cuda, random_vec(BT * C, 7), t),
            dwte(*cpu, *cuda, random_vec(V * C, 8), g);
        cpu->embedding_forward(out.c.buf(), static_cast<int32_t*>(tok.c), wte.c.buf(), BT, C);
        cuda->embedding_forward(out.g.buf(), static_cast<int32_t*>(tok.g), wte.g.buf(), BT, C);
        EXPECT_TRUE(out.same(0.0)) << "a copy is exact";
        cpu->embedding_backward(dwte.c.buf(), dout.c.buf(), static_cast<int32_t*>(tok.c), BT, C);
        cuda->embedding_backward(dwte.g.buf(), dout.g.buf(), static_cast<int32_t*>(tok.g), BT, C);
        // Bit for bit: both sum a token's positions in position order in FP32, in pieces cut every
        // 32 sorted positions (op_math::kEmbeddingSumChunk), and add once (measured error 0); a run
        // split elsewhere or reordered by the device sort would change bits.
        EXPECT_TRUE(dwte.same(0.0)) << "BT " << BT << " C " << C << " " << dtype_name(t) << "/" << dtype_name(g);
      }
  }
}

TEST_P(CudaVsCpu, RmsNormForwardBackward) {
  struct Shape {
    int64_t N, C;
  };
  // the backward's at most 256 blocks: 37 rows, one a block; 300 and 8200 rows, 2 and 33 a block
  // with a short last one
  for (const Shape s : {Shape{37, 13}, Shape{300, 40}, Shape{8200, 16}}) {
    for (DType t : kTypes)
      for (DType g : {t, DType::F32}) {
        Pair x(*cpu, *cuda, random_vec(s.N * s.C, 1), t), w(*cpu, *cuda, random_vec(s.C, 2), t), y(*cpu, *cuda, Vec(s.N * s.C, 0.0), t),
            r(*cpu, *cuda, Vec(s.N, 0.0), DType::F32), dy(*cpu, *cuda, random_vec(s.N * s.C, 3), DType::F32),
            dx(*cpu, *cuda, random_vec(s.N * s.C, 4), DType::F32), dw(*cpu, *cuda, random_vec(s.C, 5), g);
        cpu->rmsnorm_forward(y.c.buf(), r.c.f32(), x.c.buf(), w.c.buf(), s.N, s.C, 1e-5f);
        cuda->rmsnorm_forward(y.g.buf(), r.g.f32(), x.g.buf(), w.g.buf(), s.N, s.C, 1e-5f);
        EXPECT_TRUE(y.same(tol(t)));
        EXPECT_TRUE(r.same(kF32));
        // dx's rounded copy (the next projection's operand) too: each backend's copy holds the bits
        // its own convert gives dx.
        Pair copy(*cpu, *cuda, Vec(s.N * s.C, 0.0), t), converted(*cpu, *cuda, Vec(s.N * s.C, 0.0), t);
        for (bool accumulate : {false, true}) {
          cpu->rmsnorm_backward(dx.c.f32(), copy.c.buf(), dw.c.buf(), dy.c.f32(), x.c.buf(), w.c.buf(), r.c.f32(), s.N, s.C, accumulate);
          cuda->rmsnorm_backward(dx.g.f32(), copy.g.buf(), dw.g.buf(), dy.g.f32(), x.g.buf(), w.g.buf(), r.g.f32(), s.N, s.C, accumulate);
          EXPECT_TRUE(dx.same(kF32)) << "N " << s.N << " accumulate " << accumulate;
          EXPECT_TRUE(dw.same(tol(g))) << "N " << s.N << " " << dtype_name(t) << "/" << dtype_name(g);
          cpu->convert(converted.c.buf(), Buf{dx.c.f32(), DType::F32}, s.N * s.C);
          cuda->convert(converted.g.buf(), Buf{dx.g.f32(), DType::F32}, s.N * s.C);
          EXPECT_EQ(copy.c.get(), converted.c.get()) << "N " << s.N << " " << dtype_name(t) << " accumulate " << accumulate;
          EXPECT_EQ(copy.g.get(), converted.g.get()) << "N " << s.N << " " << dtype_name(t) << " accumulate " << accumulate;
        }
      }
  }
}

// D = 6: a thread per pair (half width 3); 16 and 64: 16-byte packs (one or several per head half).
TEST_P(CudaVsCpu, RopeForwardBackward) {
  for (int64_t D : {6, 16, 64})
    for (DType t : kTypes) {
      const int64_t B = 2, T = 5, H = 3, n = B * T * 3 * H * D;
      const std::vector<float> cs = rope_table(T, D);
      Pair table(*cpu, *cuda, Vec(cs.begin(), cs.end()), DType::F32), x(*cpu, *cuda, random_vec(n, 1), t);
      cpu->rope_forward(x.c.buf(), table.c.f32(), B, T, H, D);
      cuda->rope_forward(x.g.buf(), table.g.f32(), B, T, H, D);
      EXPECT_TRUE(x.same(tol(t)));
      cpu->rope_backward(x.c.buf(), table.c.f32(), B, T, H, D);
      cuda->rope_backward(x.g.buf(), table.g.f32(), B, T, H, D);
      EXPECT_TRUE(x.same(tol(t)));
    }
}

TEST_P(CudaVsCpu, AttentionForwardBackward) {
  struct Shape {
    int64_t B, T, H, D;
  };
  // T = 37: not a multiple of the 16-row and 32-key tiles; T = 5: a single partial tile; D = 6, 24:
  // lanes with and without a column
  for (const Shape s : {Shape{2, 37, 2, 16}, Shape{1, 5, 3, 6}, Shape{1, 19, 1, 24}}) {
    for (DType t : kTypes) {
      const int64_t C = s.H * s.D, BT = s.B * s.T;
      Pair qkv(*cpu, *cuda, random_vec(BT * 3 * C, 1), t), out(*cpu, *cuda, Vec(BT * C, 0.0), t), lse(*cpu, *cuda, Vec(s.B * s.H * s.T, 0.0), DType::F32),
          dout(*cpu, *cuda, random_vec(BT * C, 2), t), dqkv(*cpu, *cuda, Vec(BT * 3 * C, 0.0), t);
      cpu->attention_forward(out.c.buf(), lse.c.f32(), qkv.c.buf(), s.B, s.T, s.H, s.D);
      cuda->attention_forward(out.g.buf(), lse.g.f32(), qkv.g.buf(), s.B, s.T, s.H, s.D);
      EXPECT_TRUE(out.same(tol(t))) << s.T << " " << s.D << " " << dtype_name(t);
      EXPECT_TRUE(lse.same(kF32));
      // The backward pass from the CPU's forward results, so both see the same inputs.
      out.g.set(out.c.get());
      lse.g.set(lse.c.get());
      cpu->attention_backward(dqkv.c.buf(), dout.c.buf(), qkv.c.buf(), out.c.buf(), lse.c.f32(), s.B, s.T, s.H, s.D);
      cuda->attention_backward(dqkv.g.buf(), dout.g.buf(), qkv.g.buf(), out.g.buf(), lse.g.f32(), s.B, s.T, s.H, s.D);
      EXPECT_TRUE(dqkv.same(tol(t))) << s.T << " " << s.D << " " << dtype_name(t);
    }
  }
}

TEST_P(CudaVsCpu, AttentionDecodeAppendsAndAttends) {
  for (DType t : kTypes) {
    const int64_t H = 2, D = 10, C = H * D, steps = 7;
    Pair kc(*cpu, *cuda, Vec(steps * C, 0.0), t), vc(*cpu, *cuda, Vec(steps * C, 0.0), t), out(*cpu, *cuda, Vec(C, 0.0), t);
    for (int64_t pos = 0; pos < steps; ++pos) {
      Pair qkv(*cpu, *cuda, random_vec(3 * C, 10 + static_cast<uint32_t>(pos)), t);
      cpu->attention_decode(out.c.buf(), qkv.c.buf(), kc.c.buf(), vc.c.buf(), pos, H, D);
      cuda->attention_decode(out.g.buf(), qkv.g.buf(), kc.g.buf(), vc.g.buf(), pos, H, D);
      EXPECT_TRUE(out.same(tol(t))) << "pos " << pos;
    }
    EXPECT_TRUE(kc.same(0.0));
    EXPECT_TRUE(vc.same(0.0));
  }
}

// A context longer than the 12,000 positions a block's shared scores once held: the online softmax
// has no limit. Caches filled directly; one step at position 13,000, D = 64 and 128 (lanes owning
// two and four dimensions).
TEST_P(CudaVsCpu, AttentionDecodeOnALongContext) {
  for (int64_t D : {64, 128}) {
    const int64_t H = 2, C = H * D, pos = 13000;
    Pair kc(*cpu, *cuda, random_vec((pos + 1) * C, 21), DType::BF16), vc(*cpu, *cuda, random_vec((pos + 1) * C, 22), DType::BF16),
        out(*cpu, *cuda, Vec(C, 0.0), DType::BF16), qkv(*cpu, *cuda, random_vec(3 * C, 23, 4.0), DType::BF16);
    cpu->attention_decode(out.c.buf(), qkv.c.buf(), kc.c.buf(), vc.c.buf(), pos, H, D);
    cuda->attention_decode(out.g.buf(), qkv.g.buf(), kc.g.buf(), vc.g.buf(), pos, H, D);
    EXPECT_TRUE(out.same(tol(DType::BF16))) << D;
    EXPECT_TRUE(kc.same(0.0));
  }
}

TEST_P(CudaVsCpu, SwiGLUForwardBackward) {
  for (int64_t F : {13, 40})  // scalar and 16-byte-pack paths
    for (DType t : kTypes) {
      const int64_t N = 7;
      Pair gu(*cpu, *cuda, random_vec(N * 2 * F, 1, 2.0), t), out(*cpu, *cuda, Vec(N * F, 0.0), t), dout(*cpu, *cuda, random_vec(N * F, 2), t),
          dgu(*cpu, *cuda, Vec(N * 2 * F, 0.0), t);
      cpu->swiglu_forward(out.c.buf(), gu.c.buf(), N, F);
      cuda->swiglu_forward(out.g.buf(), gu.g.buf(), N, F);
      EXPECT_TRUE(out.same(tol(t))) << F;
      cpu->swiglu_backward(dgu.c.buf(), Buf{nullptr, t}, dout.c.buf(), gu.c.buf(), N, F);
      cuda->swiglu_backward(dgu.g.buf(), Buf{nullptr, t}, dout.g.buf(), gu.g.buf(), N, F);
      EXPECT_TRUE(dgu.same(tol(t))) << F;
      // With the recomputed forward: each backend writes its own forward's bits and the same gradient.
      Pair out2(*cpu, *cuda, Vec(N * F, 0.0), t), dgu2(*cpu, *cuda, Vec(N * 2 * F, 0.0), t);
      cpu->swiglu_backward(dgu2.c.buf(), out2.c.buf(), dout.c.buf(), gu.c.buf(), N, F);
      cuda->swiglu_backward(dgu2.g.buf(), out2.g.buf(), dout.g.buf(), gu.g.buf(), N, F);
      EXPECT_EQ(out2.c.get(), out.c.get()) << F;
      EXPECT_EQ(out2.g.get(), out.g.get()) << F;
      EXPECT_EQ(dgu2.c.get(), dgu.c.get()) << F;
      EXPECT_EQ(dgu2.g.get(), dgu.g.get()) << F;
    }
}

// The plan's padded MLP rows where F is off 16-byte packs (llama_1b's F = 5461): gate_up and its
// gradient as [gate | gap | up | padding], the up half from F rounded up to a pack
// (cuda_scratch::mlp_up_column), s and ds in 128-byte rows; every row's last pack holds F % P of its
// values (BF16: 3, 1, 3, 6, 5 of 8; FP32: 3, 1, 3, 2, 1 of 4; F = 3: less than a pack). Against the
// CPU on dense rows; NaN planted in the inputs' padding (loaded with a row's last pack, never in a
// result), a sentinel in the outputs' gap and padding (never written).
TEST_P(CudaVsCpu, SwiGLUOverPaddedRowsOffAPack) {
  namespace cs = cuda_scratch;
  const int64_t N = 3;
  for (DType t : kTypes)
    for (int64_t F : {3, 41, 2051, 4102, 5461}) {
      const int64_t s = dtype_bytes(t);
      const int64_t lg = cs::mlp_gate_up_ld(F, s), lf = cs::gemm_staged_ld(F, s), up = cs::mlp_up_column(F, lg, s);
      ASSERT_TRUE(cs::mlp_rows_padded(F, s) && up % (16 / s) == 0 && up >= F && up + F <= lg);
      // dense [N, cols] values into rows of `ld` (a [gate | up] row's second half from column `at`), `fill` elsewhere; and back
      auto pad = [N](const Vec& dense, int64_t cols, int64_t ld, double fill, int64_t at) {
        const int64_t half = at ? cols / 2 : cols;
        Vec v(static_cast<size_t>(N * ld), fill);
        for (int64_t n = 0; n < N; ++n) {
          std::copy_n(dense.begin() + n * cols, half, v.begin() + n * ld);
          if (at) std::copy_n(dense.begin() + n * cols + half, half, v.begin() + n * ld + at);
        }
        return v;
      };
      auto unpad = [N](const Vec& rows, int64_t cols, int64_t ld, int64_t at) {
        const int64_t half = at ? cols / 2 : cols;
        Vec v(static_cast<size_t>(N * cols));
        for (int64_t n = 0; n < N; ++n) {
          std::copy_n(rows.begin() + n * ld, half, v.begin() + n * cols);
          if (at) std::copy_n(rows.begin() + n * ld + at, half, v.begin() + n * cols + half);
        }
        return v;
      };
      // every element outside the values is `fill`
      auto padding_holds = [N, &pad, &unpad](const Vec& rows, int64_t cols, int64_t ld, double fill, int64_t at) {
        return pad(unpad(rows, cols, ld, at), cols, ld, fill, at) == rows;
      };
      const double kSentinel = 7.0;
      const Vec gu = random_vec(N * 2 * F, 1, 2.0), dout = random_vec(N * F, 2);
      Pair out(*cpu, *cuda, Vec(N * F, 0.0), t), dgu(*cpu, *cuda, Vec(N * 2 * F, 0.0), t), out2(*cpu, *cuda, Vec(N * F, 0.0), t);
      DeviceBuffer gu_c(*cpu, gu, t), dout_c(*cpu, dout, t);
      DeviceBuffer gu_g(*cuda, pad(gu, 2 * F, lg, NAN, up), t), dout_g(*cuda, pad(dout, F, lf, NAN, 0), t);
      DeviceBuffer out_g(*cuda, pad(Vec(N * F, 0.0), F, lf, kSentinel, 0), t), out2_g(*cuda, pad(Vec(N * F, 0.0), F, lf, kSentinel, 0), t),
          dgu_g(*cuda, pad(Vec(N * 2 * F, 0.0), 2 * F, lg, kSentinel, up), t);
      auto rows = [](const DeviceBuffer& b, int64_t ld) { return Buf{b.buf().ptr, b.buf().dtype, ld}; };
      const std::string what = std::string(dtype_name(t)) + " F " + std::to_string(F);

      cpu->swiglu_forward(out.c.buf(), gu_c.buf(), N, F);
      cuda->swiglu_forward(rows(out_g, lf), rows(gu_g, lg), N, F);
      EXPECT_TRUE(close(unpad(out_g.get(), F, lf, 0), out.c.get(), tol(t))) << what;
      EXPECT_TRUE(padding_holds(out_g.get(), F, lf, kSentinel, 0)) << what;

      cpu->swiglu_backward(dgu.c.buf(), out2.c.buf(), dout_c.buf(), gu_c.buf(), N, F);
      cuda->swiglu_backward(rows(dgu_g, lg), rows(out2_g, lf), rows(dout_g, lf), rows(gu_g, lg), N, F);
      EXPECT_TRUE(close(unpad(dgu_g.get(), 2 * F, lg, up), dgu.c.get(), tol(t))) << what;
      EXPECT_TRUE(padding_holds(dgu_g.get(), 2 * F, lg, kSentinel, up)) << what;
      EXPECT_EQ(out2_g.get(), out_g.get()) << what;  // the recomputed forward: the forward's bits, padding included
      // without the recomputed forward: the same gradient
      DeviceBuffer dgu2_g(*cuda, pad(Vec(N * 2 * F, 0.0), 2 * F, lg, kSentinel, up), t);
      cuda->swiglu_backward(rows(dgu2_g, lg), Buf{nullptr, t}, rows(dout_g, lf), rows(gu_g, lg), N, F);
      EXPECT_EQ(dgu2_g.get(), dgu_g.get()) << what;
    }
}

// A row whose first logits are -inf (a masked vocabulary): they add nothing, and -inf - -inf never
// makes the row NaN.
TEST_P(CudaVsCpu, CrossEntropyWithMinusInfinityLogits) {
  const int64_t N = 3, V = 1100;
  Vec x = random_vec(N * V, 31, 3.0);
  for (int64_t v = 0; v < 700; ++v) x[v] = -INFINITY;  // row 0: more than a thread's first strides
  std::vector<int32_t> ids = {800, 5, 1099};
  Ids t(*cpu, *cuda, ids);
  Pair logits(*cpu, *cuda, x, DType::F32), loss(*cpu, *cuda, Vec(N, 0.0), DType::F32), d(*cpu, *cuda, Vec(N * V, 0.0), DType::F32);
  cpu->cross_entropy(loss.c.f32(), d.c.buf(), logits.c.f32(), static_cast<const int32_t*>(t.c), nullptr, N, V, 1.0f);
  cuda->cross_entropy(loss.g.f32(), d.g.buf(), logits.g.f32(), static_cast<const int32_t*>(t.g), nullptr, N, V, 1.0f);
  for (double l : loss.g.get()) EXPECT_TRUE(std::isfinite(l));
  EXPECT_TRUE(loss.same(kF32));
  EXPECT_TRUE(d.same(kF32));
}

// The fused BF16 loss head in vocabulary chunks under every fiber order, against the CPU's head:
// 150 x 130 (chunks of 48, 48, 34: the scalar paths) and 160 x 96 (three of 32: 16-byte packs), masked
// rows, with and without dlogits. The losses agree to 1e-5 of their scale, dlogits to one BF16 rounding.
TEST_P(CudaVsCpu, FusedLossHeadInVocabularyChunks) {
  for (const auto& [N, V, C] : {std::tuple<int64_t, int64_t, int64_t>{150, 130, 40}, {160, 96, 32}}) {
    const Ids tg(*cpu, *cuda, random_ids(static_cast<size_t>(N), static_cast<int32_t>(V), 31));
    std::vector<uint8_t> mask(N, 1);
    mask[3] = mask[77] = 0;
    void* mc = cpu->allocate(N);
    void* mg = cuda->allocate(N);
    cpu->to_device(mc, mask.data(), N);
    cuda->to_device(mg, mask.data(), N);
    Pair x(*cpu, *cuda, random_vec(N * C, 32, 2.0), DType::BF16), w(*cpu, *cuda, random_vec(V * C, 33, 0.5), DType::BF16),
        logits(*cpu, *cuda, Vec(N * V, 0.0), DType::F32), loss(*cpu, *cuda, Vec(N, 0.0), DType::F32), d(*cpu, *cuda, Vec(N * V, 0.0), DType::BF16);
    for (bool backward : {true, false}) {
      auto run = [&](Backend& be, DeviceBuffer& l, DeviceBuffer& dl, DeviceBuffer& lg, DeviceBuffer& xx, DeviceBuffer& ww, void* t, void* m) {
        be.linear_cross_entropy(l.f32(), backward ? dl.buf() : Buf{nullptr, DType::BF16}, lg.buf(), xx.buf(), ww.buf(), static_cast<int32_t*>(t),
                                static_cast<uint8_t*>(m), N, V, C, 0.3f);
      };
      run(*cpu, loss.c, d.c, logits.c, x.c, w.c, tg.c, mc);
      run(*cuda, loss.g, d.g, logits.g, x.g, w.g, tg.g, mg);
      EXPECT_TRUE(loss.same(kF32)) << N << "x" << V << (backward ? " backward" : "");
      if (backward) {
        EXPECT_TRUE(d.same(kBf16)) << N << "x" << V;
      }
    }
    cpu->release(mc), cuda->release(mg);
  }
}

// A NaN logit reaches its row's loss in the fused head, as on the CPU, so the trainer's non-finite
// check sees it: a NaN in w's row 7 makes logit 7 of every row NaN (no row's target), a NaN in x's
// row 5 makes all of that row's logits NaN. Masked rows stay 0; with 16-byte packs and without.
TEST_P(CudaVsCpu, FusedLossHeadCarriesANaNLogitToTheLoss) {
  for (const auto& [N, V, C] : {std::tuple<int64_t, int64_t, int64_t>{150, 130, 40}, {160, 96, 32}})
    for (const bool in_w : {true, false}) {
      std::vector<int32_t> ids = random_ids(static_cast<size_t>(N), static_cast<int32_t>(V), 41);
      for (auto& t : ids) t = t == 7 ? 8 : t;
      const Ids tg(*cpu, *cuda, ids);
      std::vector<uint8_t> mask(N, 1);
      mask[3] = 0;
      void* mc = cpu->allocate(N);
      void* mg = cuda->allocate(N);
      cpu->to_device(mc, mask.data(), N);
      cuda->to_device(mg, mask.data(), N);
      Vec xv = random_vec(N * C, 42, 2.0), wv = random_vec(V * C, 43, 0.5);
      (in_w ? wv[7 * C] : xv[5 * C]) = std::numeric_limits<double>::quiet_NaN();
      Pair x(*cpu, *cuda, xv, DType::BF16), w(*cpu, *cuda, wv, DType::BF16), logits(*cpu, *cuda, Vec(N * V, 0.0), DType::F32),
          loss(*cpu, *cuda, Vec(N, 0.0), DType::F32), d(*cpu, *cuda, Vec(N * V, 0.0), DType::BF16);
      cpu->linear_cross_entropy(loss.c.f32(), d.c.buf(), logits.c.buf(), x.c.buf(), w.c.buf(), static_cast<int32_t*>(tg.c),
                                static_cast<uint8_t*>(mc), N, V, C, 0.3f);
      cuda->linear_cross_entropy(loss.g.f32(), d.g.buf(), logits.g.buf(), x.g.buf(), w.g.buf(), static_cast<int32_t*>(tg.g),
                                 static_cast<uint8_t*>(mg), N, V, C, 0.3f);
      const Vec lc = loss.c.get(), lg = loss.g.get();
      for (int64_t i = 0; i < N; ++i) {
        const bool nan = mask[i] && (in_w || i == 5);
        EXPECT_EQ(std::isnan(lc[i]), nan) << "cpu row " << i;
        EXPECT_EQ(std::isnan(lg[i]), nan) << "cuda row " << i << " of " << N << "x" << V << (in_w ? ", NaN in w" : ", NaN in x");
        if (!nan) {  // the other rows as the CPU's (measured: 2.7e-7 relative at most)
          EXPECT_NEAR(lg[i], lc[i], 1e-6 * std::fabs(lc[i]) + 1e-7) << "row " << i;
        }
      }
      cpu->release(mc), cuda->release(mg);
    }
}

TEST_P(CudaVsCpu, CrossEntropyWithMaskScaleAndAliasing) {
  for (int64_t V : {37, 1000}) {
    const int64_t N = 9;
    std::vector<int32_t> targets = random_ids(N, static_cast<int32_t>(V), 3);
    std::vector<uint8_t> mask(N, 1);
    mask[2] = mask[7] = 0;
    const Ids tg(*cpu, *cuda, targets);
    void* mc = cpu->allocate(N);
    void* mg = cuda->allocate(N);
    cpu->to_device(mc, mask.data(), N);
    cuda->to_device(mg, mask.data(), N);
    const Vec logits = random_vec(N * V, 4, 3.0);
    for (DType t : kTypes) {
      Pair x(*cpu, *cuda, logits, DType::F32), loss(*cpu, *cuda, Vec(N, 0.0), DType::F32), d(*cpu, *cuda, Vec(N * V, 0.0), t);
      const auto run = [&](Backend& be, DeviceBuffer& lx, DeviceBuffer& ll, DeviceBuffer& ld, void* m, void* tgt) {
        be.cross_entropy(ll.f32(), ld.buf(), lx.f32(), static_cast<int32_t*>(tgt), static_cast<uint8_t*>(m), N, V, 0.25f);
      };
      run(*cpu, x.c, loss.c, d.c, mc, tg.c);
      run(*cuda, x.g, loss.g, d.g, mg, tg.g);
      EXPECT_TRUE(loss.same(kF32)) << V;
      EXPECT_TRUE(d.same(tol(t))) << V << " " << dtype_name(t);
      if (t == DType::F32) {  // dlogits written over the logits
        cpu->cross_entropy(loss.c.f32(), x.c.buf(), x.c.f32(), static_cast<int32_t*>(tg.c), static_cast<uint8_t*>(mc), N, V, 0.25f);
        cuda->cross_entropy(loss.g.f32(), x.g.buf(), x.g.f32(), static_cast<int32_t*>(tg.g), static_cast<uint8_t*>(mg), N, V, 0.25f);
        EXPECT_TRUE(x.same(kF32)) << "aliased, V " << V;
        EXPECT_TRUE(close(x.g.get(), d.g.get(), kF32)) << "aliased equals separate, V " << V;
      }
    }
    cpu->release(mc);
    cuda->release(mg);
  }
}

TEST_P(CudaVsCpu, ConvertScaleAndSumSquares) {
  const int64_t n = 1037;
  const Vec v = random_vec(n, 1);
  for (DType from : kTypes)
    for (DType to : kTypes) {
      Pair src(*cpu, *cuda, v, from), dst(*cpu, *cuda, Vec(n, 0.0), to);
      cpu->convert(dst.c.buf(), src.c.buf(), n);
      cuda->convert(dst.g.buf(), src.g.buf(), n);
      EXPECT_TRUE(dst.same(0.0)) << "conversions round identically (nearest even)";
    }
  for (DType t : kTypes) {
    Pair x(*cpu, *cuda, v, t);
    cpu->optimizer_kernels().scale(x.c.buf(), n, 0.3f);
    cuda->optimizer_kernels().scale(x.g.buf(), n, 0.3f);
    EXPECT_TRUE(x.same(0.0)) << "one multiply, one rounding";
    const double sc = cpu->optimizer_kernels().sum_squares(x.c.buf(), n), sg = cuda->optimizer_kernels().sum_squares(x.g.buf(), n);
    EXPECT_NEAR(sg, sc, 1e-12 * sc) << "FP64 accumulation of the same values";
    EXPECT_EQ(sg, cuda->optimizer_kernels().sum_squares(x.g.buf(), n)) << "deterministic";
    // The list form (no host wait) gives each tensor the bits of its own call: here the whole
    // buffer, a 1-element slice and a slice of 1000 starting at an odd element (not 16-byte aligned:
    // element by element, over 4 of the fixed grid's blocks, the others empty). Each call is the
    // CPU's sum of its slice. Its results go to backend memory, as the seam says (a host array there
    // is what crashed on a GPU).
    const int64_t offsets[3] = {0, 7, 11}, ns[3] = {n, 1, 1000};
    const Buf xs[3] = {x.g.buf(), x.g.buf().at(offsets[1]), x.g.buf().at(offsets[2])};
    for (int i = 1; i < 3; ++i) {
      const double c = cpu->optimizer_kernels().sum_squares(x.c.buf().at(offsets[i]), ns[i]);
      EXPECT_NEAR(cuda->optimizer_kernels().sum_squares(xs[i], ns[i]), c, 1e-12 * c) << "slice " << i;
    }
    auto* sums = static_cast<double*>(cuda->allocate(3 * sizeof(double)));
    cuda->optimizer_kernels().sum_squares_many(xs, ns, 3, sums);
    double many[3];
    cuda->to_host(many, sums, sizeof many);
    cuda->release(sums);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(many[i], cuda->optimizer_kernels().sum_squares(xs[i], ns[i])) << "tensor " << i;
  }
}

// ---- optimizers ----------------------------------------------------------------------------------
// Weight dtype, gradient dtype: the three pairs the seam supports.
const std::pair<DType, DType> kWeightGrad[] = {{DType::F32, DType::F32}, {DType::BF16, DType::BF16}, {DType::BF16, DType::F32}};

// The whole model: a reduced llama_tiny (2 layers, head dim 16, vocabulary 301, T = 37 with padding)
// through both backends from the same weights: the loss and every gradient tensor.
TEST_P(CudaVsCpu, ModelForwardBackwardMatchesTheCpuBackend) {
  ModelConfig cfg;
  cfg.name = "llama_tiny_reduced";
  cfg.vocab_size = 301;
  cfg.hidden_size = 32;
  cfg.intermediate_size = 86;  // llama_tiny's 688 / 8: odd multiple of 2, no 16-byte BF16 rows
  cfg.num_hidden_layers = 2;
  cfg.num_attention_heads = 2;
  cfg.max_position_embeddings = 64;
  cfg.initializer_range = 0.1;
  const int64_t B = 2, T = 37;
  std::vector<int32_t> tokens = random_ids(B * T, 301, 9), targets(B * T);
  std::vector<uint8_t> mask(B * T, 1);
  for (int64_t i = 0; i < B * T; ++i) targets[i] = tokens[(i + 1) % (B * T)];
  mask[B * T - 1] = mask[B * T - 2] = 0;
  const MicroBatch mb{tokens.data(), targets.data(), mask.data(), B, T};
  // Gradients: FP32 summation-order differences only in FP32 (bound 1e-5 of each tensor's largest
  // gradient; measured 1.1e-6); in BF16 each stored activation may round to a neighbouring BF16
  // value and the difference compounds through the layers: bound 5e-2 (measured 2.4e-2); the loss
  // 1e-5 (FP32) and 2e-3 (BF16) relative.
  for (DType t : kTypes) {
    LlamaModel mc(*cpu, cfg, t, B, T), mg(*cuda, cfg, t, B, T);
    mc.init_random(3);
    mg.params_from_host(mc.params_to_host());
    const LossSum lc = mc.forward_backward(mb, 1.0f), lg = mg.forward_backward(mb, 1.0f);
    EXPECT_NEAR(lg.mean(), lc.mean(), (t == DType::F32 ? 1e-5 : 2e-3) * lc.mean()) << dtype_name(t);
    const std::vector<float> gc = mc.grads_to_host(), gg = mg.grads_to_host();
    for (const auto& tensor : mc.tensors()) {
      const Vec a(gg.begin() + tensor.offset, gg.begin() + tensor.offset + tensor.numel());
      const Vec e(gc.begin() + tensor.offset, gc.begin() + tensor.offset + tensor.numel());
      EXPECT_TRUE(close(a, e, t == DType::F32 ? 1e-5 : 5e-2)) << tensor.name << " " << dtype_name(t);
    }
  }
}

// No float atomics anywhere: the same inputs give the same bits whatever the block schedule (here:
// emulation worker counts and fiber orders; on a GPU: runs and devices).
TEST(CudaBackend, ModelGradientsAreBitwiseReproducibleAcrossSchedules) {
  const CudaProbe* p = cuda_plugin();
  if (!p) GTEST_SKIP() << "no CUDA plugin";
  ModelConfig cfg;
  cfg.name = "determinism";
  cfg.vocab_size = 97;
  cfg.hidden_size = 32;
  cfg.intermediate_size = 40;
  cfg.num_hidden_layers = 1;
  cfg.num_attention_heads = 2;
  cfg.max_position_embeddings = 64;
  const int64_t B = 2, T = 33;
  std::vector<int32_t> tokens = random_ids(B * T, 97, 4), targets = random_ids(B * T, 97, 5);
  const MicroBatch mb{tokens.data(), targets.data(), nullptr, B, T};
  std::vector<float> first;
  double first_loss = 0;
  for (const Mode m : {Mode{"forward", "1"}, Mode{"random", "3"}, Mode{"reverse", "2"}, Mode{"interleaved", "2"}}) {
    set_emulation_mode(m);
    auto be = make_cuda_backend(*p);
    LlamaModel model(*be, cfg, DType::BF16, B, T);
    model.init_random(11);
    const double loss = model.forward_backward(mb, 1.0f).sum;
    const std::vector<float> g = model.grads_to_host();
    if (first.empty()) {
      first = g, first_loss = loss;
      continue;
    }
    EXPECT_EQ(loss, first_loss) << m;
    EXPECT_EQ(std::memcmp(g.data(), first.data(), g.size() * sizeof(float)), 0) << m;
  }
  clear_emulation_mode();
}

// forward order on 2 workers; and every launch under three orders on 3 workers, compared byte for byte.
INSTANTIATE_TEST_SUITE_P(Emulation, CudaVsCpu, ::testing::Values(Mode{"forward", "2"}, Mode{"reverse,random,interleaved", "3"}),
                         [](const ::testing::TestParamInfo<Mode>& i) {
                           return std::string(std::strchr(i.param.order, ',') ? "three_orders" : i.param.order) + "_workers" + i.param.workers;
                         });
