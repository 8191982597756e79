#include "matmul_onednn.h"

#include <oneapi/dnnl/dnnl.hpp>

#include "multinorm/error.h"

namespace multinorm::cpu {

namespace {
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
};

OneDnnMatmul::OneDnnMatmul() : impl_(std::make_unique<Impl>()) {}
OneDnnMatmul::~OneDnnMatmul() = default;
size_t OneDnnMatmul::cached_primitives() const { return impl_->cache.size(); }

void OneDnnMatmul::run_batched(Buf out, Buf a, Buf b, int64_t batch, int64_t M, int64_t N, int64_t K, bool trans_a,
                               bool trans_b, bool accumulate) {
  if (a.dtype != b.dtype) throw Error("matmul: operands must share a dtype");
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
