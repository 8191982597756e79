// The cost recorder (include/multinorm/kernel_costs.h): every Backend op records the kernels the CUDA
// backend launches for it, with the same names and launch counts (kernels/cuda/*.cu; the launch plans
// it shares with them are in include/multinorm/cuda_scratch.h), and what each moves and computes.
//
// Bytes count each element read or written once from device memory (what a kernel that streams its
// operands costs; L2 hits make a real kernel cheaper, re-reads dearer). s = storage bytes of an
// element (2 BF16, 4 FP32). Shapes as in backend.h: BT rows of width C, H heads of D, F the MLP width.
#include "multinorm/kernel_costs.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "../../kernels/common/elementwise_rules.h"
#include "multinorm/cuda_scratch.h"
#include "multinorm/error.h"
#include "multinorm/llama_model.h"
#include "multinorm/optimizer.h"

namespace multinorm {

const char* cost_unit_name(CostUnit u) {
  switch (u) {
    case CostUnit::GemmTensorCore: return "tensor cores (cuBLASLt)";
    case CostUnit::KernelTensorCore: return "tensor cores (mma.sync)";
    case CostUnit::GemmFp32: return "FP32 (cuBLASLt)";
    case CostUnit::GemmTf32: return "TF32 tensor cores (cuBLASLt)";
    case CostUnit::KernelFp32: return "FP32 FMA";
    case CostUnit::Memory: return "memory";
  }
  return "?";
}

namespace {

double s_of(const Buf& b) { return static_cast<double>(dtype_bytes(b.dtype)); }
// A SwiGLU array as the backend's launchers see it (cuda_scratch::swiglu_packed): rows of `cols`
// unless padded (Buf::ld), read in packs from `column`; a gate/up array's up half's column.
cuda_scratch::SwigluArray array(const Buf& b, int64_t cols, int64_t column) {
  return {reinterpret_cast<uintptr_t>(b.ptr), b.stride(cols), column};
}
int64_t up(const Buf& gate_up, int64_t F) { return cuda_scratch::mlp_up_column(F, gate_up.ld, dtype_bytes(gate_up.dtype)); }

// The recorder's addresses are never dereferenced: its late copies copy nothing.
class RecordingQueue final : public WorkQueue {
 public:
  int64_t fence() override { return 0; }
  void wait(int64_t) override {}
  void wait_all() override {}
  void copy_to_host_later(void*, const void*, int64_t) override {}
};

class CostRecorder final : public Backend, public OptimizerKernels {
 public:
  explicit CostRecorder(bool cuda_layout) : cuda_layout_(cuda_layout) {}
  // The CUDA backend's layout (padded MLP rows), or the CPU backend's for a CPU run's plans.
  ActivationLayout activation_layout(DType act) const override { return cuda_layout_ ? cuda_activation_layout(act) : cpu_activation_layout(act); }
  std::vector<KernelCost> take() {
    std::vector<KernelCost> out;
    out.swap(costs_);
    index_.clear();
    return out;
  }

  std::string name() const override { return "cost-recorder"; }
  int threads() const override { return 1; }
  bool host_memory() const override { return false; }
  WorkQueue& queue() override { return queue_; }
  OptimizerKernels& optimizer_kernels() override { return *this; }  // one ledger for both lists
  int64_t workspace_bytes() const override { return 0; }

  // Addresses only: 256-byte aligned (the attention dispatch's 16-byte test passes, as on a GPU),
  // from a range no host allocation uses. Never dereferenced.
  void* allocate(int64_t bytes) override {
    void* p = reinterpret_cast<void*>(next_);
    next_ += (static_cast<uintptr_t>(std::max<int64_t>(bytes, 1)) + 255) / 256 * 256;
    return p;
  }
  void release(void*) override {}
  void to_device(void*, const void*, int64_t) override {}
  void to_host(void*, const void*, int64_t) override {}
  void zero(Buf x, int64_t n) override { add("memset", CostUnit::Memory, 1, n * s_of(x), 0); }
  void convert(Buf dst, Buf src, int64_t n) override {
    if (n > 0) add("convert", CostUnit::Memory, 1, n * (s_of(dst) + s_of(src)), 0);
  }

  // An operand with rows or a base off 16 bytes is staged through 128-byte rows first (and an output
  // back after): a copy_rows launch each, reading and writing the operand once
  // (cuda_scratch::gemm_staging; the GEMM itself then runs at the aligned rate).
  void matmul(Buf out, Buf a, Buf b, int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool accumulate) override {
    if (M == 0 || N == 0) return;
    if (K == 0) {
      if (!accumulate) zero(out, M * N);
      return;
    }
    const auto st = staging(out, a, b, M, N, K, ta, tb);
    const bool add_back = cuda_scratch::gemm_adds_back(st, accumulate, dtype_bytes(out.dtype));
    record_staging(st, s_of(a), s_of(out), accumulate && !add_back, true);
    const bool bf16 = a.dtype == DType::BF16;
    // over the zero padding where the backend widens N or K (cuda_scratch::gemm_extents)
    const cuda_scratch::GemmExtents e = cuda_scratch::gemm_extents(st, N, K, ta, tb, dtype_bytes(a.dtype), dtype_bytes(out.dtype));
    // an extent off whole 16-byte packs: a launch for its bulk and one for the rest (cuda_scratch::gemm_parts)
    const cuda_scratch::GemmParts parts = cuda_scratch::gemm_parts(M, e.N, e.K, dtype_bytes(a.dtype), dtype_bytes(out.dtype));
    for (int i = 0; i < parts.count; ++i) {
      const cuda_scratch::GemmPart& p = parts.part[i];
      const double bytes = double(p.m * p.k + p.k * p.n) * s_of(a) + double(p.m * p.n) * s_of(out) * ((accumulate && !add_back) || p.k0 > 0 ? 2 : 1);
      add(bf16 ? "gemm bf16 (cuBLASLt)" : "gemm fp32 (cuBLASLt)", bf16 ? CostUnit::GemmTensorCore : CostUnit::GemmFp32, 1, bytes,
          2.0 * p.m * p.n * p.k);
    }
    if (add_back) add("add_rows", CostUnit::Memory, 1, 3.0 * M * N * 4, double(M) * N);  // out read and written, the staged copy read
    else record_staging(st, s_of(a), s_of(out), accumulate, false);
  }
  // The residual read as the GEMM's addend (the same bytes as accumulating into out), or copied into
  // out first where the backend does that (cuda_scratch::gemm_reads_residual).
  void matmul_residual(Buf out, Buf residual, Buf a, Buf b, int64_t M, int64_t N, int64_t K, bool ta, bool tb) override {
    if (!cuda_scratch::gemm_reads_residual(staging(out, a, b, M, N, K, ta, tb), M, N, K, reinterpret_cast<uintptr_t>(residual.ptr)))
      convert(out, residual, M * N);
    matmul(out, a, b, M, N, K, ta, tb, true);
  }
  static cuda_scratch::GemmStaging staging(Buf out, Buf a, Buf b, int64_t M, int64_t N, int64_t K, bool ta, bool tb) {
    return cuda_scratch::gemm_staging(M, N, K, ta, tb, dtype_bytes(a.dtype), dtype_bytes(out.dtype), reinterpret_cast<uintptr_t>(a.ptr),
                                      reinterpret_cast<uintptr_t>(b.ptr), reinterpret_cast<uintptr_t>(out.ptr), a.ld, b.ld, out.ld);
  }
  // The copies a staged GEMM adds, each operand read once and written with its destination's rows
  // (the staged copy's padding zeroed): before it, a and b in (and out when accumulating); after it,
  // out back.
  void record_staging(const cuda_scratch::GemmStaging& st, double s_in, double s_out, bool accumulate, bool before) {
    auto copy = [&](const cuda_scratch::GemmOperand& o, double s, bool in) {
      add("copy_rows", CostUnit::Memory, 1, double(o.rows) * (o.cols + (in ? o.ld : o.stride)) * s, 0);
    };
    if (before) {
      if (st.a.staged) copy(st.a, s_in, true);
      if (st.b.staged) copy(st.b, s_in, true);
      if (st.out.staged && accumulate) copy(st.out, s_out, true);
    } else if (st.out.staged) {
      copy(st.out, s_out, false);
    }
  }

  // ---- model ops ------------------------------------------------------------------------------
  void embedding_forward(Buf out, const int32_t*, Buf, int64_t BT, int64_t C) override {
    if (BT > 0) add("embedding_forward", CostUnit::Memory, 1, 2.0 * BT * C * s_of(out) + 4.0 * BT, 0);
  }
  // Keys (token << 32 | position) sorted bitonically: n = BT rounded up to a power of two; one
  // launch sorts every chunk in shared memory, then for each larger merge size k a global launch per
  // stride j >= chunk and a local launch for the strides below it; each launch reads and writes the
  // n keys. Then one pass: dout read once, the touched dwte rows (at most BT distinct tokens: the
  // bound is used) read and written.
  void embedding_backward(Buf dwte, Buf dout, const int32_t*, int64_t BT, int64_t C) override {
    if (BT == 0) return;
    const int64_t n = cuda_scratch::embedding_sort_length(BT);
    const int64_t chunk = std::min(n, cuda_scratch::kEmbeddingSortChunk);
    int64_t local = 1, global = 0;
    for (int64_t k = 2 * chunk; k <= n; k <<= 1) {
      for (int64_t j = k / 2; j >= chunk; j >>= 1) ++global;
      ++local;
    }
    add("embedding_keys", CostUnit::Memory, 1, 4.0 * BT + 8.0 * n, 0);
    add("embedding_sort_local", CostUnit::Memory, local, local * 16.0 * n, 0);
    if (global) add("embedding_sort_global", CostUnit::Memory, global, global * 16.0 * n, 0);
    add("embedding_backward", CostUnit::Memory, 1, BT * (C * s_of(dout) + 8.0) + 2.0 * BT * C * s_of(dwte), double(BT) * C);
    // The crossing runs' pieces: at most a head and a tail per chunk of 32 keys, written and read.
    const double chunks = static_cast<double>(cuda_scratch::embedding_run_chunks(BT));
    add("embedding_backward_runs", CostUnit::Memory, 1, 16.0 * chunks + 2.0 * 2.0 * chunks * C * 4.0, 2.0 * chunks * C);
  }
  void rmsnorm_forward(Buf out, float*, Buf x, Buf w, int64_t N, int64_t C, float) override {
    if (N > 0) add("rmsnorm_forward", CostUnit::Memory, 1, N * C * (s_of(x) + s_of(out)) + C * s_of(w) + 4.0 * N, 4.0 * N * C);
  }
  // Rows: dout (FP32) and x read, dx (FP32) written (and read when accumulating), its rounded copy
  // written where asked, each block's dw partial written; then the partials of min(N, 256) blocks
  // summed into dw.
  void rmsnorm_backward(float*, Buf dx_copy, Buf dw, const float*, Buf x, Buf w, const float*, int64_t N, int64_t C, bool accumulate_dx) override {
    if (N == 0) return;
    const double P = static_cast<double>(std::min(N, cuda_scratch::kRmsnormBackwardBlocks));
    const double per_element = 8.0 + s_of(x) + (accumulate_dx ? 4.0 : 0.0) + (dx_copy.ptr ? s_of(dx_copy) : 0.0);
    add("rmsnorm_backward_rows", CostUnit::Memory, 1, N * C * per_element + C * s_of(w) + 4.0 * N + 4.0 * P * C, 8.0 * N * C);
    add("rmsnorm_backward_dw", CostUnit::Memory, 1, 4.0 * P * C + 2.0 * C * s_of(dw), P * C);
  }
  // The q and k sections (2 C of each 3 C row) read and written.
  void rope_forward(Buf qkv, const float*, int64_t B, int64_t T, int64_t H, int64_t D) override { rope(qkv, B * T, H * D, T, D); }
  void rope_backward(Buf dqkv, const float*, int64_t B, int64_t T, int64_t H, int64_t D) override { rope(dqkv, B * T, H * D, T, D); }

  // Causal attention over n = T (T + 1) / 2 (query, key) pairs per (b, h). The tensor-core forward
  // (BF16, D 64 or 128) takes 128 queries a block: Q read and O written once, and each block streams
  // the K and V rows up to its diagonal, on average T/2 rows of 2 D: (2 + T/128) B T C s. The SIMT
  // kernels take 16 queries a block: (2 + T/16) B T C s. FLOPs: S = Q K^T and O = P V, 2 n D each.
  void attention_forward(Buf out, float*, Buf qkv, int64_t B, int64_t T, int64_t H, int64_t D) override {
    if (B * T * H == 0) return;
    const double BTC = double(B) * T * H * D, pairs = double(B) * H * T * (T + 1) / 2.0, s = s_of(qkv);
    if (mma(qkv, D)) add("attention_forward_mma", CostUnit::KernelTensorCore, 1, (2 + T / 128.0) * BTC * s + 4.0 * B * H * T, 4 * pairs * D);
    else add("attention_forward", CostUnit::KernelFp32, 1, (2 + T / 16.0) * BTC * s + 4.0 * B * H * T, 4 * pairs * D);
    (void)out;
  }
  // delta = rowsum(dO * O): dO and O read. dK/dV (a block per R keys; R = 128 at D = 64, 64 at D =
  // 128): K and V read, dK and dV written, the Q, dO rows from each key block's diagonal down streamed
  // (T/2 on average, two of D): (4 + T/R) B T C s; it forms S, dP, then dV += P^T dO and dK += dS^T Q:
  // 8 n D. dQ (a block per R queries): Q and dO read, dQ written, K and V streamed up to the diagonal:
  // (3 + T/R) B T C s; S, dP and dQ = dS K: 6 n D. The SIMT kernels: the same products, R = 16.
  void attention_backward(Buf dqkv, Buf dout, Buf qkv, Buf out, const float*, int64_t B, int64_t T, int64_t H, int64_t D) override {
    if (B * T * H == 0) return;
    const double BTC = double(B) * T * H * D, pairs = double(B) * H * T * (T + 1) / 2.0, s = s_of(qkv), lse = 4.0 * B * H * T;
    add("attention_delta", CostUnit::Memory, 1, BTC * (s_of(dout) + s_of(out)) + lse, 2 * BTC);
    const bool tc = mma(qkv, D);
    const double tile = !tc ? 16.0 : D == 64 ? 128.0 : 64.0;
    const CostUnit unit = tc ? CostUnit::KernelTensorCore : CostUnit::KernelFp32;
    add(tc ? "attention_backward_dkdv_mma" : "attention_backward_dkdv", unit, 1, (4 + T / tile) * BTC * s + 2 * lse, 8 * pairs * D);
    add(tc ? "attention_backward_dq_mma" : "attention_backward_dq", unit, 1, (3 + T / tile) * BTC * s + 2 * lse, 6 * pairs * D);
    (void)dqkv;
  }
  void attention_decode(Buf out, Buf, Buf, Buf, int64_t pos, int64_t H, int64_t D) override {
    add("attention_decode", CostUnit::Memory, 1, (2.0 * (pos + 1) + 4) * H * D * s_of(out), 4.0 * (pos + 1) * H * D);
  }
  // The packed kernel or the elementwise one, as the backend picks (cuda_scratch::swiglu_packed).
  void swiglu_forward(Buf out, Buf gate_up, int64_t N, int64_t F) override {
    if (N * F == 0) return;
    const bool packs = cuda_scratch::swiglu_packed(F, dtype_bytes(out.dtype), {array(out, F, 0), array(gate_up, 2 * F, 0), array(gate_up, 2 * F, up(gate_up, F))});
    add(packs ? "swiglu_forward" : "swiglu_forward_elementwise", CostUnit::Memory, 1, 3.0 * N * F * s_of(out), 6.0 * N * F);
  }
  // gate_up and dout read, dgate_up written (2 F); out written too when given.
  void swiglu_backward(Buf dgate_up, Buf out, Buf dout, Buf gate_up, int64_t N, int64_t F) override {
    if (N * F == 0) return;
    const Buf o = out.ptr ? out : dout;
    const bool packs = cuda_scratch::swiglu_packed(F, dtype_bytes(dgate_up.dtype),
                                                   {array(dgate_up, 2 * F, 0), array(dgate_up, 2 * F, up(dgate_up, F)), array(dout, F, 0),
                                                    array(gate_up, 2 * F, 0), array(gate_up, 2 * F, up(gate_up, F)), array(o, F, 0)});
    add(packs ? "swiglu_backward" : "swiglu_backward_elementwise", CostUnit::Memory, 1, (out.ptr ? 6.0 : 5.0) * N * F * s_of(dgate_up),
        12.0 * N * F);
  }
  // Logits (FP32) read twice (max and sum, then the gradient), dlogits written, targets, mask, loss.
  void cross_entropy(float*, Buf dlogits, const float*, const int32_t*, const uint8_t*, int64_t N, int64_t V, float) override {
    if (N == 0) return;
    add("cross_entropy", CostUnit::Memory, 1, 8.0 * N * V + (dlogits.ptr ? N * V * s_of(dlogits) : 0.0) + 9.0 * N, 5.0 * N * V);
  }
  // BF16: the CUDA backend's fused loss head. Per vocabulary chunk a GEMM into the FP32 tile [N, Vc]
  // (at most kFusedLogitsRows x V floats, 8 MB at V = 32000), which stays in L2 between the GEMM that
  // writes it and the chunk kernel that reads it, the next chunk's GEMM overwriting the same lines:
  // neither is counted. The chunk kernel writes exp(x - max) as BF16; the finish kernel reads and
  // writes dlogits once (6 bytes a logit to DRAM, against the unfused 14).
  void linear_cross_entropy(float* losses, Buf dlogits, Buf logits, Buf x, Buf w, const int32_t* targets, const uint8_t* mask, int64_t N,
                            int64_t V, int64_t C, float grad_scale) override {
    if (!cuda_fuses_loss_head(x.dtype, w.dtype, dlogits.ptr != nullptr, dlogits.dtype))
      return Backend::linear_cross_entropy(losses, dlogits, logits, x, w, targets, mask, N, V, C, grad_scale);
    const VocabChunks chunks = fused_loss_head_chunks(N, V);
    const double backward = dlogits.ptr ? 1.0 : 0.0;
    for (int64_t v0 = 0; N > 0 && v0 < V; v0 += chunks.width) {
      const double n = static_cast<double>(std::min(chunks.width, V - v0));
      const auto st = staging(logits, x, Buf{static_cast<char*>(w.ptr) + v0 * C * 2, DType::BF16}, N, std::min(chunks.width, V - v0), C, false, true);
      record_staging(st, 2, 4, false, true);
      const cuda_scratch::GemmExtents e = cuda_scratch::gemm_extents(st, std::min(chunks.width, V - v0), C, false, true, 2, 4);
      const cuda_scratch::GemmParts parts = cuda_scratch::gemm_parts(N, e.N, e.K, 2, 4);  // as matmul runs it
      for (int i = 0; i < parts.count; ++i) {
        const cuda_scratch::GemmPart& p = parts.part[i];
        add("gemm bf16 (cuBLASLt)", CostUnit::GemmTensorCore, 1, 2.0 * double(p.m * p.k + p.n * p.k), 2.0 * double(p.m * p.n * p.k));
      }
      record_staging(st, 2, 4, false, false);
      add("cross_entropy_chunk", CostUnit::Memory, 1, backward * 2.0 * N * n + 13.0 * N, 5.0 * N * n);
    }
    if (N > 0) add("cross_entropy_finish", CostUnit::Memory, 1, backward * 4.0 * N * V + 8.0 * N * chunks.count + 13.0 * N, backward * 2.0 * N * V);
  }
  // One block: the losses and the mask read, the totals read and written.
  void accumulate_loss(LossTotals*, const float*, const uint8_t*, int64_t N) override {
    add("accumulate_loss", CostUnit::Memory, 1, 5.0 * N + 2.0 * sizeof(LossTotals), double(N));
  }

  // ---- optimizer ops ----------------------------------------------------------------------------
  // A fixed grid of partial sums, then one block over them.
  double sum_squares(Buf x, int64_t n) override {
    add("sum_squares_partial", CostUnit::Memory, 1, n * s_of(x) + 8.0 * cuda_scratch::kSumSquaresBlocks, 2.0 * n);
    add("sum_squares_final", CostUnit::Memory, 1, 8.0 * (cuda_scratch::kSumSquaresBlocks + 1), double(cuda_scratch::kSumSquaresBlocks));
    return 0;
  }
  // The same for every tensor in two launches per run of one dtype.
  void sum_squares_many(const Buf* xs, const int64_t* ns, int64_t count, double* out) override {
    const double P = static_cast<double>(cuda_scratch::kSumSquaresBlocks);
    for (int64_t begin = 0; begin < count;) {
      int64_t end = begin + 1;
      while (end < count && xs[end].dtype == xs[begin].dtype) ++end;
      double bytes = 0, n = 0;
      for (int64_t i = begin; i < end; ++i) bytes += ns[i] * s_of(xs[i]), n += double(ns[i]);
      const double tensors = double(end - begin);
      add("sum_squares_many_partial", CostUnit::Memory, 1, bytes + 8.0 * P * tensors + 16.0 * tensors, 2.0 * n);
      add("sum_squares_many_final", CostUnit::Memory, 1, 8.0 * (P + 1) * tensors, P * tensors);
      begin = end;
    }
    (void)out;
  }
  // One thread adding the sums of squares in order and finishing the loss.
  void update_statistics(UpdateScalars*, const LossTotals*, const double*, int64_t count, double) override {
    add("update_statistics", CostUnit::Memory, 1, 8.0 * count + sizeof(LossTotals) + sizeof(UpdateScalars), double(count));
  }
  // Launched every update; counted as clipping (x read and written), the worst case.
  void clip_gradients(Buf x, int64_t n, const UpdateScalars*) override {
    if (n > 0) add("clip_gradients", CostUnit::Memory, 1, 2.0 * n * s_of(x), double(n));
  }
  void scale(Buf x, int64_t n, float) override {
    if (n > 0) add("scale", CostUnit::Memory, 1, 2.0 * n * s_of(x), double(n));
  }
  void sinkgd_update(Buf w, Buf g, int64_t m, int64_t n, const SinkGDArgs& a) override {
    const SinkGDTensor t{w, g, m, n, a.write.tensor};
    sinkgd_update_many(&t, 1, a);
  }
  // Launch groups as the CUDA backend makes them (sinkgd.cu). Per iteration: the row norms read G and
  // write u (each block staging v: n floats from L2, counted); the column partials read G and u and
  // write a column partial per row chunk; the columns pass sums the partials. Then W and G read, W written.
  void sinkgd_update_many(const SinkGDTensor* tensors, int64_t count, const SinkGDArgs& a) override {
    auto shape = [&](int64_t i) { return std::pair<int64_t, int64_t>{tensors[i].m, tensors[i].n}; };
    for (int64_t begin = 0; begin < count;) {
      int64_t floats = 0;
      int64_t end = cuda_scratch::sinkgd_many_launch_end(begin, count, shape, &floats);
      for (int64_t i = begin + 1; i < end; ++i)
        if (tensors[i].w.dtype != tensors[begin].w.dtype || tensors[i].g.dtype != tensors[begin].g.dtype) end = i;
      double norms = 0, partials = 0, cols = 0, apply = 0, mn = 0;
      for (int64_t i = begin; i < end; ++i) {
        const SinkGDTensor& t = tensors[i];
        const double g = double(t.m) * t.n * s_of(t.g), chunk_sums = 4.0 * cuda_scratch::sinkgd_chunks(t.m) * t.n;
        const double norm_blocks = double((t.m + cuda_scratch::kSinkgdNormRows - 1) / cuda_scratch::kSinkgdNormRows);
        norms += g + 4.0 * t.m + norm_blocks * 4.0 * t.n;
        partials += g + 4.0 * t.m + chunk_sums;
        cols += chunk_sums + 4.0 * t.n;
        apply += double(t.m) * t.n * (s_of(t.g) + 2 * s_of(t.w)) + 4.0 * (t.m + t.n);
        mn += double(t.m) * t.n;
      }
      const int64_t L = a.iterations;
      if (L > 0) {
        add("sinkgd_row_norms", CostUnit::Memory, L, L * norms, 3.0 * L * mn);
        add("sinkgd_col_partials", CostUnit::Memory, L, L * partials, 3.0 * L * mn);
        add("sinkgd_cols", CostUnit::Memory, L, L * cols, 0.0);
      }
      add("sinkgd_apply", CostUnit::Memory, 1, apply, 5.0 * mn);
      begin = end;
    }
  }
  // SWAN as swan.cu runs it, chunk by chunk (cuda_scratch::swan_plan): the rows of every tensor
  // normalised into X (FP32), one launch; per run of one shape (cuda_scratch::swan_shape_runs) the
  // Gram matrices A = X X^T (k = min(m, n)), one batched GEMM; per chunk of B matrices ||A||_F twice,
  // the regularisation, the largest absolute row sums, the first check, then the Newton-Schulz steps
  // as an eager (profiled) run pays all of them: Y <- Y T and Z <- T Z as strided-batched FP32 GEMMs
  // (split TF32, cuda_scratch::swan_split_tf32: three TF32 GEMMs each, then Y and Z split), the
  // step's end (a thread a matrix), then the check (P = Z Y, its residual and T, the freeze), and
  // after the first two steps a device loop's bodies of two, each ending with its decision (an eager
  // run launches it to no effect). The update's graph ends its loop with the body whose check finds
  // every matrix done, within the scaled iteration's bound (optim_math::ns_steps_bound: 10 steps at
  // 1e-4), which depends on no data but the tolerance, yet is not what a profiled step runs. Then per
  // run U = Z X, one batched GEMM; a finiteness count; per exact-path group
  // (cuda_scratch::swan_exact_groups) the apply, the verdicts and the exact path's apply (which
  // returns at once unless a matrix fell back: the group's host function is no device work); the
  // statistics.
  void swan_update_many(const SwanTensor* tensors, int64_t count, const SwanArgs& a) override {
    if (a.exact) throw Error("cost model: SWAN's exact path runs on the host (LAPACK), not on the device");
    const cuda_scratch::SwanPlan plan = cuda_scratch::swan_plan(cuda_scratch::swan_shapes(tensors, count, swan_split_from_k(a.ns_products)));
    for (size_t c = 0, begin = 0; c < plan.ends.size(); begin = static_cast<size_t>(plan.ends[c++])) {
      const size_t end = static_cast<size_t>(plan.ends[c]);
      const double B = static_cast<double>(end - begin);
      const SwanTensor& first = tensors[plan.order[begin]];
      const double k = static_cast<double>(std::min(first.m, first.n)), kk = k * k;
      const double R = static_cast<double>(cuda_scratch::swan_reduce_blocks(std::min(first.m, first.n)));
      const auto shape = [&](int64_t b) { return std::pair<int64_t, int64_t>{tensors[plan.order[begin + b]].m, tensors[plan.order[begin + b]].n}; };
      const auto runs = cuda_scratch::swan_shape_runs(static_cast<int64_t>(end - begin), shape);
      const bool split = cuda_scratch::swan_split_tf32(swan_split_from_k(a.ns_products), std::min(first.m, first.n));  // Y, Z and T in halves too
      auto product = [&] { split ? gemm_split_tf32_batched(k, B) : gemm_fp32_batched(k, k, k, B); };
      double normalize = 0, mn_all = 0;
      for (size_t j = begin; j < end; ++j) {
        const SwanTensor& t = tensors[plan.order[j]];
        const double mn = double(t.m) * t.n;
        normalize += mn * (s_of(t.g) + 4), mn_all += mn;
      }
      add("swan_normalize_rows", CostUnit::Memory, 1, normalize, 3.0 * mn_all);
      for (const auto& [b0, b1] : runs) gemm_fp32_batched(k, k, static_cast<double>(std::max(shape(b0).first, shape(b0).second)), double(b1 - b0));  // A
      auto reduce = [&](double passes_bytes) {
        add("swan_partial_sums", CostUnit::Memory, 1, B * passes_bytes + 8.0 * R * B, 3.0 * B * kk);
        add("swan_reduce", CostUnit::Memory, 1, 8.0 * R * B + 64.0 * B, R * B);
      };
      reduce(4.0 * kk);
      add("swan_regularize", CostUnit::Memory, 1, B * 8.0 * k, B * k);
      reduce(4.0 * kk);
      add("swan_row_sums", CostUnit::Memory, 1, B * 4.0 * kk, B * 2.0 * kk);
      add("swan_ns_init", CostUnit::Memory, 1, B * (split ? 20.0 : 12.0) * kk, B * kk);
      // the first check (P = Y0), the first step (Z0 = I: Y T alone), the second, then the device
      // loop's bodies of two, each step checked at its end (the last check: the final iterate's residual)
      auto check = [&] {
        reduce((split ? 16.0 : 8.0) * kk);                                           // reads P, writes T (and its halves)
        add("swan_freeze", CostUnit::Memory, 1, B * (split ? 12.0 : 4.0) * kk, 0);  // the worst case: every matrix done, its T rewritten
      };
      const int steps = a.ns_steps <= 0 ? 0 : std::min(a.ns_steps, 2) + std::max(0, a.ns_steps - 1) / 2 * 2;
      check();
      for (int s = 0; s < steps; ++s) {
        product();              // Y <- Y T
        if (s > 0) product();  // Z <- T Z
        if (split) add("swan_ns_split", CostUnit::Memory, 1, B * 24.0 * kk, B * 4.0 * kk);  // Y and Z read, their halves written
        add("swan_ns_step_end", CostUnit::Memory, 1, 64.0 * B, 0);
        product();  // P = Z Y
        check();
        if (s >= 3 && s % 2 == 1) add("swan_ns_loop", CostUnit::Memory, 1, 64.0 * B, 0);  // a body's end (steps 3-4, 5-6, ...)
      }
      for (const auto& [b0, b1] : runs) gemm_fp32_batched(double(shape(b0).first), double(shape(b0).second), k, double(b1 - b0));  // U
      add("swan_count_nonfinite", CostUnit::Memory, 1, 4.0 * mn_all, mn_all);
      for (const auto& [g0, g1] : cuda_scratch::swan_exact_groups(static_cast<int64_t>(end - begin), shape)) {  // a launch each a group
        double apply = 0, mn_group = 0;
        for (int64_t b = g0; b < g1; ++b) {
          const SwanTensor& t = tensors[plan.order[begin + static_cast<size_t>(b)]];
          apply += double(t.m) * t.n * (4 + 2 * s_of(t.w)), mn_group += double(t.m) * t.n;
        }
        add("swan_apply", CostUnit::Memory, 1, apply, 3.0 * mn_group);
        add("swan_exact_verdict", CostUnit::Memory, 1, 64.0 * double(g1 - g0), 0);  // the host function's flags, a read of pinned memory each
        add("swan_apply_exact", CostUnit::Memory, 1, 0, 0);  // returns at once unless a tensor fell back
      }
      add("swan_statistics", CostUnit::Memory, 1, 64.0 * B, 0);
    }
  }
  // Every element-wise rule of the list: w, g and the states read; w and the states written; the
  // launches as the CUDA backend makes them (one a tensor for one tensor or a mixed list, else one
  // per kElementwiseManyPerLaunch tensors). A weight with padded rows alone, through dense copies:
  // w and g in, w back (elementwise_padded).
  void elementwise_update_many(ElementwiseKind kind, const ElementwiseTensor* tensors, int64_t count, const ElementwiseArgs& a) override {
    if (count == 0) return;
    if (std::any_of(tensors, tensors + count, [](const ElementwiseTensor& t) { return t.padded(); })) {
      std::vector<ElementwiseTensor> dense;
      for (int64_t i = 0; i < count; ++i) {
        ElementwiseTensor t = tensors[i];
        if (!t.padded()) {
          dense.push_back(t);
          continue;
        }
        // w and g into dense rows (read and written once), w back into its rows (the padding written too)
        const double rows = double(t.n) / t.cols, cols = double(t.cols), ld = double(t.w.stride(t.cols));
        add("copy_rows", CostUnit::Memory, 3, rows * (2 * cols * (s_of(t.w) + s_of(t.g)) + (cols + ld) * s_of(t.w)), 0);
        t.w.ld = t.g.ld = 0, t.cols = 0;
        elementwise_update_many(kind, &t, 1, a);
      }
      elementwise_update_many(kind, dense.data(), static_cast<int64_t>(dense.size()), a);
      return;
    }
    const char *name = "", *many_name = "";
    double flops_per_element = 0;
    switch (kind) {
#define MULTINORM_CASE(kind_, Step, name_, many_name_) \
  case kind_:                                        \
    name = name_, many_name = many_name_, flops_per_element = Step::kFlops;   \
    break;
      MULTINORM_ELEMENTWISE_RULES(MULTINORM_CASE)
#undef MULTINORM_CASE
    }
    auto bytes_of = [&](const ElementwiseTensor& t) {
      return t.n * (2 * s_of(t.w) + s_of(t.g) + (t.nstates > 0 ? 2.0 * t.nstates * s_of(t.states[0]) : 0.0));
    };
    if (!elementwise::in_multi_tensor_launches(tensors, count)) {
      for (int64_t i = 0; i < count; ++i)
        if (tensors[i].n > 0) add(name, CostUnit::Memory, 1, bytes_of(tensors[i]), flops_per_element * tensors[i].n);
      return;
    }
    for (int64_t begin = 0; begin < count; begin += cuda_scratch::kElementwiseManyPerLaunch) {
      const int64_t end = std::min(count, begin + cuda_scratch::kElementwiseManyPerLaunch);
      double bytes = 0, n = 0;
      for (int64_t i = begin; i < end; ++i) bytes += bytes_of(tensors[i]), n += tensors[i].n;
      add(many_name, CostUnit::Memory, 1, bytes, flops_per_element * n);
    }
  }

 private:
  void add(const char* name, CostUnit unit, int64_t launches, double bytes, double flops) {
    auto it = index_.find(name);
    if (it == index_.end()) {
      it = index_.emplace(name, costs_.size()).first;
      costs_.push_back({name, unit, 0, 0, 0});
    }
    KernelCost& k = costs_[it->second];
    k.launches += launches;
    k.bytes += bytes;
    k.flops += flops;
  }
  void rope(Buf x, int64_t BT, int64_t C, int64_t T, int64_t D) {
    if (BT > 0 && T > 0 && D > 0) add("rope", CostUnit::Memory, 1, 4.0 * BT * C * s_of(x) + 8.0 * T * D / 2, 3.0 * BT * C);
  }
  static bool mma(const Buf& qkv, int64_t D) { return qkv.dtype == DType::BF16 && (D == 64 || D == 128); }
  void gemm_fp32(double M, double N, double K) {
    add("gemm fp32 (cuBLASLt)", CostUnit::GemmFp32, 1, 4.0 * (M * K + K * N + M * N), 2.0 * M * N * K);
  }
  // LtGemm::run_batched_split_tf32: three TF32 products, the first writing out, the others adding to it
  void gemm_split_tf32_batched(double k, double batch) {
    for (int i = 0; i < 3; ++i)
      add("gemm tf32 batched (cuBLASLt)", CostUnit::GemmTf32, 1, batch * 4.0 * k * k * (i == 0 ? 3 : 4), batch * 2.0 * k * k * k);
  }
  // (a batch of one is a plain GEMM: LtGemm::run_batched)
  void gemm_fp32_batched(double M, double N, double K, double batch) {
    add(batch == 1 ? "gemm fp32 (cuBLASLt)" : "gemm fp32 batched (cuBLASLt)", CostUnit::GemmFp32, 1, batch * 4.0 * (M * K + K * N + M * N),
        batch * 2.0 * M * N * K);
  }

  RecordingQueue queue_;
  uintptr_t next_ = uintptr_t(1) << 46;
  bool cuda_layout_;
  std::vector<KernelCost> costs_;
  std::map<std::string, size_t> index_;
};

}  // namespace

std::unique_ptr<Backend> make_cost_recorder(bool cuda_layout) { return std::make_unique<CostRecorder>(cuda_layout); }

std::string staged_gemm_widths(const ModelConfig& m, DType dtype) {
  const int64_t s = dtype_bytes(dtype);
  std::string out;
  const std::pair<const char*, int64_t> widths[] = {{"hidden_size", m.hidden_size},
                                                    {"3 x hidden_size", 3 * m.hidden_size},
                                                    {"intermediate_size", m.intermediate_size},
                                                    {"2 x intermediate_size", 2 * m.intermediate_size},
                                                    {"vocab_size", m.vocab_size}};
  for (const auto& [name, w] : widths)
    if (cuda_scratch::gemm_operand_staged(w, s, 0)) out += (out.empty() ? "" : ", ") + std::string(name) + " " + std::to_string(w);
  return out;
}

double model_flops_per_token(const LlamaModel& model, int64_t T, int64_t* gemm_params_out) {
  const ModelConfig& cfg = model.config();
  int64_t gemm_params = 0;
  for (const auto& t : model.tensors())
    if (t.group() == TensorGroup::Attention || t.group() == TensorGroup::Mlp || t.group() == TensorGroup::LmHead ||
        (cfg.tie_word_embeddings && t.group() == TensorGroup::Embedding))
      gemm_params += t.numel();
  if (gemm_params_out) *gemm_params_out = gemm_params;
  return 6.0 * gemm_params + 12.0 * cfg.num_hidden_layers * T * cfg.hidden_size;
}

StepCosts record_step_costs(const RunConfig& run, DType dtype, int64_t B, int64_t T) {
  auto rec = make_cost_recorder();
  LlamaModel model(*rec, run.model, dtype, B, T, run.precision.grads);
  Optimizer optimizer(model.store(), run);
  std::vector<int32_t> tokens(static_cast<size_t>(B * T), 0);
  const MicroBatch mb{tokens.data(), tokens.data(), nullptr, B, T};
  take_kernel_costs(*rec);  // not the set-up's
  model.queue_forward_backward(mb, 1.0f);
  StepCosts c;
  c.micro_batch = take_kernel_costs(*rec);
  optimizer.step(1, 1);
  c.update = take_kernel_costs(*rec);
  c.flops_per_token = model_flops_per_token(model, T, &c.gemm_params);
  return c;
}

std::vector<KernelCost> take_kernel_costs(Backend& recorder) {
  auto* r = dynamic_cast<CostRecorder*>(&recorder);
  if (!r) throw Error("take_kernel_costs: the backend is not a cost recorder (" + recorder.name() + ")");
  return r->take();
}

// Datasheet peaks, dense. A100 SXM4 80 GB: 312 TFLOP/s BF16 tensor core, 19.5 FP32, 156 TF32 tensor
// core, HBM2e 2,039 GB/s. H100 SXM5: 989.4 BF16 tensor core, 67 FP32, 494.7 TF32, HBM3 3,350 GB/s.
// H200 SXM: the H100's chip with HBM3e, 4,800 GB/s.
// Assumed fractions (sources in docs/cuda.md): cuBLASLt's large BF16 GEMMs at 75% of the A100's peak
// and 70% of the H100's (wgmma GEMMs are held back more by their clocks under load); FlashAttention-2
// forward + backward at ~60% of an A100 (its paper: 50-73%, the upper end at long sequences and D =
// 128) and ~35% of an H100 (FlashAttention-3's paper: mma.sync without TMA/wgmma caps it there);
// memory-bound kernels at 80% of the bandwidth; FP32 FMA kernels at 50%.
const DevicePeak* find_device_peak(const std::string& name) {
  static const DevicePeak peaks[] = {
      {"a100", 312.0, 19.5, 156.0, 2039.0, 0.60, RooflineAssumptions{0.75, 0.60 * kAttentionOfFa2, 0.5, 0.8}},
      {"h100", 989.4, 67.0, 494.7, 3350.0, 0.35, RooflineAssumptions{0.70, 0.35 * kAttentionOfFa2, 0.5, 0.8}},
      {"h200", 989.4, 67.0, 494.7, 4800.0, 0.35, RooflineAssumptions{0.70, 0.35 * kAttentionOfFa2, 0.5, 0.8}},
  };
  for (const DevicePeak& p : peaks)
    if (p.name == name) return &p;
  return nullptr;
}

namespace {
double compute_seconds(const KernelCost& k, const DevicePeak& p, const RooflineAssumptions& a) {
  switch (k.unit) {
    case CostUnit::GemmTensorCore: return k.flops / (p.bf16_tflops * 1e12 * a.gemm);
    case CostUnit::KernelTensorCore: return k.flops / (p.bf16_tflops * 1e12 * a.attention);
    case CostUnit::GemmFp32: return k.flops / (p.fp32_tflops * 1e12 * a.gemm);
    case CostUnit::GemmTf32: return k.flops / (p.tf32_tflops * 1e12 * a.gemm);
    case CostUnit::KernelFp32: return k.flops / (p.fp32_tflops * 1e12 * a.simt);
    case CostUnit::Memory: return 0.0;
  }
  return 0.0;
}
double memory_seconds(const KernelCost& k, const DevicePeak& p, const RooflineAssumptions& a) {
  return k.bytes / (p.bandwidth_gbs * 1e9 * a.memory);
}
}  // namespace

double roofline_seconds(const KernelCost& k, const DevicePeak& p, const RooflineAssumptions& a) {
  return std::max(compute_seconds(k, p, a), memory_seconds(k, p, a));
}
bool roofline_memory_bound(const KernelCost& k, const DevicePeak& p, const RooflineAssumptions& a) {
  return memory_seconds(k, p, a) >= compute_seconds(k, p, a);
}

}  // namespace multinorm
