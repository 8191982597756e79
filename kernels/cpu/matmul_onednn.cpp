#include "matmul_onednn.h"

#include "matmul_packed.h"

#include <cstdlib>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>

#include "multinorm/error.h"

namespace multinorm::cpu {

namespace {
// oneDNN 2.6 (Debian 12) dispatches BF16 GEMMs to AMX tiles on CPUs that report them (Sapphire
// Rapids and later), and its AMX brgemm kernels die there with SIGILL (a tilezero executed with no
// tile configuration loaded; seen on batched BF16 matmuls such as attention's). So it is capped at
// AVX512_BF16 (vdpbf16ps), the ISA every figure in docs/ was measured with, before the first
// primitive. ONEDNN_MAX_CPU_ISA, when set, decides instead (e.g. to try AMX with a newer oneDNN).
void cap_onednn_isa() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (!std::getenv("ONEDNN_MAX_CPU_ISA") && !std::getenv("DNNL_MAX_CPU_ISA"))
      dnnl::set_max_cpu_isa(dnnl::cpu_isa::avx512_core_bf16);
  });
}
dnnl::memory::data_type dnnl_type(DType t) {
  return t == DType::BF16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}
}  // namespace

struct OneDnnMatmul::Impl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  struct Entry {
    dnnl::matmul primitive;
    dnnl::memory::desc a, b, out;
  };
  std::unordered_map<std::string, Entry> cache;
  PackedScratch packed;
};

OneDnnMatmul::OneDnnMatmul() : impl_((cap_onednn_isa(), std::make_unique<Impl>())) {}
OneDnnMatmul::~OneDnnMatmul() = default;
size_t OneDnnMatmul::cached_primitives() const { return impl_->cache.size(); }
int64_t OneDnnMatmul::scratch_bytes() const { return impl_->packed.bytes(); }
PackedScratch& OneDnnMatmul::packed_scratch() { return impl_->packed; }

void OneDnnMatmul::run_batched(Buf out, Buf a, Buf b, int64_t batch, int64_t M, int64_t N, int64_t K, bool trans_a,
                               bool trans_b, bool accumulate) {
  if (a.dtype != b.dtype) throw Error("matmul: operands must share a dtype");
  // BF16 GEMMs go to the packed GEMM where the CPU has AMX tiles (matmul_packed.h: 4-8x oneDNN's
  // AVX512_BF16) or AVX512_BF16 (as fast as oneDNN, and its fused epilogues run).
  if (batch == 1 && a.dtype == DType::BF16 && packed_bf16_gemm_usable()) {
    packed_matmul(out, static_cast<const bf16*>(a.ptr), static_cast<const bf16*>(b.ptr), M, N, K, trans_a, trans_b,
                  accumulate, impl_->packed);
    return;
  }
  const std::string key = std::to_string(batch) + "x" + std::to_string(M) + "," + std::to_string(N) + "," + std::to_string(K) + "," +
                          std::to_string(trans_a) + std::to_string(trans_b) + std::to_string(accumulate) +
                          dtype_name(a.dtype) + dtype_name(out.dtype);
  auto it = impl_->cache.find(key);
  if (it == impl_->cache.end()) {
    using dims = dnnl::memory::dims;
    // Row-major storage; a transposed operand is described by its strides, not copied.
    dnnl::memory::desc a_md, b_md, o_md;
    if (batch == 1) {
      a_md = {dims{M, K}, dnnl_type(a.dtype), trans_a ? dims{1, M} : dims{K, 1}};
      b_md = {dims{K, N}, dnnl_type(b.dtype), trans_b ? dims{1, K} : dims{N, 1}};
      o_md = {dims{M, N}, dnnl_type(out.dtype), dims{N, 1}};
    } else {
      a_md = {dims{batch, M, K}, dnnl_type(a.dtype), trans_a ? dims{M * K, 1, M} : dims{M * K, K, 1}};
      b_md = {dims{batch, K, N}, dnnl_type(b.dtype), trans_b ? dims{K * N, 1, K} : dims{K * N, N, 1}};
      o_md = {dims{batch, M, N}, dnnl_type(out.dtype), dims{M * N, N, 1}};
    }
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, o_md), attr, impl_->engine);
    it = impl_->cache.emplace(key, Impl::Entry{dnnl::matmul(pd), a_md, b_md, o_md}).first;
  }
  const auto& e = it->second;
  dnnl::memory am(e.a, impl_->engine, a.ptr), bm(e.b, impl_->engine, b.ptr), om(e.out, impl_->engine, out.ptr);
  e.primitive.execute(impl_->stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, om}});
  impl_->stream.wait();
}

}  // namespace multinorm::cpu
