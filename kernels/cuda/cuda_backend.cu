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
#include "cuda_queue.h"
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

// A device buffer that grows on first use of a larger size and is reused after (no allocation on the
// hot path once every shape has been seen). A move is told to the queue: a graph captured before it
// holds the old address and is not replayed (CudaQueue::replay).
class Scratch {
 public:
  explicit Scratch(CudaQueue& q) : q_(q) {}
  ~Scratch() { cudaFree(ptr_); }
  void* get(size_t bytes, const char* what) {
    if (bytes > bytes_) {
      MN_CUDA_CHECK(cudaFree(ptr_), what);
      ptr_ = nullptr;
      bytes_ = 0;
      const cudaError_t e = cudaMalloc(&ptr_, bytes);
      if (e != cudaSuccess) {
        cudaGetLastError();
        throw_cuda_error(std::string("cudaMalloc of ") + std::to_string(bytes) + " bytes of scratch for " + what, e);
      }
      bytes_ = bytes;
      q_.note_buffers_moved();
    }
    return ptr_;
  }
  size_t bytes() const { return bytes_; }

 private:
  CudaQueue& q_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// SWAN's exact-path staging: pinned host memory that kernels write and host functions read (UVA:
// one address for both), grown like Scratch, and the host functions' job descriptions by shape,
// which a captured graph holds (dropped with the memory they point into).
class SwanStaging {
 public:
  explicit SwanStaging(CudaQueue& q) : q_(q) {}
  ~SwanStaging() {
    jobs_.clear();
    cudaFreeHost(ptr_);
  }
  void reserve(size_t bytes) {
    if (bytes <= bytes_) return;
    jobs_.clear();
    MN_CUDA_CHECK(cudaFreeHost(ptr_), "swan's pinned staging");
    ptr_ = nullptr;
    bytes_ = 0;
    MN_CUDA_CHECK(cudaMallocHost(&ptr_, bytes), "pinned staging of " + std::to_string(bytes) + " bytes for swan's exact path");
    bytes_ = bytes;
    q_.note_buffers_moved();
  }
  cuda::SwanExactJob* job(int64_t m, int64_t n) {
    auto& j = jobs_[{m, n}];
    if (!j) j.reset(cuda::swan_exact_job(ptr_, m, n));
    return j.get();
  }

 private:
  CudaQueue& q_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  struct Free {
    void operator()(cuda::SwanExactJob* j) const { cuda::swan_exact_job_free(j); }
  };
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<cuda::SwanExactJob, Free>> jobs_;
};

// Device copies of the multi-tensor launches' descriptor tables, found by their bytes. An optimizer
// update passes the same tables every time (the same tensors, the same scratch), so each is uploaded
// once; a graph captured later finds its tables on the device (an upload from pageable memory cannot
// be captured), and nothing rewrites them while the graph may read them. When the buffer
// (cuda_scratch::kDescriptorCacheBytes) is full it starts over in place: the new uploads are
// stream-ordered after every launch that read the old tables, and the queue is told (a graph holding
// them is not replayed).
class DescriptorCache {
 public:
  explicit DescriptorCache(CudaQueue& q) : q_(q) {}
  ~DescriptorCache() { cudaFree(base_); }
  const void* get(const void* table, size_t bytes, const char* what) {
    const char* p = static_cast<const char*>(table);
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (size_t i = 0; i < bytes; ++i) h = (h ^ static_cast<uint8_t>(p[i])) * 1099511628211ull;
    const auto found = index_.equal_range(h);
    for (auto it = found.first; it != found.second; ++it)
      if (it->second.bytes == bytes && std::memcmp(shadow_.data() + it->second.offset, p, bytes) == 0) return base_ + it->second.offset;
    if (q_.capturing())
      throw Error(std::string(what) + ": its descriptor table is not on the device, and the stream is capturing a graph (an upload from pageable "
                                      "memory cannot be captured: the ops must run once eagerly before their capture)");
    constexpr size_t kCapacity = static_cast<size_t>(cuda_scratch::kDescriptorCacheBytes);
    if (bytes > kCapacity) throw Error(std::string(what) + ": a descriptor table of " + std::to_string(bytes) + " bytes exceeds the cache");
    if (!base_) {
      void* b = nullptr;
      const cudaError_t e = cudaMalloc(&b, kCapacity);
      if (e != cudaSuccess) {
        cudaGetLastError();
        throw_cuda_error(std::string("cudaMalloc of the descriptor cache for ") + what, e);
      }
      base_ = static_cast<char*>(b);
      shadow_.resize(kCapacity);
    }
    size_t offset = (used_ + 255) / 256 * 256;
    if (offset + bytes > kCapacity) {  // start over in place (see above)
      index_.clear();
      offset = 0;
      q_.note_buffers_moved();
    }
    q_.upload(base_ + offset, table, static_cast<int64_t>(bytes), std::string(what) + " (descriptors)");
    std::memcpy(shadow_.data() + offset, p, bytes);
    index_.emplace(h, Entry{offset, bytes});
    used_ = offset + bytes;
    return base_ + offset;
  }
  size_t bytes() const { return base_ ? static_cast<size_t>(cuda_scratch::kDescriptorCacheBytes) : 0; }

 private:
  struct Entry {
    size_t offset, bytes;
  };
  CudaQueue& q_;
  char* base_ = nullptr;
  std::vector<char> shadow_;  // the device bytes, to compare with
  std::unordered_multimap<uint64_t, Entry> index_;
  size_t used_ = 0;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    MN_CUDA_CHECK(cudaSetDevice(device), "selecting CUDA device " + std::to_string(device));
    q_ = std::make_unique<CudaQueue>();
    gemm_ = std::make_unique<LtGemm>();
    for (auto* s : {&rms_scratch_, &attn_scratch_, &bucket_scratch_, &reduce_scratch_, &opt_scratch_, &head_scratch_}) *s = std::make_unique<Scratch>(*q_);
    for (auto& s : gemm_stage_) s = std::make_unique<Scratch>(*q_);
    descriptors_ = std::make_unique<DescriptorCache>(*q_);
    swan_staging_ = std::make_unique<SwanStaging>(*q_);
  }
  ~CudaBackend() override {
    descriptors_.reset();
    swan_staging_.reset();
    for (auto* s : {&rms_scratch_, &attn_scratch_, &bucket_scratch_, &reduce_scratch_, &opt_scratch_, &head_scratch_}) s->reset();
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
    return static_cast<int64_t>(gemm_->workspace_bytes() + rms_scratch_->bytes() + attn_scratch_->bytes() + reduce_scratch_->bytes() +
                                bucket_scratch_->bytes() + opt_scratch_->bytes() + head_scratch_->bytes() + descriptors_->bytes() +
                                gemm_stage_[0]->bytes() + gemm_stage_[1]->bytes() + gemm_stage_[2]->bytes());
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
  // (cuda_scratch::gemm_staging): a and b copied in, out copied in when accumulating and back after.
  // A padded operand (Buf::ld) is taken as it is. Where every operand carrying K (or N) as its rows'
  // length is padded, the GEMM runs over the padding, zeros (cuda_scratch::gemm_extents).
  void matmul(Buf out, Buf a, Buf b, int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool acc) override {
    if (a.dtype != b.dtype) throw Error("matmul: operands must share a dtype");
    if (a.dtype == DType::F32 && out.dtype != DType::F32) throw Error("matmul: fp32 operands need an fp32 output");
    const int64_t si = dtype_bytes(a.dtype), so = dtype_bytes(out.dtype);
    const cuda_scratch::GemmStaging st =
        cuda_scratch::gemm_staging(M, N, K, ta, tb, si, so, reinterpret_cast<uintptr_t>(a.ptr), reinterpret_cast<uintptr_t>(b.ptr),
                                   reinterpret_cast<uintptr_t>(out.ptr), a.ld, b.ld, out.ld);
    const bool staged = M > 0 && N > 0 && K > 0 && (st.a.staged || st.b.staged || st.out.staged);
    auto stage = [&](const cuda_scratch::GemmOperand& o, std::unique_ptr<Scratch>& s, const void* p, int64_t bytes, bool copy_in) -> void* {
      if (!staged || !o.staged) return const_cast<void*>(p);
      void* copy = scratch(s, static_cast<size_t>(o.staged_bytes(bytes)), "a GEMM operand's 128-byte rows");
      if (copy_in) cuda::copy_rows(copy, o.ld, p, o.stride, o.rows, o.cols, static_cast<int>(bytes), q_->issue());
      return copy;
    };
    void* sa = stage(st.a, gemm_stage_[0], a.ptr, si, true);
    void* sb = stage(st.b, gemm_stage_[1], b.ptr, si, true);
    void* sout = stage(st.out, gemm_stage_[2], out.ptr, so, acc);
    const cuda_scratch::GemmExtents e = cuda_scratch::gemm_extents(st, N, K, ta, tb, si, so);  // over zero padding
    gemm_->run(sout, st.out.ld, lt_type(out.dtype), sa, st.a.ld, sb, st.b.ld, lt_type(a.dtype), M, e.N, e.K, ta, tb, acc, q_->issue());
    if (staged && st.out.staged) cuda::copy_rows(out.ptr, st.out.stride, sout, st.out.ld, M, N, static_cast<int>(so), q_->issue());
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
  void rmsnorm_backward(float* dx, Buf dw, const float* dout, Buf x, Buf w, const float* rstd, int64_t N, int64_t C, bool accumulate_dx) override {
    same_dtype({x, w}, "rmsnorm_backward");
    if (C > cuda::kSharedOptInFloats)
      throw Error("rmsnorm_backward: width " + std::to_string(C) + " exceeds the " + std::to_string(cuda::kSharedOptInFloats) +
                  " channels of one block's shared partial (an A100's 163 KB)");
    auto* partials = static_cast<float*>(scratch(rms_scratch_, rmsnorm_backward_scratch(N, C) * 4, "rmsnorm_backward"));
    with_types(w.dtype, dw.dtype, "rmsnorm_backward", [&](auto* t, auto* g) {
      using T = std::remove_pointer_t<decltype(t)>;
      using G = std::remove_pointer_t<decltype(g)>;
      cuda::rmsnorm_backward(dx, as<G>(dw), dout, as<T>(x), as<T>(w), rstd, N, C, accumulate_dx, partials, q_->issue());
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
      cuda::swiglu_forward(as<T>(out), as<T>(gate_up), N, F, {gate_up.stride(2 * F), out.stride(F), F, 2 * F}, q_->issue());
    });
  }
  void swiglu_backward(Buf dgate_up, Buf out, Buf dout, Buf gate_up, int64_t N, int64_t F) override {
    same_dtype({dgate_up, dout, gate_up}, "swiglu_backward");
    if (out.ptr) same_dtype({out, gate_up}, "swiglu_backward");
    with_type(dgate_up.dtype, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      cuda::swiglu_backward(as<T>(dgate_up), out.ptr ? as<T>(out) : nullptr, as<T>(dout), as<T>(gate_up), N, F,
                            {gate_up.stride(2 * F), out.stride(F), dout.stride(F), dgate_up.stride(2 * F)}, q_->issue());
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

  // ---- optimizer ops ------------------------------------------------------------------------------
  double sum_squares(Buf x, int64_t n) override {
    auto* d = static_cast<double*>(scratch(reduce_scratch_, cuda_scratch::sum_squares_bytes(), "sum_squares"));
    with_type(x.dtype, [&](auto* t) { cuda::sum_squares(d, d + 1, as<std::remove_pointer_t<decltype(t)>>(x), n, q_->issue()); });
    double r = 0;
    to_host(&r, d, sizeof(double));
    return r;
  }
  // The per-tensor sums into `out`, their partials (kSumSquaresBlocks x count) in the reduce scratch:
  // two launches for each run of tensors of one dtype.
  void sum_squares_many(const Buf* xs, const int64_t* ns, int64_t count, double* out) override {
    if (count == 0) return;
    auto* partials = static_cast<double*>(scratch(reduce_scratch_, cuda_scratch::sum_squares_many_bytes(count), "sum_squares_many"));
    for (int64_t begin = 0; begin < count;) {
      int64_t end = begin + 1;
      while (end < count && xs[end].dtype == xs[begin].dtype) ++end;
      sum_items_.clear();
      for (int64_t i = begin; i < end; ++i) sum_items_.push_back({xs[i].ptr, ns[i]});
      const auto* items = static_cast<const SumSquaresItem*>(descriptors(sum_items_.data(), sum_items_.size() * sizeof(SumSquaresItem), "sum_squares_many"));
      with_type(xs[begin].dtype, [&](auto* t) {
        cuda::sum_squares_many<std::remove_pointer_t<decltype(t)>>(out + begin, partials, items, end - begin, q_->issue());
      });
      begin = end;
    }
  }
  void update_statistics(UpdateScalars* s, const LossTotals* loss, const double* squares, int64_t count, double grad_clip) override {
    cuda::update_statistics(s, loss, squares, count, grad_clip, q_->issue());
  }
  void clip_gradients(Buf x, int64_t n, const UpdateScalars* s) override {
    with_type(x.dtype, [&](auto* t) { cuda::clip_gradients(as<std::remove_pointer_t<decltype(t)>>(x), n, s, q_->issue()); });
  }
  void scale(Buf x, int64_t n, float factor) override {
    with_type(x.dtype, [&](auto* t) { cuda::scale(as<std::remove_pointer_t<decltype(t)>>(x), n, factor, q_->issue()); });
  }
  void sinkgd_update(Buf w, Buf g, int64_t m, int64_t n, const SinkGDArgs& a) override {
    const SinkGDTensor t{w, g, m, n, a.write.tensor};
    sinkgd_update_many(&t, 1, a);
  }
  // The tensors in launches of cuda_scratch::sinkgd_many_launch_end's making (one launch per pass for
  // all of a launch's tensors), each tensor with its own scratch; one dtype pair per launch.
  void sinkgd_update_many(const SinkGDTensor* tensors, int64_t count, const SinkGDArgs& a) override {
    const RuleScalars rule = optim_math::rule_scalars(a.lr, a.decoupled_decay);
    auto shape = [&](int64_t i) { return std::pair<int64_t, int64_t>{tensors[i].m, tensors[i].n}; };
    // The launches first, and the scratch grown once to the largest: a table built with the scratch's
    // address stays valid for the whole call (and the next update finds it in the descriptor cache).
    std::vector<std::pair<int64_t, int64_t>> launches;  // (end, floats) of each launch
    int64_t most = 0;
    for (int64_t begin = 0; begin < count;) {
      int64_t floats = 0;
      int64_t end = cuda_scratch::sinkgd_many_launch_end(begin, count, shape, &floats);
      for (int64_t i = begin + 1; i < end; ++i)  // a launch holds one dtype pair
        if (tensors[i].w.dtype != tensors[begin].w.dtype || tensors[i].g.dtype != tensors[begin].g.dtype) end = i, floats = -1;
      if (floats < 0) {  // cut short by a dtype: its own tensors' scratch
        floats = 0;
        for (int64_t i = begin; i < end; ++i) floats += sinkgd_scratch(tensors[i].m, tensors[i].n);
      }
      launches.emplace_back(end, floats);
      most = std::max(most, floats);
      begin = end;
    }
    float* const base = static_cast<float*>(scratch(opt_scratch_, static_cast<size_t>(most) * 4, "sinkgd_update_many"));
    for (int64_t begin = 0, l = 0; begin < count; ++l) {
      const int64_t end = launches[static_cast<size_t>(l)].first;
      float* uv = base;
      sinkgd_items_.clear();
      for (int64_t i = begin; i < end; ++i) {
        const SinkGDTensor& t = tensors[i];
        sinkgd_items_.push_back(cuda::sinkgd_item(t.w.ptr, t.g.ptr, t.m, t.n, uv, t.tensor));
        uv += sinkgd_scratch(t.m, t.n);
      }
      const cuda::SinkgdLayout layout = cuda::sinkgd_layout(sinkgd_items_.data(), end - begin);
      const auto* dev = static_cast<const cuda::SinkgdManyItem*>(
          descriptors(sinkgd_items_.data(), sinkgd_items_.size() * sizeof(cuda::SinkgdManyItem), "sinkgd_update_many"));
      with_types(tensors[begin].w.dtype, tensors[begin].g.dtype, "sinkgd_update_many", [&](auto* t, auto* gt) {
        using T = std::remove_pointer_t<decltype(t)>;
        using G = std::remove_pointer_t<decltype(gt)>;
        cuda::sinkgd_many<T, G>(dev, end - begin, layout, a.iterations, a.eps, rule, a.write, a.scalars, q_->issue());
      });
      begin = end;
    }
  }
  // The tensors in chunks of cuda_scratch::swan_plan's making (one Gram size and dtype pair each),
  // the scratch grown once to the largest chunk and the pinned staging to the largest tensor.
  void swan_update_many(const SwanTensor* tensors, int64_t count, const SwanArgs& a) override {
    std::vector<cuda_scratch::SwanShape> shapes;
    for (int64_t i = 0; i < count; ++i)
      shapes.push_back({tensors[i].m, tensors[i].n, static_cast<int>(tensors[i].w.dtype) * 16 + static_cast<int>(tensors[i].g.dtype)});
    const cuda_scratch::SwanPlan plan = cuda_scratch::swan_plan(shapes);
    void* work = scratch(opt_scratch_, static_cast<size_t>(plan.scratch_bytes), "swan_update");
    swan_staging_->reserve(static_cast<size_t>(plan.pinned_bytes));
    const cuda::SwanParams p{a.lr, a.decoupled_decay, a.eps, a.ns_tolerance, a.ns_steps, a.standardize, a.exact, a.write, a.scalars, a.stats};
    std::vector<cuda::SwanItem> items;
    std::vector<cuda::SwanExactJob*> jobs;
    for (size_t c = 0, begin = 0; c < plan.ends.size(); begin = static_cast<size_t>(plan.ends[c++])) {
      items.clear(), jobs.clear();
      for (size_t j = begin; j < static_cast<size_t>(plan.ends[c]); ++j) {
        const SwanTensor& t = tensors[plan.order[j]];
        items.push_back({t.w.ptr, t.g.ptr, t.m, t.n, t.tensor});
        jobs.push_back(swan_staging_->job(t.m, t.n));
      }
      const SwanTensor& first = tensors[plan.order[begin]];
      with_types(first.w.dtype, first.g.dtype, "swan_update", [&](auto* t, auto* gt) {
        using T = std::remove_pointer_t<decltype(t)>;
        using G = std::remove_pointer_t<decltype(gt)>;
        cuda::swan_chunk<T, G>(items.data(), static_cast<int64_t>(items.size()), p, *gemm_, work, jobs.data(), q_->issue());
      });
    }
  }
  void adam_update(Buf w, Buf g, Buf m, Buf v, int64_t n, const AdamArgs& a) override {
    same_dtype({m, v}, "adam_update states");
    const RuleScalars r = optim_math::rule_scalars(a);
    with_types(w.dtype, g.dtype, "adam_update", [&](auto* t, auto* gt) {
      using T = std::remove_pointer_t<decltype(t)>;
      using G = std::remove_pointer_t<decltype(gt)>;
      with_type(m.dtype, [&](auto* st) {
        using S = std::remove_pointer_t<decltype(st)>;
        cuda::adam(as<T>(w), as<G>(g), as<S>(m), as<S>(v), n, r, a.write, a.scalars, q_->issue());
      });
    });
  }
  void adam_update_many(const AdamTensor* tensors, int64_t count, const AdamArgs& a) override {
    if (count == 0) return;
    const AdamTensor& first = tensors[0];
    for (int64_t i = 1; i < count; ++i)  // one launch needs one dtype combination
      if (tensors[i].w.dtype != first.w.dtype || tensors[i].g.dtype != first.g.dtype || tensors[i].m.dtype != first.m.dtype) {
        for (int64_t k = 0; k < count; ++k) {
          AdamArgs ak = a;
          ak.write.tensor = tensors[k].tensor;
          adam_update(tensors[k].w, tensors[k].g, tensors[k].m, tensors[k].v, tensors[k].n, ak);
        }
        return;
      }
    const RuleScalars r = optim_math::rule_scalars(a);
    for (int64_t begin = 0; begin < count; begin += cuda_scratch::kAdamManyPerLaunch) {
      const int64_t end = std::min(count, begin + cuda_scratch::kAdamManyPerLaunch);
      many_items_.clear();
      int64_t blocks = 0;
      for (int64_t i = begin; i < end; ++i) {
        const AdamTensor& t = tensors[i];
        many_items_.push_back({t.w.ptr, t.g.ptr, t.m.ptr, t.v.ptr, t.n, t.tensor, blocks});
        blocks += (t.n + kAdamManyElementsPerBlock - 1) / kAdamManyElementsPerBlock;
      }
      const auto* dev = static_cast<const AdamManyItem*>(descriptors(many_items_.data(), many_items_.size() * sizeof(AdamManyItem), "adam_update_many"));
      with_types(first.w.dtype, first.g.dtype, "adam_update_many", [&](auto* t, auto* gt) {
        using T = std::remove_pointer_t<decltype(t)>;
        using G = std::remove_pointer_t<decltype(gt)>;
        with_type(first.m.dtype, [&](auto* st) {
          using S = std::remove_pointer_t<decltype(st)>;
          cuda::adam_many<T, G, S>(dev, static_cast<int64_t>(many_items_.size()), blocks, r, a.write, a.scalars, q_->issue());
        });
      });
    }
  }
  void sgd_update(Buf w, Buf g, Buf buf, int64_t n, const SgdArgs& a) override {
    with_types(w.dtype, g.dtype, "sgd_update", [&](auto* t, auto* gt) {
      using T = std::remove_pointer_t<decltype(t)>;
      using G = std::remove_pointer_t<decltype(gt)>;
      with_type(buf.dtype, [&](auto* st) {
        using S = std::remove_pointer_t<decltype(st)>;
        cuda::sgd(as<T>(w), as<G>(g), as<S>(buf), n, optim_math::rule_scalars(a.lr, a.decoupled_decay), a.momentum, a.write, a.scalars, q_->issue());
      });
    });
  }

 private:
  void* scratch(std::unique_ptr<Scratch>& s, size_t bytes, const char* what) { return s->get(bytes, what); }
  // A multi-tensor launch's descriptor table on the device (uploaded once: DescriptorCache).
  const void* descriptors(const void* table, size_t bytes, const char* what) { return descriptors_->get(table, bytes, what); }

  int device_;
  std::unique_ptr<CudaQueue> q_;
  std::unique_ptr<LtGemm> gemm_;
  std::unique_ptr<Scratch> gemm_stage_[3];  // a GEMM's staged a, b and out (cuda_scratch::gemm_staging)
  std::unique_ptr<Scratch> rms_scratch_, attn_scratch_, bucket_scratch_, reduce_scratch_, opt_scratch_, head_scratch_;
  std::unique_ptr<DescriptorCache> descriptors_;
  std::vector<AdamManyItem> many_items_;
  std::vector<cuda::SinkgdManyItem> sinkgd_items_;
  std::vector<SumSquaresItem> sum_items_;
  std::unique_ptr<SwanStaging> swan_staging_;
};

}  // namespace

Backend* create_backend(int device) { return new CudaBackend(device); }

}  // namespace multinorm::cuda
