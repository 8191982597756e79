// kernels/cuda/warp_matrix.cuh's emulated path against the PTX ISA's fragment layouts, lane by lane:
//   - ldmatrix .x4 (plain and .trans): every lane's four registers hold the elements the layout
//     names, from matrices of distinct values (so a swapped element or half is seen);
//   - mma m16n8k16: fragments built by hand from the documented layout give the plain matrix
//     product (in double: BF16 products are exact, 16 of them sum exactly in double) added to C;
//   - the two together as the attention kernels use them (A by ldmatrix from a row-major tile, B by
//     ldmatrix from an [n][k] tile and by ldmatrix .trans from a [k][n] tile);
//   - a planted layout bug (two A registers swapped) gives a wrong product, so the comparison can
//     fail; ldmatrix at a misaligned or non-shared address is an error naming the kernel and lane;
//   - cp.async: a copy lands at the wait that lets its group complete and not before; reading its
//     destination before that wait (the planted bug), or issuing a copy over bytes another thread
//     still reads (no barrier between), is an error naming cp.async; zero-fill reads nothing.
// On a GPU the same primitives are single PTX instructions (the nvcc build), which the kernels'
// comparison with the CPU backend checks there.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../kernels/cuda/cuda_compat.h"
#include "../kernels/cuda/warp_matrix.cuh"
#include "emulated_device.h"

using emulated::DeviceArray;
using emulated::error_of;
using multinorm::cuda::bf16;
using multinorm::cuda::launch;
using multinorm::cuda::ldmatrix_x4;
using multinorm::cuda::ldmatrix_x4_trans;
using multinorm::cuda::cp_async_16;
using multinorm::cuda::cp_async_commit;
using multinorm::cuda::cp_async_wait;
using multinorm::cuda::mma_bf16_16816;

namespace {

uint16_t bits_of(float f) {  // f is exactly representable in BF16 here
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>(b >> 16);
}
float float_of(uint16_t h) {
  const uint32_t b = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}


// ---- ldmatrix -------------------------------------------------------------------------------------
// Four 8x8 matrices, matrix i at rows 8i..8i+7 of a [32][8 + pad] shared tile; lane l passes row l.
// out[l * 4 + i]: lane l's register i. `offset` (elements) shifts every row address (misalignment).
__global__ void ldmatrix_kernel(uint32_t* out, const uint16_t* m, bool trans, int offset, bool from_global) {
  __shared__ __align__(16) uint16_t tile[32 * 16];
  const int lane = threadIdx.x;
  for (int c = 0; c < 8; ++c) tile[lane * 16 + c] = m[lane * 8 + c];
  __syncwarp();
  uint32_t r[4];
  const void* row = from_global ? static_cast<const void*>(m + lane * 8 + offset) : static_cast<const void*>(tile + lane * 16 + offset);
  if (trans)
    ldmatrix_x4_trans(r, row);
  else
    ldmatrix_x4(r, row);
  for (int i = 0; i < 4; ++i) out[lane * 4 + i] = r[i];
}

std::vector<uint16_t> distinct_matrices() {  // element (matrix i, row r, col c) = 64 i + 8 r + c, exact in BF16
  std::vector<uint16_t> m(32 * 8);
  for (int k = 0; k < 256; ++k) m[k] = bits_of(float(k));
  return m;
}

void check_ldmatrix(bool trans) {
  const std::vector<uint16_t> h = distinct_matrices();
  DeviceArray<uint16_t> m(h);
  DeviceArray<uint32_t> out(32 * 4);
  launch("ldmatrix_kernel", ldmatrix_kernel, dim3(1), dim3(32), 0, nullptr, out.p, m.p, trans, 0, false);
  const std::vector<uint32_t> r = out.get();
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
      // plain: M_i[g][2t], M_i[g][2t + 1]; .trans: M_i[2t][g], M_i[2t + 1][g]
      const int lo = trans ? 64 * i + 8 * (2 * t) + g : 64 * i + 8 * g + 2 * t;
      const int hi = trans ? 64 * i + 8 * (2 * t + 1) + g : 64 * i + 8 * g + 2 * t + 1;
      EXPECT_EQ(float_of(r[lane * 4 + i] & 0xffff), float(lo)) << "lane " << lane << " register " << i << (trans ? " (.trans)" : "");
      EXPECT_EQ(float_of(r[lane * 4 + i] >> 16), float(hi)) << "lane " << lane << " register " << i << (trans ? " (.trans)" : "");
    }
  }
}

// ---- mma from hand-built fragments ------------------------------------------------------------------
// a[16][16], b[16][8] (row-major, BF16 bits), c[16][8] FP32 in; d[16][8] out. Each lane builds its
// fragments from the documented layout; `planted` swaps a[1] and a[2] (a wrong layout).
__global__ void mma_kernel(float* d, const uint16_t* a, const uint16_t* b, const float* c, bool planted) {
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  auto pair = [](uint16_t lo, uint16_t hi) { return uint32_t(lo) | uint32_t(hi) << 16; };
  uint32_t af[4] = {pair(a[g * 16 + 2 * t], a[g * 16 + 2 * t + 1]), pair(a[(g + 8) * 16 + 2 * t], a[(g + 8) * 16 + 2 * t + 1]),
                    pair(a[g * 16 + 2 * t + 8], a[g * 16 + 2 * t + 9]), pair(a[(g + 8) * 16 + 2 * t + 8], a[(g + 8) * 16 + 2 * t + 9])};
  if (planted) std::swap(af[1], af[2]);
  const uint32_t bf[2] = {pair(b[(2 * t) * 8 + g], b[(2 * t + 1) * 8 + g]), pair(b[(2 * t + 8) * 8 + g], b[(2 * t + 9) * 8 + g])};
  float acc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
  mma_bf16_16816(acc, af, bf);
  d[g * 8 + 2 * t] = acc[0], d[g * 8 + 2 * t + 1] = acc[1], d[(g + 8) * 8 + 2 * t] = acc[2], d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

struct Operands {
  std::vector<uint16_t> a, b;
  std::vector<float> c;
};
Operands random_operands(uint32_t seed, int k_cols_b = 8) {
  Operands o;
  uint32_t x = seed;
  auto next = [&] {  // values m / 64, |m| < 128: exact in BF16, products and sums exact in double
    x = x * 1664525u + 1013904223u;
    return float(static_cast<int>(x >> 24) - 128) / 64.0f;
  };
  for (int i = 0; i < 16 * 16; ++i) o.a.push_back(bits_of(next()));
  for (int i = 0; i < 16 * k_cols_b; ++i) o.b.push_back(bits_of(next()));
  for (int i = 0; i < 16 * k_cols_b; ++i) o.c.push_back(next());
  return o;
}
// d = a b + c in double, [16][n]
std::vector<double> product(const Operands& o, int n) {
  std::vector<double> d(16 * n);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < n; ++j) {
      double s = o.c[i * n + j];
      for (int k = 0; k < 16; ++k) s += double(float_of(o.a[i * 16 + k])) * double(float_of(o.b[k * n + j]));
      d[i * n + j] = s;
    }
  return d;
}
// Every element exact (the operands are chosen so): any misplaced element shows.
::testing::AssertionResult same(const std::vector<float>& got, const std::vector<double>& want) {
  for (size_t i = 0; i < want.size(); ++i)
    if (double(got[i]) != want[i])
      return ::testing::AssertionFailure() << "element (" << i / (want.size() / 16) << ", " << i % (want.size() / 16) << "): " << got[i] << ", expected " << want[i];
  return ::testing::AssertionSuccess();
}

std::vector<float> run_mma(const Operands& o, bool planted) {
  DeviceArray<uint16_t> a(o.a), b(o.b);
  DeviceArray<float> c(o.c), d(16 * 8);
  launch("mma_kernel", mma_kernel, dim3(1), dim3(32), 0, nullptr, d.p, a.p, b.p, c.p, planted);
  return d.get();
}

// ---- ldmatrix + mma as the attention kernels use them ---------------------------------------------
// D[16][16] = A[16][16] B[16][16] from a row-major A tile (ldmatrix: A fragments), B given either as
// B^T [n][k] (plain ldmatrix: B fragments of two n-tiles' k steps) or as B [k][n] (.trans).
__global__ void tiles_kernel(float* d, const uint16_t* a, const uint16_t* b, bool b_transposed_in_memory) {
  __shared__ __align__(16) uint16_t as[16 * 24], bs[16 * 24];  // rows of 16 + 8 padding elements
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  for (int k = lane; k < 256; k += 32) {
    as[(k / 16) * 24 + k % 16] = a[k];
    const int r = k / 16, c = k % 16;  // b is [k = r][n = c]
    if (b_transposed_in_memory)
      bs[c * 24 + r] = b[k];  // [n][k]
    else
      bs[r * 24 + c] = b[k];  // [k][n]
  }
  __syncwarp();
  uint32_t af[4];
  ldmatrix_x4(af, as + (lane % 16) * 24 + (lane / 16) * 8);
  float acc[2][4] = {};
  uint32_t bf[4];
  if (b_transposed_in_memory) {
    for (int nt = 0; nt < 2; ++nt) {  // matrices: n rows 8nt.., k 0-7 / 8-15 (the second pair unused: k 16-31 are padding)
      uint32_t r[4];
      ldmatrix_x4(r, bs + (nt * 8 + lane % 8) * 24 + ((lane / 8) % 2) * 8);
      mma_bf16_16816(acc[nt], af, {r[0], r[1]});
    }
  } else {
    ldmatrix_x4_trans(bf, bs + (lane % 16) * 24 + (lane / 16) * 8);  // k rows 0-15, n columns 0-7 / 8-15
    mma_bf16_16816(acc[0], af, {bf[0], bf[1]});
    mma_bf16_16816(acc[1], af, {bf[2], bf[3]});
  }
  for (int nt = 0; nt < 2; ++nt) {
    d[g * 16 + nt * 8 + 2 * t] = acc[nt][0], d[g * 16 + nt * 8 + 2 * t + 1] = acc[nt][1];
    d[(g + 8) * 16 + nt * 8 + 2 * t] = acc[nt][2], d[(g + 8) * 16 + nt * 8 + 2 * t + 1] = acc[nt][3];
  }
}


}  // namespace

TEST(WarpMatrix, LdmatrixGivesEveryLaneTheElementsOfThePtxLayout) {
  check_ldmatrix(false);
  check_ldmatrix(true);
}

TEST(WarpMatrix, MmaFromHandBuiltFragmentsIsThePlainProductPlusC) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    const Operands o = random_operands(seed);
    EXPECT_TRUE(same(run_mma(o, false), product(o, 8))) << "seed " << seed;
  }
}

TEST(WarpMatrix, APlantedLayoutBugGivesAWrongProduct) {
  const Operands o = random_operands(1);
  EXPECT_FALSE(same(run_mma(o, true), product(o, 8)));
}

TEST(WarpMatrix, LdmatrixAndMmaTogetherAsTheAttentionKernelsUseThem) {
  Operands o = random_operands(4, 16);
  std::fill(o.c.begin(), o.c.end(), 0.0f);
  const std::vector<double> want = product(o, 16);
  for (bool transposed : {true, false}) {
    DeviceArray<uint16_t> a(o.a), b(o.b);
    DeviceArray<float> d(16 * 16);
    launch("tiles_kernel", tiles_kernel, dim3(1), dim3(32), 0, nullptr, d.p, a.p, b.p, transposed);
    EXPECT_TRUE(same(d.get(), want)) << (transposed ? "B as [n][k], plain ldmatrix" : "B as [k][n], ldmatrix .trans");
  }
}

TEST(WarpMatrix, LdmatrixAtAMisalignedOrGlobalAddressIsAnError) {
  const std::vector<uint16_t> h = distinct_matrices();
  DeviceArray<uint16_t> m(h);
  DeviceArray<uint32_t> out(32 * 4);
  const std::string misaligned = error_of([&] { launch("ldmatrix_kernel", ldmatrix_kernel, dim3(1), dim3(32), 0, nullptr, out.p, m.p, false, 1, false); });
  EXPECT_NE(misaligned.find("ldmatrix_kernel"), std::string::npos) << misaligned;
  EXPECT_NE(misaligned.find("not 16-byte aligned"), std::string::npos) << misaligned;
  const std::string global = error_of([&] { launch("ldmatrix_kernel", ldmatrix_kernel, dim3(1), dim3(32), 0, nullptr, out.p, m.p, false, 0, true); });
  EXPECT_NE(global.find("outside shared memory"), std::string::npos) << global;
}

namespace {

// 32 threads copy 32 x 16 bytes into shared memory by cp.async (two groups: the first 16 threads'
// copies, then the rest), then each thread reads its neighbour's 16 bytes. `mode`: 0 correct (wait
// for both groups, barrier, read); 1 the planted bug: read before waiting; 2 wait only for the first
// group (one may stay in flight) and read from the second; 3 zero-fill (valid false) from a null source;
// 4 correct, then the next copy issued over the slot a neighbour just read, with no barrier between.
__global__ void cp_async_kernel(uint32_t* out, const uint32_t* in, int mode) {
  MN_DYNAMIC_SHARED(uint32_t, tile);  // 32 x 4 words
  const int t = threadIdx.x;
  if (t < 16) cp_async_16(tile + 4 * t, mode == 3 ? nullptr : in + 4 * t, mode != 3);
  cp_async_commit();
  if (t >= 16) cp_async_16(tile + 4 * t, mode == 3 ? nullptr : in + 4 * t, mode != 3);
  cp_async_commit();
  if (mode == 2) {
    cp_async_wait<1>();
  } else if (mode != 1) {
    cp_async_wait<0>();
  }
  __syncthreads();
  const int from = mode == 2 ? 16 + t % 16 : (t + 1) % 32;
  for (int k = 0; k < 4; ++k) out[4 * t + k] = tile[4 * from + k];
  if (mode == 4) cp_async_16(tile + 4 * t, in + 4 * t, true), cp_async_commit();
  cp_async_wait<0>();
}

std::string run_cp_async(int mode, std::vector<uint32_t>* result) {
  std::vector<uint32_t> h(128);
  for (int i = 0; i < 128; ++i) h[i] = 1000u + uint32_t(i);
  DeviceArray<uint32_t> in(h), out(128);
  const std::string e = error_of([&] { launch("cp_async_kernel", cp_async_kernel, dim3(1), dim3(32), 512, nullptr, out.p, in.p, mode); });
  if (result) *result = out.get();
  return e;
}

}  // namespace

TEST(AsyncCopy, LandsAtItsWaitAndZeroFillsWithoutReading) {
  std::vector<uint32_t> r;
  ASSERT_EQ(run_cp_async(0, &r), "");
  for (int t = 0; t < 32; ++t)
    for (int k = 0; k < 4; ++k) EXPECT_EQ(r[4 * t + k], 1000u + uint32_t(4 * ((t + 1) % 32) + k)) << t;
  ASSERT_EQ(run_cp_async(3, &r), "");
  for (uint32_t v : r) EXPECT_EQ(v, 0u);
}

TEST(AsyncCopy, ReadingBeforeTheWaitIsAnError) {
  const std::string e = run_cp_async(1, nullptr);  // the planted bug: no wait before the barrier
  EXPECT_NE(e.find("cp_async_kernel"), std::string::npos) << e;
  EXPECT_NE(e.find("the destination of a cp.async"), std::string::npos) << e;
  EXPECT_NE(e.find("has not landed"), std::string::npos) << e;
}

TEST(AsyncCopy, AGroupLeftInFlightHasNotLanded) {
  // wait_group 1 completes the older group only: the second group's bytes are not there yet.
  const std::string e = run_cp_async(2, nullptr);
  EXPECT_NE(e.find("has not landed"), std::string::npos) << e;
}

TEST(AsyncCopy, ACopyOverBytesAnotherThreadStillReadsIsARace) {
  const std::string e = run_cp_async(4, nullptr);  // double-buffer reuse without the barrier
  EXPECT_NE(e.find("write after read"), std::string::npos) << e;
}
