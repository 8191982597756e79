// The tensor-core attention kernels (kernels/cuda/attention_mma.cu: mma.sync m16n8k16 through
// kernels/cuda/warp_matrix.cuh) against the CPU backend, BF16 storage, head sizes 64 and 128, causal,
// at T = 1 (one partial tile), 17, 255 (tails), 256 (whole tiles), 1024 (16 query blocks, the
// diagonal and the off-diagonal tiles of both backward kernels), B*H = 1 and 8. In the emulated
// build every mma and ldmatrix is a warp collective that places each element in the lane the PTX
// ISA says, so a fragment read wrongly is a wrong result here. The profile proves the tensor-core
// kernels ran (not the SIMT fallback), and the SIMT kernels still serve FP32 storage and other head
// sizes (tests/test_cuda_backend.cpp).
//
// Tolerance: BF16 outputs, 8e-3 of the largest element as every BF16 op (tests/test_cuda_backend.cpp);
// the tensor-core kernels also round P and dS to BF16 before their second products (as FlashAttention
// does), which the measured errors include (MULTINORM_TEST_ERRORS=1, 2026-11-25): out 5.3e-3, dqkv
// 6.6e-3 at most over these shapes, each one BF16 ulp of an element near the largest (0.0156 at 2.9,
// 0.031 at 4.75). lse is FP32 (1e-5 relative; measured 1.5e-7 at most).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>

#include "multinorm/device.h"
#include "test_backends.h"
#include "test_support.h"

using namespace multinorm;
using namespace multinorm::testing;

namespace {

constexpr double kBf16 = 8e-3, kF32 = 1e-5;

struct Shape {
  int64_t B, T, H, D;
};
std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << "B" << s.B << "_T" << s.T << "_H" << s.H << "_D" << s.D; }

class TensorCoreAttention : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    const CudaProbe* p = test_cuda_plugin();
    if (!p) GTEST_SKIP() << "no CUDA plugin (emulated or real) was built";
    cuda = make_cuda_backend(*p);
  }
  std::unique_ptr<Backend> cpu = make_cpu_backend(2);
  std::unique_ptr<Backend> cuda;
};

bool ran(const std::vector<KernelTime>& profile, const std::string& name) {
  return std::any_of(profile.begin(), profile.end(), [&](const KernelTime& k) { return k.name == name && k.launches > 0; });
}

TEST_P(TensorCoreAttention, MatchesTheCpuBackend) {
  const Shape s = GetParam();
  const int64_t C = s.H * s.D, BT = s.B * s.T;
  const DType t = DType::BF16;
  DeviceBuffer qkv_c(*cpu, random_vec(BT * 3 * C, 1), t), qkv_g(*cuda, random_vec(BT * 3 * C, 1), t);
  DeviceBuffer out_c(*cpu, BT * C, t), out_g(*cuda, BT * C, t), lse_c(*cpu, s.B * s.H * s.T, DType::F32), lse_g(*cuda, s.B * s.H * s.T, DType::F32);
  DeviceBuffer dout_c(*cpu, random_vec(BT * C, 2), t), dout_g(*cuda, random_vec(BT * C, 2), t);
  DeviceBuffer dqkv_c(*cpu, BT * 3 * C, t), dqkv_g(*cuda, BT * 3 * C, t);

  cuda->set_profiling(true);
  cpu->attention_forward(out_c.buf(), lse_c.f32(), qkv_c.buf(), s.B, s.T, s.H, s.D);
  cuda->attention_forward(out_g.buf(), lse_g.f32(), qkv_g.buf(), s.B, s.T, s.H, s.D);
  EXPECT_TRUE(close(out_g.get(), out_c.get(), kBf16)) << "out";
  EXPECT_TRUE(close(lse_g.get(), lse_c.get(), kF32)) << "lse";
  // The backward pass from the CPU's forward results, so both see the same inputs.
  out_g.set(out_c.get());
  lse_g.set(lse_c.get());
  cpu->attention_backward(dqkv_c.buf(), dout_c.buf(), qkv_c.buf(), out_c.buf(), lse_c.f32(), s.B, s.T, s.H, s.D);
  cuda->attention_backward(dqkv_g.buf(), dout_g.buf(), qkv_g.buf(), out_g.buf(), lse_g.f32(), s.B, s.T, s.H, s.D);
  EXPECT_TRUE(close(dqkv_g.get(), dqkv_c.get(), kBf16)) << "dqkv";
  const auto profile = cuda->take_profile();
  cuda->set_profiling(false);
  for (const char* k : {"attention_forward_mma", "attention_backward_dkdv_mma", "attention_backward_dq_mma"})
    EXPECT_TRUE(ran(profile, k)) << k << " did not run: the SIMT fallback served a tensor-core shape";
}

// In the emulated build every launch runs under four fiber and block orders on three workers from the
// same device memory and must leave the same bytes (a race through shared or global memory, or a
// block that depends on another, shows as a difference); racecheck watches every run. On a GPU the
// variables are ignored and this is one more shape.
TEST(TensorCoreAttentionOrders, SameBytesUnderEveryFiberOrder) {
  const CudaProbe* p = test_cuda_plugin();
  if (!p) GTEST_SKIP() << "no CUDA plugin (emulated or real) was built";
  ::setenv("MULTINORM_EMU_ORDERS", "forward,reverse,random,interleaved", 1);
  ::setenv("MULTINORM_EMU_WORKERS", "3", 1);
  auto cuda = make_cuda_backend(*p);
  // Both head sizes: their kernels differ (two slabs a warp and Q in registers at D = 64; one slab
  // and Q read from shared memory at D = 128).
  for (const int64_t D : {64, 128}) {
    const int64_t B = 2, T = 130, H = 2, C = H * D, BT = B * T;
    DeviceBuffer qkv(*cuda, random_vec(BT * 3 * C, 1), DType::BF16), out(*cuda, BT * C, DType::BF16), lse(*cuda, B * H * T, DType::F32),
        dout(*cuda, random_vec(BT * C, 2), DType::BF16), dqkv(*cuda, BT * 3 * C, DType::BF16);
    EXPECT_NO_THROW(cuda->attention_forward(out.buf(), lse.f32(), qkv.buf(), B, T, H, D)) << "D = " << D;
    EXPECT_NO_THROW(cuda->attention_backward(dqkv.buf(), dout.buf(), qkv.buf(), out.buf(), lse.f32(), B, T, H, D)) << "D = " << D;
  }
  ::unsetenv("MULTINORM_EMU_ORDERS");
  ::unsetenv("MULTINORM_EMU_WORKERS");
}

// B*H = 8 at the paper's sequence lengths and tails; B*H = 1 at T = 1024 (the emulator runs every
// warp's mma as a collective of 32 fibers: ~10 s for this shape's forward and backward).
INSTANTIATE_TEST_SUITE_P(Shapes, TensorCoreAttention,
                         ::testing::Values(Shape{1, 1, 1, 64}, Shape{2, 17, 4, 64}, Shape{2, 255, 4, 64}, Shape{2, 256, 4, 64}, Shape{1, 1024, 1, 64},
                                           Shape{1, 1, 1, 128}, Shape{2, 17, 4, 128}, Shape{2, 255, 4, 128}, Shape{1, 256, 8, 128},
                                           Shape{1, 1024, 1, 128}),
                         [](const ::testing::TestParamInfo<Shape>& i) {
                           std::ostringstream os;
                           os << i.param;
                           return os.str();
                         });

}  // namespace
