// The CUDA backend: device memory, one stream, cuBLASLt GEMMs and the hand-written kernels of
// kernels/cuda/*.cu behind the Backend seam. Built twice from this source: by nvcc into
// libmultinorm_cuda.so, and by g++ into libmultinorm_cuda_emulated.so, where every kernel runs on the
// CPU through the emulation layer (a test instrument). The stream and everything that orders work on
// it (fences, late copies, uploads, graphs, the count of host waits) is the backend's CudaQueue
// (cuda_queue.h): every op takes its stream from CudaQueue::issue(), every host crossing goes
// through the queue (to_device: upload, to_host and sum_squares: read).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <unordered_map>
#include <string>
#include <vector>

#include "../common/dtype_dispatch.h"
#include "check.h"
#include "cuda_optimizer_kernels.h"
#include "cuda_queue.h"
#include "device_buffers.h"
#include "gemm.h"
#include "kernels.h"
#include "nccl_communicator.h"
#include "profiler.h"
#include "multinorm/backend.h"
#include "multinorm/error.h"

namespace multinorm::cuda {

namespace {

template <class Fn>
void with_type(DType t, Fn&& fn) {
  dispatch::with_type<bf16>(t, fn);
}
template <class Fn>
void with_types(DType t, DType g, const char* op, Fn&& fn) {
  dispatch::with_types<bf16>(t, g, op, fn);
}
using dispatch::as;
using dispatch::same_dtype;
cudaDataType lt_type(DType t) { return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }
std::string shape(std::initializer_list<int64_t> dims) {
  std::string s;
  for (int64_t d : dims) s += (s.empty() ? "[" : ", ") + std::to_string(d);
  return s + "]";
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    MN_CUDA_CHECK(cudaSetDevice(device), "selecting CUDA device " + std::to_string(device));
    q_ = std::make_unique<CudaQueue>();
    gemm_ = std::make_unique<LtGemm>();
    for (auto* s : {&rms_scratch_, &attn_scratch_, &bucket_scratch_, &head_scratch_}) *s = std::make_unique<Scratch>(*q_);
    for (auto& s : gemm_stage_) s = std::make_unique<Scratch>(*q_);
    descriptors_ = std::make_unique<DescriptorCache>(*q_);
    optimizer_ = std::make_unique<CudaOptimizerKernels>(*q_, *gemm_, *descriptors_);
  }
  ~CudaBackend() override {
    optimizer_.reset();
    descriptors_.reset();
    for (auto* s : {&rms_scratch_, &attn_scratch_, &bucket_scratch_, &head_scratch_}) s->reset();
    for (auto& s : gemm_stage_) s.reset();
    gemm_.reset();
    q_.reset();  // waits for the stream
  }

  std::string name() const override { return MN_EMULATED ? "cuda-emulated" : "cuda"; }
  WorkQueue& queue() override { return *q_; }

  // ---- collectives: NCCL on a stream of its own, after this backend's stream ------------------
  std::vector<uint8_t> collective_id() override { return nccl_unique_id(); }
  std::unique_ptr<Communicator> create_communicator(const std::vector<uint8_t>& id, int rank, int size,
                                                    double timeout_s) override {
    return make_nccl_communicator(id, rank, size, timeout_s, *q_);
  }
  int threads() const override { return 1; }
  bool host_memory() const override { return false; }
  void set_profiling(bool on) override { profiler::set(on); }
  std::vector<KernelTime> take_profile() override { return profiler::take(); }

  int64_t workspace_bytes() const override {
    return static_cast<int64_t>(gemm_->workspace_bytes() + rms_scratch_->bytes() + attn_scratch_->bytes() + bucket_scratch_->bytes() +
                                head_scratch_->bytes() + descriptors_->bytes() + gemm_stage_[0]->bytes() + gemm_stage_[1]->bytes() +
                                gemm_stage_[2]->bytes()) +
           optimizer_->scratch_bytes();
  }

  // ---- memory -----------------------------------------------------------------------------------
  void* allocate(int64_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(bytes ? bytes : 1));
    if (e == cudaErrorStreamCaptureUnsupported) {
      cudaGetLastError();
      throw_cuda_error("cudaMalloc of " + std::to_string(bytes) + " bytes during a graph capture", e);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky allocation error
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw Error("CUDA out of memory: cudaMalloc of " + std::to_string(bytes) + " bytes on device " + std::to_string(device_) + " failed (" +
                  cudaGetErrorName(e) + "); the device has " + std::to_string(free_b) + " of " + std::to_string(total_b) + " bytes free");
    }
    MN_CUDA_CHECK(cudaMemsetAsync(p, 0, static_cast<size_t>(bytes), q_->issue()), "zero-filling a new allocation");
    return p;
  }
  void release(void* ptr) override {
    q_->wait_all("release (waiting for the stream)");
    MN_CUDA_CHECK(cudaFree(ptr), "release");
  }
  // Small copies (a micro-batch's tokens, an update's scalars) go through the queue's pinned upload
  // ring, so the host never waits for the stream to stage them; the caller may reuse src at once.
  void to_device(void* dst, const void* src, int64_t bytes) override { q_->upload(dst, src, bytes, "to_device"); }
  void to_host(void* dst, const void* src, int64_t bytes) override { q_->read(dst, src, bytes, "to_host"); }
  void zero(Buf x, int64_t n) override {
    MN_CUDA_CHECK(cudaMemsetAsync(x.ptr, 0, static_cast<size_t>(n * dtype_bytes(x.dtype)), q_->issue()), "zero " + shape({n}));
  }
  void convert(Buf dst, Buf src, int64_t n) override {
    with_type(dst.dtype, [&](auto* d) {
      with_type(src.dtype, [&](auto* s) {
        cuda::convert(as<std::remove_pointer_t<decltype(d)>>(dst), as<std::remove_pointer_t<decltype(s)>>(src), n, q_->issue());
      });
    });
  }

  // ---- GEMM ---------------------------------------------------------------------------------------
  // An operand whose rows or base are not 16-byte aligned (an MLP width of 5461, where the plan does
  // not pad it) is staged through scratch with 128-byte rows, where cuBLASLt runs its fast kernels
  // (cuda_scratch::gemm_staging): a and b copied in, out copied in when accumulating and back after
  // (an FP32 out written afresh and added back instead: cuda_scratch::gemm_adds_back).
  // A padded operand (Buf::ld) is taken as it is. Where every operand carrying K (or N) as its rows'
  // length is padded, the GEMM runs over the padding, zeros (cuda_scratch::gemm_extents). An extent
  // still off whole 16-byte packs (the gate/up weight's halves of 5461 rows) runs as a bulk and a rest
  // (cuda_scratch::gemm_parts).
  void matmul(Buf out, Buf a, Buf b, int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool acc) override {
    gemm(out, nullptr, a, b, M, N, K, ta, tb, acc);
  }
  // The residual as cuBLASLt's addend (C), read once, where the GEMM's output is not staged
  // (cuda_scratch::gemm_reads_residual); else the default's copy into out, then accumulate.
  void matmul_residual(Buf out, Buf residual, Buf a, Buf b, int64_t M, int64_t N, int64_t K, bool ta, bool tb) override {
    if (residual.dtype != out.dtype || residual.ld || out.ld) throw Error("matmul_residual: out and residual need one dtype and dense rows");
    gemm(out, &residual, a, b, M, N, K, ta, tb, true);
  }

  // ---- model ops ------------------------------------------------------------------------------------
  void embedding_forward(Buf out, const int32_t* tokens, Buf wte, int64_t BT, int64_t C) override {
    same_dtype({out, wte}, "embedding_forward");
    with_type(out.dtype, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      cuda::embedding_forward(as<T>(out), tokens, as<T>(wte), BT, C, q_->issue());
    });
  }
  void embedding_backward(Buf dwte, Buf dout, const int32_t* tokens, int64_t BT, int64_t C) override {
    // Positions bucketed by token on the device (a sort of (token, position) keys): no host crossing.
    auto* keys = static_cast<uint64_t*>(scratch(bucket_scratch_, cuda_scratch::embedding_backward_bytes(BT, C), "embedding_backward"));
    with_types(dout.dtype, dwte.dtype, "embedding_backward", [&](auto* t, auto* g) {
      using T = std::remove_pointer_t<decltype(t)>;
      using G = std::remove_pointer_t<decltype(g)>;
      cuda::embedding_backward(as<G>(dwte), as<T>(dout), tokens, BT, C, keys, q_->issue());
    });
  }
  void rmsnorm_forward(Buf out, float* rstd, Buf x, Buf w, int64_t N, int64_t C, float eps) override {
    same_dtype({out, x, w}, "rmsnorm_forward");
    with_type(out.dtype, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      cuda::rmsnorm_forward(as<T>(out), rstd, as<T>(x), as<T>(w), N, C, eps, q_->issue());
    });
  }
  void rmsnorm_backward(float* dx, Buf dx_copy, Buf dw, const float* dout, Buf x, Buf w, const float* rstd, int64_t N, int64_t C,
                        bool accumulate_dx) override {
    same_dtype({x, w}, "rmsnorm_backward");
    if (dx_copy.ptr) same_dtype({dx_copy, x}, "rmsnorm_backward");
    if (C > cuda::kSharedOptInFloats)
      throw Error("rmsnorm_backward: width " + std::to_string(C) + " exceeds the " + std::to_string(cuda::kSharedOptInFloats) +
                  " channels of one block's shared partial (an A100's 163 KB)");
    auto* partials = static_cast<float*>(scratch(rms_scratch_, rmsnorm_backward_scratch(N, C) * 4, "rmsnorm_backward"));
    with_types(w.dtype, dw.dtype, "rmsnorm_backward", [&](auto* t, auto* g) {
      using T = std::remove_pointer_t<decltype(t)>;
      using G = std::remove_pointer_t<decltype(g)>;
      cuda::rmsnorm_backward(dx, dx_copy.ptr ? as<T>(dx_copy) : nullptr, as<G>(dw), dout, as<T>(x), as<T>(w), rstd, N, C, accumulate_dx, partials,
                             q_->issue());
    });
  }
  void rope_forward(Buf qkv, const float* cs, int64_t B, int64_t T_, int64_t H, int64_t D) override {
    with_type(qkv.dtype, [&](auto* t) { cuda::rope(as<std::remove_pointer_t<decltype(t)>>(qkv), cs, B, T_, H, D, false, q_->issue()); });
  }
  void rope_backward(Buf dqkv, const float* cs, int64_t B, int64_t T_, int64_t H, int64_t D) override {
    with_type(dqkv.dtype, [&](auto* t) { cuda::rope(as<std::remove_pointer_t<decltype(t)>>(dqkv), cs, B, T_, H, D, true, q_->issue()); });
  }
  void attention_forward(Buf out, float* lse, Buf qkv, int64_t B, int64_t T_, int64_t H, int64_t D) override {
    same_dtype({out, qkv}, "attention_forward");
    with_type(out.dtype, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      cuda::attention_forward(as<T>(out), lse, as<T>(qkv), B, T_, H, D, q_->issue());
    });
  }
  void attention_backward(Buf dqkv, Buf dout, Buf qkv, Buf out, const float* lse, int64_t B, int64_t T_, int64_t H, int64_t D) override {
    same_dtype({dqkv, dout, qkv, out}, "attention_backward");
    auto* delta = static_cast<float*>(scratch(attn_scratch_, cuda_scratch::attention_backward_bytes(B, H, T_), "attention_backward"));
    with_type(dqkv.dtype, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      cuda::attention_backward(as<T>(dqkv), as<T>(dout), as<T>(qkv), as<T>(out), lse, B, T_, H, D, delta, q_->issue());
    });
  }
  void attention_decode(Buf out, Buf qkv, Buf k_cache, Buf v_cache, int64_t pos, int64_t H, int64_t D) override {
    same_dtype({out, qkv, k_cache, v_cache}, "attention_decode");
    with_type(out.dtype, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      cuda::attention_decode(as<T>(out), as<T>(qkv), as<T>(k_cache), as<T>(v_cache), pos, H, D, q_->issue());
    });
  }
  void swiglu_forward(Buf out, Buf gate_up, int64_t N, int64_t F) override {
    same_dtype({out, gate_up}, "swiglu_forward");
    with_type(out.dtype, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      const int64_t s = sizeof(T);
      cuda::swiglu_forward(as<T>(out), as<T>(gate_up), N, F,
                           {gate_up.stride(2 * F), out.stride(F), F, 2 * F, cuda_scratch::mlp_up_column(F, gate_up.ld, s), F}, q_->issue());
    });
  }
  void swiglu_backward(Buf dgate_up, Buf out, Buf dout, Buf gate_up, int64_t N, int64_t F) override {
    same_dtype({dgate_up, dout, gate_up}, "swiglu_backward");
    if (out.ptr) same_dtype({out, gate_up}, "swiglu_backward");
    with_type(dgate_up.dtype, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      const int64_t s = sizeof(T);
      cuda::swiglu_backward(as<T>(dgate_up), out.ptr ? as<T>(out) : nullptr, as<T>(dout), as<T>(gate_up), N, F,
                            {gate_up.stride(2 * F), out.stride(F), dout.stride(F), dgate_up.stride(2 * F), cuda_scratch::mlp_up_column(F, gate_up.ld, s),
                             cuda_scratch::mlp_up_column(F, dgate_up.ld, s)},
                            q_->issue());
    });
  }
  void cross_entropy(float* losses, Buf dlogits, const float* logits, const int32_t* targets, const uint8_t* mask, int64_t N, int64_t V,
                     float grad_scale) override {
    with_type(dlogits.dtype, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      cuda::cross_entropy(losses, as<T>(dlogits), logits, targets, mask, N, V, grad_scale, q_->issue());
    });
  }
  void accumulate_loss(LossTotals* totals, const float* losses, const uint8_t* mask, int64_t N) override {
    cuda::accumulate_loss(totals, losses, mask, N, q_->issue());
  }
  // BF16: the loss head fused (cross_entropy.cu): the FP32 logits a vocabulary chunk at a time into
  // the plan's small logits buffer (it stays in L2), each chunk's softmax statistics and exp(x - max)
  // into dlogits, then the loss and dlogits finished per row. FP32: the GEMM, then cross_entropy.
  ActivationLayout activation_layout(DType act) const override { return cuda_activation_layout(act); }
  void linear_cross_entropy(float* losses, Buf dlogits, Buf logits, Buf x, Buf w, const int32_t* targets, const uint8_t* mask, int64_t N,
                            int64_t V, int64_t C, float grad_scale) override {
    if (!cuda_fuses_loss_head(x.dtype, w.dtype, dlogits.ptr != nullptr, dlogits.dtype)) {
      // The unfused head needs all N rows of logits, which a plan made for BF16 activations (fused:
      // cuda_activation_layout) does not hold.
      if (cuda_activation_layout(x.dtype).loss_head)
        throw Error("linear_cross_entropy: BF16 activations with FP32 weights or dlogits: the fused loss head's plan holds no full logits");
      return Backend::linear_cross_entropy(losses, dlogits, logits, x, w, targets, mask, N, V, C, grad_scale);
    }
    if (N == 0) return;
    const auto [Vc, chunks] = fused_loss_head_chunks(N, V);
    const size_t stats_bytes = static_cast<size_t>(N * chunks) * sizeof(cuda::ChunkStats);
    auto* stats = static_cast<cuda::ChunkStats*>(scratch(head_scratch_, stats_bytes + N * sizeof(float), "linear_cross_entropy"));
    auto* target_logit = reinterpret_cast<float*>(reinterpret_cast<char*>(stats) + stats_bytes);
    cuda::bf16* d = dlogits.ptr ? as<cuda::bf16>(dlogits) : nullptr;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t v0 = c * Vc, n = std::min(Vc, V - v0);
      matmul(logits, x, Buf{as<cuda::bf16>(w) + v0 * C, DType::BF16}, N, n, C, false, true, false);  // tile [N, n] = x w[v0 .. v0+n)^T
      cuda::cross_entropy_chunk(stats, target_logit, d, logits.f32(), targets, mask, N, n, v0, V, c, chunks, q_->issue());
    }
    cuda::cross_entropy_finish(losses, d, stats, target_logit, targets, mask, N, V, Vc, chunks, grad_scale, q_->issue());
  }

  OptimizerKernels& optimizer_kernels() override { return *optimizer_; }

 private:
  void* scratch(std::unique_ptr<Scratch>& s, size_t bytes, const char* what) { return s->get(bytes, what); }

  int device_;
  std::unique_ptr<CudaQueue> q_;
  std::unique_ptr<LtGemm> gemm_;
  // out = op(a) op(b) (+ out when acc; + *residual instead, when given).
  void gemm(Buf out, const Buf* residual, Buf a, Buf b, int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool acc) {
    if (a.dtype != b.dtype) throw Error("matmul: operands must share a dtype");
    if (a.dtype == DType::F32 && out.dtype != DType::F32) throw Error("matmul: fp32 operands need an fp32 output");
    const int64_t si = dtype_bytes(a.dtype), so = dtype_bytes(out.dtype);
    if (M == 0 || N == 0) return;
    if (K == 0) {  // an empty sum: out = the residual, zeros, or as it was when accumulating; nothing staged or split
      if (residual) convert(out, *residual, M * N);
      else if (!acc) gemm_->run(out.ptr, out.stride(N), lt_type(out.dtype), a.ptr, 1, b.ptr, 1, lt_type(a.dtype), M, N, 0, ta, tb, false, q_->issue());
      return;
    }
    const cuda_scratch::GemmStaging st =
        cuda_scratch::gemm_staging(M, N, K, ta, tb, si, so, reinterpret_cast<uintptr_t>(a.ptr), reinterpret_cast<uintptr_t>(b.ptr),
                                   reinterpret_cast<uintptr_t>(out.ptr), a.ld, b.ld, out.ld);
    const bool staged = st.a.staged || st.b.staged || st.out.staged;
    const void* addend = nullptr;
    if (residual) {
      if (cuda_scratch::gemm_reads_residual(st, M, N, K, reinterpret_cast<uintptr_t>(residual->ptr))) addend = residual->ptr;
      else convert(out, *residual, M * N);
    }
    auto stage = [&](const cuda_scratch::GemmOperand& o, std::unique_ptr<Scratch>& s, const void* p, int64_t bytes, bool copy_in) -> void* {
      if (!staged || !o.staged) return const_cast<void*>(p);
      void* copy = scratch(s, static_cast<size_t>(o.staged_bytes(bytes)), "a GEMM operand's 128-byte rows");
      if (copy_in) cuda::copy_rows(copy, o.ld, p, o.stride, o.rows, o.cols, static_cast<int>(bytes), q_->issue());
      return copy;
    };
    const bool add_back = cuda_scratch::gemm_adds_back(st, acc, so);  // the staged output written afresh, added back after
    void* sa = stage(st.a, gemm_stage_[0], a.ptr, si, true);
    void* sb = stage(st.b, gemm_stage_[1], b.ptr, si, true);
    void* sout = stage(st.out, gemm_stage_[2], out.ptr, so, acc && !add_back);
    const cuda_scratch::GemmExtents e = cuda_scratch::gemm_extents(st, N, K, ta, tb, si, so);  // over zero padding
    const cuda_scratch::GemmParts parts = cuda_scratch::gemm_parts(M, e.N, e.K, si, so);          // extents off whole packs split
    for (int i = 0; i < parts.count; ++i) {
      const cuda_scratch::GemmPart& p = parts.part[i];
      const auto* pa = static_cast<const char*>(sa) + si * (ta ? p.k0 * st.a.ld + p.m0 : p.m0 * st.a.ld + p.k0);
      const auto* pb = static_cast<const char*>(sb) + si * (tb ? p.n0 * st.b.ld + p.k0 : p.k0 * st.b.ld + p.n0);
      const int64_t at_out = so * (p.m0 * st.out.ld + p.n0);
      const void* part_addend = addend && p.k0 == 0 ? static_cast<const char*>(addend) + at_out : nullptr;  // (dense, as out)
      gemm_->run(static_cast<char*>(sout) + at_out, st.out.ld, lt_type(out.dtype), pa, st.a.ld, pb, st.b.ld, lt_type(a.dtype), p.m, p.n, p.k, ta, tb,
                 (acc && !add_back) || p.k0 > 0, q_->issue(), part_addend);
    }
    if (add_back) cuda::add_rows(out.f32(), st.out.stride, static_cast<const float*>(sout), st.out.ld, M, N, q_->issue());
    else if (staged && st.out.staged) cuda::copy_rows(out.ptr, st.out.stride, sout, st.out.ld, M, N, static_cast<int>(so), q_->issue());
  }

  std::unique_ptr<Scratch> gemm_stage_[3];  // a GEMM's staged a, b and out (cuda_scratch::gemm_staging)
  std::unique_ptr<Scratch> rms_scratch_, attn_scratch_, bucket_scratch_, head_scratch_;
  std::unique_ptr<DescriptorCache> descriptors_;
  std::unique_ptr<CudaOptimizerKernels> optimizer_;
};

}  // namespace

Backend* create_backend(int device) { return new CudaBackend(device); }

}  // namespace multinorm::cuda
