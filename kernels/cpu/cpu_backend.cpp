// The CPU backend: host memory, oneDNN GEMMs, OpenMP kernels (kernels/cpu/). Each op dispatches on
// the storage dtype to the templated kernel.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "../common/dtype_dispatch.h"
#include "../common/optim_math.h"
#include "cpu_kernels.h"
#include "cpu_optimizer_kernels.h"
#include "matmul_packed.h"
#include "matmul_onednn.h"
#include "multinorm/backend.h"
#include "multinorm/error.h"

namespace multinorm {

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

bool all_bf16(std::initializer_list<Buf> bufs) {
  for (const Buf& b : bufs)
    if (b.dtype != DType::BF16) return false;
  return true;
}

// BF16 attention runs its block products on the AMX tiles or AVX512_BF16 where the CPU has them.
template <class T>
cpu::AttentionEngine attention_engine_for() {
  return cpu::attention_engine(std::is_same_v<T, bf16>);
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) {
    threads_ = threads > 0 ? threads : omp_get_num_procs();
    omp_set_num_threads(threads_);
  }
  std::string name() const override { return "cpu"; }
  int threads() const override { return threads_; }
  bool host_memory() const override { return true; }
  WorkQueue& queue() override { return queue_; }
  int64_t workspace_bytes() const override { return ws_.bytes() + gemm_.scratch_bytes(); }  // + the packed GEMM's operands
  ActivationLayout activation_layout(DType act) const override { return cpu_activation_layout(act); }

  void* allocate(int64_t bytes) override {
    const size_t size = (static_cast<size_t>(bytes) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, size ? size : 64);
    if (!p) throw Error("cpu backend: out of memory allocating " + std::to_string(bytes) + " bytes");
    std::memset(p, 0, size);
    return p;
  }
  void release(void* ptr) override { std::free(ptr); }
  void to_device(void* dst, const void* src, int64_t bytes) override { std::memcpy(dst, src, bytes); }
  void to_host(void* dst, const void* src, int64_t bytes) override { std::memcpy(dst, src, bytes); }
  void zero(Buf x, int64_t n) override { std::memset(x.ptr, 0, n * dtype_bytes(x.dtype)); }
  void convert(Buf dst, Buf src, int64_t n) override {
    with_type(dst.dtype, [&](auto* d) {
      with_type(src.dtype, [&](auto* s) { cpu::convert(as<std::remove_pointer_t<decltype(d)>>(dst), as<std::remove_pointer_t<decltype(s)>>(src), n); });
    });
  }

  void matmul(Buf out, Buf a, Buf b, int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool acc) override {
    dense({out, a, b}, "matmul");
    gemm_.run(out, a, b, M, N, K, ta, tb, acc);
  }

  void embedding_forward(Buf out, const int32_t* tokens, Buf wte, int64_t BT, int64_t C) override {
    same_dtype({out, wte}, "embedding_forward");
    with_type(out.dtype, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      cpu::embedding_forward(as<T>(out), tokens, as<T>(wte), BT, C);
    });
  }
  void embedding_backward(Buf dwte, Buf dout, const int32_t* tokens, int64_t BT, int64_t C) override {
    with_types(dout.dtype, dwte.dtype, "embedding_backward", [&](auto* t, auto* g) {
      using T = std::remove_pointer_t<decltype(t)>;
      using G = std::remove_pointer_t<decltype(g)>;
      cpu::embedding_backward(as<G>(dwte), as<T>(dout), tokens, BT, C, ws_);
    });
  }
  void rmsnorm_forward(Buf out, float* rstd, Buf x, Buf w, int64_t N, int64_t C, float eps) override {
    same_dtype({out, x, w}, "rmsnorm_forward");
    with_type(out.dtype, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      cpu::rmsnorm_forward(as<T>(out), rstd, as<T>(x), as<T>(w), N, C, eps);
    });
  }
  void rmsnorm_backward(float* dx, Buf dx_copy, Buf dw, const float* dout, Buf x, Buf w, const float* rstd, int64_t N, int64_t C,
                        bool accumulate_dx) override {
    same_dtype({x, w}, "rmsnorm_backward");
    if (dx_copy.ptr) same_dtype({dx_copy, x}, "rmsnorm_backward");
    with_types(w.dtype, dw.dtype, "rmsnorm_backward", [&](auto* t, auto* g) {
      using T = std::remove_pointer_t<decltype(t)>;
      using G = std::remove_pointer_t<decltype(g)>;
      cpu::rmsnorm_backward(dx, as<G>(dw), dout, as<T>(x), as<T>(w), rstd, N, C, accumulate_dx, ws_);
    });
    if (dx_copy.ptr) convert(dx_copy, Buf{dx, DType::F32}, N * C);  // a pass of its own here (the same bits as a fused store)
  }
  void rope_forward(Buf qkv, const float* cs, int64_t B, int64_t T_, int64_t H, int64_t D) override {
    with_type(qkv.dtype, [&](auto* t) { cpu::rope_forward(as<std::remove_pointer_t<decltype(t)>>(qkv), cs, B, T_, H, D, false); });
  }
  void rope_backward(Buf dqkv, const float* cs, int64_t B, int64_t T_, int64_t H, int64_t D) override {
    with_type(dqkv.dtype, [&](auto* t) { cpu::rope_forward(as<std::remove_pointer_t<decltype(t)>>(dqkv), cs, B, T_, H, D, true); });
  }
  void attention_forward(Buf out, float* lse, Buf qkv, int64_t B, int64_t T_, int64_t H, int64_t D) override {
    same_dtype({out, qkv}, "attention_forward");
    with_type(out.dtype, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      cpu::attention_forward(as<T>(out), lse, as<T>(qkv), B, T_, H, D, attention_engine_for<T>(), ws_);
    });
  }
  void attention_backward(Buf dqkv, Buf dout, Buf qkv, Buf out, const float* lse, int64_t B, int64_t T_, int64_t H,
                          int64_t D) override {
    same_dtype({dqkv, dout, qkv, out}, "attention_backward");
    with_type(dqkv.dtype, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      cpu::attention_backward(as<T>(dqkv), as<T>(dout), as<T>(qkv), as<T>(out), lse, B, T_, H, D, attention_engine_for<T>(), ws_);
    });
  }
  void attention_decode(Buf out, Buf qkv, Buf k_cache, Buf v_cache, int64_t pos, int64_t H, int64_t D) override {
    same_dtype({out, qkv, k_cache, v_cache}, "attention_decode");
    with_type(out.dtype, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      cpu::attention_decode(as<T>(out), as<T>(qkv), as<T>(k_cache), as<T>(v_cache), pos, H, D, ws_);
    });
  }
  void swiglu_forward(Buf out, Buf gate_up, int64_t N, int64_t F) override {
    dense({out, gate_up}, "swiglu_forward");
    same_dtype({out, gate_up}, "swiglu_forward");
    with_type(out.dtype, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      cpu::swiglu_forward(as<T>(out), as<T>(gate_up), N, F);
    });
  }
  void swiglu_backward(Buf dgate_up, Buf out, Buf dout, Buf gate_up, int64_t N, int64_t F) override {
    dense({dgate_up, out, dout, gate_up}, "swiglu_backward");
    same_dtype({dgate_up, dout, gate_up}, "swiglu_backward");
    if (out.ptr) same_dtype({out, gate_up}, "swiglu_backward");
    with_type(dgate_up.dtype, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      cpu::swiglu_backward(as<T>(dgate_up), out.ptr ? as<T>(out) : nullptr, as<T>(dout), as<T>(gate_up), N, F);
    });
  }
  void cross_entropy(float* losses, Buf dlogits, const float* logits, const int32_t* targets, const uint8_t* mask,
                     int64_t N, int64_t V, float grad_scale) override {
    with_type(dlogits.dtype, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      cpu::cross_entropy(losses, as<T>(dlogits), logits, targets, mask, N, V, grad_scale, ws_);
    });
  }
  void accumulate_loss(LossTotals* totals, const float* losses, const uint8_t* mask, int64_t N) override {
    cpu::accumulate_loss(totals, losses, mask, N);
  }
  void matmul_swiglu(Buf out, Buf gate_up, Buf x, Buf w, int64_t N, int64_t F, int64_t C) override {
    dense({out, gate_up, x, w}, "matmul_swiglu");
    if (cpu::fuses_gemm_epilogues(all_bf16({out, gate_up, x, w}))) {
      cpu::matmul_swiglu_packed(as<bf16>(out), as<bf16>(gate_up), as<bf16>(x), as<bf16>(w), N, F, C, gemm_.packed_scratch(),
                                ws_);
      return;
    }
    Backend::matmul_swiglu(out, gate_up, x, w, N, F, C);
  }
  void matmul_swiglu_backward(Buf dgate_up, Buf out, Buf ds, Buf dy, Buf w_down, Buf gate_up, int64_t N, int64_t F,
                              int64_t C) override {
    dense({dgate_up, out, ds, dy, w_down, gate_up}, "matmul_swiglu_backward");
    if (cpu::fuses_gemm_epilogues(all_bf16({dgate_up, ds, dy, w_down, gate_up}) && (!out.ptr || out.dtype == DType::BF16))) {
      cpu::matmul_swiglu_backward_packed(as<bf16>(dgate_up), out.ptr ? as<bf16>(out) : nullptr, as<bf16>(dy),
                                         as<bf16>(w_down), as<bf16>(gate_up), N, F, C, gemm_.packed_scratch(), ws_);
      return;
    }
    // The plan omits ds where the fused path runs (activation_layout); here it must exist.
    if (!ds.ptr) throw Error("cpu backend: matmul_swiglu_backward's unfused path needs the ds scratch, which the caller did not plan");
    Backend::matmul_swiglu_backward(dgate_up, out, ds, dy, w_down, gate_up, N, F, C);
  }
  void linear_cross_entropy(float* losses, Buf dlogits, Buf logits, Buf x, Buf w, const int32_t* targets,
                            const uint8_t* mask, int64_t N, int64_t V, int64_t C, float grad_scale) override {
    if (cpu::fuses_gemm_epilogues(all_bf16({x, w, dlogits}))) {
      cpu::linear_cross_entropy_packed(losses, as<bf16>(dlogits), as<bf16>(x), as<bf16>(w), targets, mask, N, V, C,
                                       grad_scale, gemm_.packed_scratch(), ws_);
      return;
    }
    Backend::linear_cross_entropy(losses, dlogits, logits, x, w, targets, mask, N, V, C, grad_scale);
  }

  OptimizerKernels& optimizer_kernels() override { return optimizer_; }

 private:
  // The CPU's plan never pads rows (cpu_activation_layout): a padded buffer here is a caller's bug.
  static void dense(std::initializer_list<Buf> bufs, const char* op) {
    for (const Buf& b : bufs)
      if (b.ld) throw Error(std::string(op) + ": a buffer with padded rows (Buf::ld " + std::to_string(b.ld) + "): the CPU backend takes dense rows");
  }

  SynchronousQueue queue_;
  int threads_;
  cpu::OneDnnMatmul gemm_;
  cpu::Workspace ws_;
  cpu::CpuOptimizerKernels optimizer_{gemm_, ws_};
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

// The packed BF16 GEMM's epilogues (matmul_swiglu_backward, linear_cross_entropy below) run whenever
// the activations are BF16 and the GEMM is usable.
ActivationLayout cpu_activation_layout(DType act) {
  const bool fused = cpu::fuses_gemm_epilogues(act == DType::BF16);
  return {fused, fused};
}

std::string cpu_bf16_gemm_engine() {
  if (!cpu::packed_bf16_gemm_usable()) return "oneDNN";
  return cpu::amx_usable() ? "AMX tiles" : "AVX512_BF16 VDPBF16PS";
}

}  // namespace multinorm
