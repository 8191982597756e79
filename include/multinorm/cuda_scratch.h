// The CUDA backend's scratch buffers, sized in one place: the kernels' launchers and the backend
// allocate by these formulas, and `multinorm info` / the run log (src/optim/memory_estimate.cpp) plan
// device memory by the same ones. Plain C++: no CUDA types, so the core library includes it too.
#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

namespace multinorm::cuda_scratch {

constexpr int64_t kGemmWorkspaceBytes = 32ll << 20;  // cuBLASLt's recommendation for Hopper (gemm.h)

// GEMM operands cuBLASLt runs slowly: its fast kernels want every operand's rows and base on 16
// bytes. A row of llama_1b's MLP width (5461 BF16 = 10,922 bytes) is not: on an H100 such GEMMs ran
// at 133-143 TFLOP/s against 725-793 with 5504 (2026-11-27). Such an operand is staged: copied
// (`copy_rows`) into scratch with its rows padded to 128 bytes, the GEMM run there, an output copied
// back. One plan for the backend, the cost model and the memory estimate.
constexpr int64_t kGemmStagedRowBytes = 128;
inline bool gemm_operand_staged(int64_t cols, int64_t element_bytes, uintptr_t address) {
  return (cols * element_bytes) % 16 != 0 || address % 16 != 0;
}
inline int64_t gemm_staged_ld(int64_t cols, int64_t element_bytes) {
  const int64_t per_row = kGemmStagedRowBytes / element_bytes;
  return (cols + per_row - 1) / per_row * per_row;
}
// What one GEMM stages, operand by operand: a [rows, cols] as stored (rows x cols of op(a)^T when
// transposed), b likewise, out [M, N]. stride: its row stride as stored (cols, or a padded plan's
// wider one: Buf::ld); ld: the row stride the GEMM sees (the staged copy's when staged).
struct GemmOperand {
  int64_t rows = 0, cols = 0, stride = 0, ld = 0;
  bool staged = false;
  int64_t staged_bytes(int64_t element_bytes) const { return staged ? rows * ld * element_bytes : 0; }
};
struct GemmStaging {
  GemmOperand a, b, out;
};
// *_stride: the operands' stored row strides (0: dense).
inline GemmStaging gemm_staging(int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, int64_t in_bytes, int64_t out_bytes,
                                uintptr_t a_address, uintptr_t b_address, uintptr_t out_address, int64_t a_stride = 0, int64_t b_stride = 0,
                                int64_t out_stride = 0) {
  auto operand = [](int64_t rows, int64_t cols, int64_t stride, int64_t bytes, uintptr_t address) {
    stride = stride ? stride : cols;
    GemmOperand o{rows, cols, stride, stride, gemm_operand_staged(stride, bytes, address)};
    if (o.staged) o.ld = gemm_staged_ld(cols, bytes);
    return o;
  };
  return {operand(trans_a ? K : M, trans_a ? M : K, a_stride, in_bytes, a_address),
          operand(trans_b ? N : K, trans_b ? K : N, b_stride, in_bytes, b_address), operand(M, N, out_stride, out_bytes, out_address)};
}
// The MLP's activations where their rows of F are off 16 bytes (llama_1b's F = 5461): the CUDA plan
// pads them (ActivationLayout::pad_mlp_rows), swiglu and its gradient [rows, F] to 128-byte rows,
// gate_up and its gradient [rows, 2F] as [gate | zeros | up | zeros]: the up half starts at F rounded
// up to a 16-byte pack, so both halves' rows start on 16 bytes. SwiGLU then moves whole packs (on an
// H200, 2026-11-28, with up 5 elements off a pack: 2.98 + 6.96 ms a llama_1b micro-batch, where the
// packed kernel took 2.17 + 4.41 at F = 5504 on an H100, a GPU of 0.7x the bandwidth), and the gate/up
// projection runs as two GEMMs of F rows of its weight, one per half (Linear). Dense rows (ld 0):
// up at F.
inline bool mlp_rows_padded(int64_t F, int64_t element_bytes) { return gemm_operand_staged(F, element_bytes, 0); }
inline int64_t mlp_up_column(int64_t F, int64_t ld, int64_t element_bytes) {
  const int64_t pack = 16 / element_bytes;
  return ld ? (F + pack - 1) / pack * pack : F;
}
inline int64_t mlp_gate_up_ld(int64_t F, int64_t element_bytes) { return gemm_staged_ld(mlp_up_column(F, 1, element_bytes) + F, element_bytes); }
// SwiGLU (swiglu.cu) moves 16-byte packs where every array it touches has its rows (and the gate/up
// arrays both halves) on 16 bytes, and a row's last pack, loaded whole, inside the row's stride;
// anything else runs an element a thread, in launches named "..._elementwise" (a profile shows which
// ran). One rule for the launchers and the cost model. An array: its base, row stride and a column
// the kernel reads a pack at (0, or the up half's); every row, the last too, allocated to its full
// stride (the plan's buffers are).
struct SwigluArray {
  uintptr_t address;
  int64_t stride, column;
};
inline bool swiglu_packed(int64_t F, int64_t element_bytes, std::initializer_list<SwigluArray> arrays) {
  const int64_t pack = 16 / element_bytes, last = (F + pack - 1) / pack * pack;
  for (const SwigluArray& a : arrays)
    if (a.address % 16 != 0 || a.stride % pack != 0 || a.column % pack != 0 || a.column + last > a.stride) return false;
  return true;
}
// The extents a GEMM runs over. cuBLASLt's fast kernels also want the dimensions that are an
// operand's rows' length to be multiples of 16 bytes, whatever the row stride: on an H100
// (2026-11-27, torch.mm, T 8192, C 2048) the down projection's forward ran at 70 TFLOP/s with K = 5461
// in 128-byte rows and at 664 with K = 5504, its weight gradient at 133 with N = 5461 and 628 with
// 5504. Every padded operand holds zeros in its padding (a staged copy: copy_rows writes them; the
// plan's rows: zeroed at allocation, Buf::ld), so a K or N that is the rows' length of every operand
// carrying it (K: a not transposed and b transposed; N: b not transposed and out) runs over the
// narrowest of their padded widths: the products add exact zeros, the sums are the same. An output's
// padding then gets a row of `a` times zeros: zero unless that row is not finite. M, and a dimension
// that is some operand's row count, are never widened (that would need rows the operand lacks).
struct GemmExtents {
  int64_t N, K;
};
inline GemmExtents gemm_extents(const GemmStaging& st, int64_t N, int64_t K, bool trans_a, bool trans_b, int64_t in_bytes, int64_t out_bytes) {
  GemmExtents e{N, K};
  if (!trans_a && trans_b && (K * in_bytes) % 16 != 0) e.K = std::max(K, std::min(st.a.ld, st.b.ld));
  if (!trans_b && ((N * in_bytes) % 16 != 0 || (N * out_bytes) % 16 != 0)) e.N = std::max(N, std::min(st.b.ld, st.out.ld));
  return e;
}
// cuBLASLt's fast kernels also want every extent a whole number of 16-byte packs of the inputs
// (8 BF16), whatever the rows: on an H200 (2026-11-28, `bench gemm`, every operand's rows and base
// aligned) llama_1b's gate/up projection, whose weight has 2F = 10922 rows, ran at 215-392 TFLOP/s
// with M, N or K = 10922 and at 660-725 with 10944 (it now runs by halves, F = 5461 rows each: such
// extents too). An extent that gemm_extents does not widen and that is off whole packs runs as two
// GEMMs: the bulk, whole packs, and the rest (under a pack).
// M and N split the output, each element still one FP32 sum over all of K, rounded to the output
// once (though the parts may run other cuBLASLt kernels, and a GPU's in-place BF16 accumulation
// rounds the product first on some: tests/test_cuda_ops.cpp). K splits only into an FP32 output,
// the rest's product added to the bulk's there; a BF16 output would be rounded twice. (A residual
// projection's K is never split: a K off whole packs is staged and widened.) An extent under one
// pack is not split; K = 0 is none of this (the backend clears or keeps out).
struct GemmPart {
  int64_t m0, m, n0, n, k0, k;
};
struct GemmParts {
  GemmPart part[8];
  int count = 0;
};
inline GemmParts gemm_parts(int64_t M, int64_t N, int64_t K, int64_t in_bytes, int64_t out_bytes) {
  const int64_t pack = 16 / in_bytes;
  struct Range {
    int64_t begin, length;
  };
  auto split = [&](int64_t x, bool may, Range r[2]) {
    const int64_t bulk = x / pack * pack;
    if (!may || bulk == x || bulk == 0) return r[0] = {0, x}, 1;
    return r[0] = {0, bulk}, r[1] = {bulk, x - bulk}, 2;
  };
  Range m[2], n[2], k[2];
  const int cm = split(M, true, m), cn = split(N, true, n), ck = split(K, out_bytes == 4, k);
  GemmParts p;
  for (int i = 0; i < cm; ++i)
    for (int j = 0; j < cn; ++j)
      for (int l = 0; l < ck; ++l) p.part[p.count++] = {m[i].begin, m[i].length, n[j].begin, n[j].length, k[l].begin, k[l].length};
  return p;
}
// An accumulating GEMM whose FP32 output is staged (llama_1b's down projection's weight gradient with
// precision.grads=fp32, rows of 5461 floats) writes the staged copy afresh and adds it back into out (`add_rows`): out is
// not copied in first, and its copy in is never read by the GEMM. fl(product + out) either way: the
// bits cuBLASLt's accumulation gives. Two passes over out instead of four (at llama_1b, 32 x 256:
// 2.2 GB a micro-batch less). A BF16 output keeps the copy in: its product would be rounded twice.
inline bool gemm_adds_back(const GemmStaging& st, bool accumulate, int64_t out_bytes) { return accumulate && st.out.staged && out_bytes == 4; }
// A residual projection (out = residual + op(a) op(b), Backend::matmul_residual) reads its residual
// as cuBLASLt's addend (C) where the output is not staged (its dense rows then sit on 16 bytes) and
// the residual's base is on 16 bytes too; else the residual is copied into out and the GEMM accumulates.
inline bool gemm_reads_residual(const GemmStaging& st, int64_t M, int64_t N, int64_t K, uintptr_t residual_address) {
  return M > 0 && N > 0 && K > 0 && !st.out.staged && residual_address % 16 == 0;
}
// SinkGD's passes over G (sinkgd.cu), each one launch over every tensor of a call: the row norms, a
// warp a row, kSinkgdNormRows rows a block (v staged once a block in shared memory); the column
// partials, a thread a 16-byte pack of columns (P values) over its row chunk's rows, S threads a
// strip of a row. S is the smallest of 32, 64, 128, 256 that covers the row's packs, so a narrow
// matrix's block takes kSinkgdThreads / S chunks at once (llama_60m's n = 512: 64 packs, 4 chunks a
// block) instead of leaving most of its threads idle. One rule for the launches and the cost model.
constexpr int kSinkgdThreads = 256;      // a block of SinkGD's passes
constexpr int64_t kSinkgdNormRows = 64;  // the row-norms pass's rows a block: 8 warps, 8 rows each
constexpr int sinkgd_strip_threads(int64_t n, int64_t pack) {
  int S = 32;
  while (S < kSinkgdThreads && S * pack < n) S *= 2;
  return S;
}
// RMSNorm backward's blocks (1024 of at least 8 rows, for more waves at llama_1b, ran 5.56 ms against
// 5.03 for 256 on an H200, 2026-11-28, and its dw pass 0.68 against 0.32).
constexpr int64_t kRmsnormBackwardBlocks = 256;      // fixed: the same reduction tree on every GPU
constexpr int64_t kSinkgdChunks = 64;                // SinkGD's row chunks per pass, at most,
constexpr int64_t kSinkgdChunkRows = 16;             // of at least this many rows (a thread's work)
// SinkGD's row chunks of an m-row tensor (a column partial each: a thread a pack of columns over the
// chunk's rows): fixed by m, the same reduction tree on every GPU. At most 64: the partials are
// written and read once an iteration, 4 n bytes a chunk (at llama_1b, 64 chunks make them 4.5% of
// the two reads of G, 128 made 9%), and a column's sum reads one partial a chunk in sequence. At
// least 16 rows, so a small model's thread is not its fixed costs around 4 rows (llama_60m's 512:
// 32 chunks); every llama_1b matrix has 64 (32 rows at m = 2048, 86 at 5461).
constexpr int64_t sinkgd_chunks(int64_t m) { return std::min(kSinkgdChunks, (m + kSinkgdChunkRows - 1) / kSinkgdChunkRows); }
// A tensor's blocks in a pass over its row chunks and column strips (the column partials, G in packs
// of `pack` values; the W write, in the wider of W's and G's packs): its strips of S packs times its
// chunks taken kSinkgdThreads / S at a time.
inline int64_t sinkgd_strip_blocks(int64_t m, int64_t n, int64_t pack) {
  const int64_t S = sinkgd_strip_threads(n, pack), packs = (n + pack - 1) / pack;
  return (packs + S - 1) / S * ((sinkgd_chunks(m) + kSinkgdThreads / S - 1) / (kSinkgdThreads / S));
}
constexpr int64_t kSumSquaresBlocks = 256;           // the FP64 sum of squares' fixed grid
constexpr int64_t kSwanReduceBlocks = 64;            // SWAN's residual reduction: at most, and its partials' stride
// SWAN's residual reduction over a k x k matrix: a block per 256 elements up to the cap. A block
// that would hold no element adds nothing (an exact zero), so the sums are those of the full grid.
constexpr int64_t swan_reduce_blocks(int64_t k) { return std::min(kSwanReduceBlocks, (k * k + 255) / 256); }

// RMSNorm backward: per-block dw partials [min(N, 256), C], floats
inline int64_t rmsnorm_backward_floats(int64_t N, int64_t C) { return std::min(N, kRmsnormBackwardBlocks) * C; }
// attention backward: rowsum(dout * out) [B, H, T], bytes
inline int64_t attention_backward_bytes(int64_t B, int64_t H, int64_t T) { return B * H * T * 4; }
// embedding backward: a bitonic sort of (token, position) keys, BT rounded up to a power of two
// (at least 2); blocks sort chunks of kEmbeddingSortChunk keys in shared memory (16 KB).
constexpr int64_t kEmbeddingSortChunk = 2048;
inline int64_t embedding_sort_length(int64_t BT) {
  int64_t n = 2;
  while (n < BT) n <<= 1;
  return n;
}
// The sorted keys are summed in chunks of kEmbeddingRunChunk: a run of one token that crosses a
// chunk boundary leaves its pieces' sums (a head and a tail per chunk, FP32 rows of C) to be added in
// chunk order, so no thread walks a long run (padding, frequent tokens) alone.
constexpr int64_t kEmbeddingRunChunk = 32;
inline int64_t embedding_run_chunks(int64_t BT) { return (BT + kEmbeddingRunChunk - 1) / kEmbeddingRunChunk; }
inline int64_t embedding_backward_bytes(int64_t BT, int64_t C) {  // the keys, then the pieces' sums
  return embedding_sort_length(BT) * 8 + 2 * embedding_run_chunks(BT) * C * 4;
}
// sum of squares: the partials and the result, FP64
inline int64_t sum_squares_bytes() { return (kSumSquaresBlocks + 1) * 8; }
// sum_squares_many (the update's statistics): each tensor's partials, FP64 (the results go to the caller's buffer)
inline int64_t sum_squares_many_bytes(int64_t tensors) { return kSumSquaresBlocks * tensors * 8; }
// The multi-tensor launches' descriptor tables (SinkGD, Adam, the sums of squares), uploaded once and
// kept on the device (cuda_backend.cu's DescriptorCache): one buffer, allocated on first use.
constexpr int64_t kDescriptorCacheBytes = 1 << 20;
// An element-wise rule (Adam, SGD) on a weight with padded rows: w's and g's n elements in dense rows
// (CudaOptimizerKernels::elementwise_padded), g from a 256-byte boundary, bytes
inline int64_t padded_rule_g_offset(int64_t n, int64_t w_bytes) { return (n * w_bytes + 255) / 256 * 256; }
inline int64_t padded_rule_bytes(int64_t n, int64_t w_bytes, int64_t g_bytes) { return padded_rule_g_offset(n, w_bytes) + n * g_bytes; }
// SinkGD on [m, n]: u (m), v (n), column partials per row chunk, floats
inline int64_t sinkgd_floats(int64_t m, int64_t n) { return m + n + sinkgd_chunks(m) * n; }
// multi-tensor SinkGD: the tensors go, in the call's order, in launches of at most
// kSinkgdManyPerLaunch tensors whose scratch (their sinkgd_floats, side by side) stays within
// kSinkgdManyFloats, or one tensor alone that needs more. The descriptors of one launch:
constexpr int64_t kSinkgdManyPerLaunch = 64;
constexpr int64_t kSinkgdManyFloats = 16ll << 20;  // 64 MB
constexpr int64_t kSinkgdManyItemBytes = 112;      // 3 pointers, 10 integers, 2 floats
// The end of the launch that starts at tensor `begin` of `count`, shape(i) giving tensor i's
// (m, n); *floats is set to the launch's scratch.
template <class Shape>
int64_t sinkgd_many_launch_end(int64_t begin, int64_t count, const Shape& shape, int64_t* floats) {
  int64_t end = begin, sum = 0;
  while (end < count && end - begin < kSinkgdManyPerLaunch) {
    const auto [m, n] = shape(end);
    const int64_t f = sinkgd_floats(m, n);
    if (end > begin && sum + f > kSinkgdManyFloats) break;
    sum += f, ++end;
  }
  *floats = sum;
  return end;
}
// SWAN (swan.cu) runs its tensors in chunks: tensors of one Gram size k = min(m, n) (and one dtype
// pair), whose Newton-Schulz products are strided-batched GEMMs. A chunk's scratch, per tensor: X
// and U (FP32, rows padded to 128 bytes for cuBLASLt), the k x k matrices Y (first the Gram matrix),
// Z, P, T and a ping-pong spare, the residual's partial sums and the tensor's state (64 bytes). A
// chunk holds tensors while its scratch stays within kSwanChunkBytes (a larger tensor alone), at
// most kSwanChunkTensors of them (a Newton-Schulz step's end is one block, a thread a tensor). The
// exact path stages a tensor in pinned host memory, a flag and 8 bytes an element (X as floats, then
// U as doubles), a group of a chunk's tensors at once (swan_exact_groups: one host function a group).
constexpr int64_t kSwanChunkBytes = int64_t(1) << 30;
constexpr int64_t kSwanChunkTensors = 256;
constexpr int64_t kSwanStateBytes = 64;
constexpr int64_t kSwanPinnedGroupBytes = int64_t(64) << 20;
inline int64_t swan_ld(int64_t n) { return (n + 31) / 32 * 32; }
inline int64_t swan_x_floats(int64_t m, int64_t n) { return (m * swan_ld(n) + 63) / 64 * 64; }
inline int64_t swan_gram_floats(int64_t k) { return (k * k + 63) / 64 * 64; }
// Newton-Schulz's products in split TF32 (swan.cu: each FP32 operand as hi + lo, both TF32, and
// each product as three TF32 tensor-core products) from Gram size `split_from_k` on (SwanArgs'
// ns_products: swan_split_from_k): every k for split_tf32, none for fp32, and for auto from
// kSwanSplitTf32MinK on, where the roofline predicts an A100, an H100 and an H200 no slower
// (docs/optimizers.md: at k = 512 an H100 breaks even, 11.66 ms against 11.64 at llama_60m, an H200
// and an A100 gain 25% and 41%; at k = 384 an H100 would lose 26%).
// A split chunk keeps Y's, Z's and T's halves too: 6 more k x k matrices a tensor.
constexpr int64_t kSwanSplitTf32MinK = 512;
inline bool swan_split_tf32(int64_t split_from_k, int64_t k) { return k >= split_from_k; }
inline int64_t swan_tensor_bytes(int64_t m, int64_t n, bool split) {
  const int64_t k = std::min(m, n);
  return 8 * swan_x_floats(m, n) + (split ? 44 : 20) * swan_gram_floats(k) + 8 * kSwanReduceBlocks + kSwanStateBytes;
}
inline int64_t swan_pinned_bytes(int64_t m, int64_t n) { return (64 + 8 * m * n + 63) / 64 * 64; }
// A chunk's exact-path groups, [begin, end) in its order: consecutive tensors whose staging
// (swan_pinned_bytes(shape(i)), each at the sum of the ones before it) fits kSwanPinnedGroupBytes,
// a larger tensor alone. Each group stages at once and takes one host function: a host node in the
// update's graph, a round trip to the host each update even when no tensor falls back.
template <class Shape>
std::vector<std::pair<int64_t, int64_t>> swan_exact_groups(int64_t count, const Shape& shape) {
  std::vector<std::pair<int64_t, int64_t>> groups;
  int64_t bytes = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t b = swan_pinned_bytes(shape(i).first, shape(i).second);
    if (i == 0 || bytes + b > kSwanPinnedGroupBytes) groups.push_back({i, i + 1}), bytes = b;
    else groups.back().second = i + 1, bytes += b;
  }
  return groups;
}
// The order SWAN runs a call's tensors in (stable by dtype pair `kind`, then k, then shape: a chunk's
// tensors of one shape are adjacent, their Gram matrices and U one strided-batched GEMM each:
// swan_shape_runs) and each chunk's end in that order; the largest chunk's scratch and the pinned
// staging the call needs.
struct SwanShape {
  int64_t m = 0, n = 0;
  int kind = 0;        // the dtype pair (swan_kind): a chunk holds one
  bool split = false;  // split TF32 products (swan_split_tf32): a chunk holds one kind of products
};
inline int swan_kind(int weight_dtype, int grad_dtype) { return weight_dtype * 16 + grad_dtype; }
// A call's SwanTensors (optimizer_kernels.h) as the plan takes them, with their products' kind.
template <class SwanTensor>
std::vector<SwanShape> swan_shapes(const SwanTensor* tensors, int64_t count, int64_t split_from_k) {
  std::vector<SwanShape> shapes;
  for (int64_t i = 0; i < count; ++i) {
    const SwanTensor& t = tensors[i];
    shapes.push_back({t.m, t.n, swan_kind(static_cast<int>(t.w.dtype), static_cast<int>(t.g.dtype)), swan_split_tf32(split_from_k, std::min(t.m, t.n))});
  }
  return shapes;
}
struct SwanPlan {
  std::vector<int64_t> order, ends;
  int64_t scratch_bytes = 0, pinned_bytes = 0;
};
inline SwanPlan swan_plan(const std::vector<SwanShape>& shapes) {
  SwanPlan p;
  auto k_of = [&](int64_t i) { return std::min(shapes[i].m, shapes[i].n); };
  for (int64_t i = 0; i < static_cast<int64_t>(shapes.size()); ++i) p.order.push_back(i);
  std::stable_sort(p.order.begin(), p.order.end(), [&](int64_t a, int64_t b) {
    const SwanShape &x = shapes[a], &y = shapes[b];
    if (x.kind != y.kind) return x.kind < y.kind;
    if (k_of(a) != k_of(b)) return k_of(a) < k_of(b);
    return x.m != y.m ? x.m < y.m : x.n < y.n;
  });
  int64_t bytes = 0;
  for (size_t j = 0; j < p.order.size(); ++j) {
    const int64_t i = p.order[j], t = swan_tensor_bytes(shapes[i].m, shapes[i].n, shapes[i].split);
    const int64_t in_chunk = j - (p.ends.empty() ? 0 : p.ends.back());
    const SwanShape& prev = shapes[p.order[j > 0 ? j - 1 : 0]];
    const bool joins = j > 0 && prev.kind == shapes[i].kind && prev.split == shapes[i].split && k_of(p.order[j - 1]) == k_of(i) &&
                       bytes + t <= kSwanChunkBytes && in_chunk < kSwanChunkTensors;
    if (j > 0 && !joins) p.ends.push_back(static_cast<int64_t>(j)), bytes = 0;
    bytes += t;
    p.scratch_bytes = std::max(p.scratch_bytes, bytes);
  }
  if (!p.order.empty()) p.ends.push_back(static_cast<int64_t>(p.order.size()));
  for (size_t c = 0, begin = 0; c < p.ends.size(); begin = static_cast<size_t>(p.ends[c++])) {  // the largest exact-path group's staging
    const auto shape = [&](int64_t b) { return std::pair<int64_t, int64_t>{shapes[p.order[begin + b]].m, shapes[p.order[begin + b]].n}; };
    for (const auto& [g0, g1] : swan_exact_groups(p.ends[c] - static_cast<int64_t>(begin), shape)) {
      int64_t bytes_of_group = 0;
      for (int64_t b = g0; b < g1; ++b) bytes_of_group += swan_pinned_bytes(shape(b).first, shape(b).second);
      p.pinned_bytes = std::max(p.pinned_bytes, bytes_of_group);
    }
  }
  return p;
}

// The runs of one shape among a chunk's `count` tensors (shape(i): tensor i's (m, n) in the chunk's
// order), as [begin, end) pairs: each run's X, U and Gram matrices are evenly strided in the chunk's
// scratch (swan_x_floats, swan_gram_floats), so a run is one strided-batched GEMM.
template <class Shape>
std::vector<std::pair<int64_t, int64_t>> swan_shape_runs(int64_t count, const Shape& shape) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t i = 0; i < count; ++i)
    if (i == 0 || shape(i) != shape(i - 1)) runs.push_back({i, i + 1});
    else runs.back().second = i + 1;
  return runs;
}

// multi-tensor element-wise updates (Adam, SGD): the tensor descriptors of one launch (at most
// kElementwiseManyPerLaunch tensors)
constexpr int64_t kElementwiseManyPerLaunch = 256;
constexpr int64_t kElementwiseManyItemBytes = 56;  // 4 pointers, length, tensor id, first block
static_assert(kElementwiseManyPerLaunch * kElementwiseManyItemBytes <= kDescriptorCacheBytes && kSinkgdManyPerLaunch * kSinkgdManyItemBytes <= kDescriptorCacheBytes,
              "a launch's table fits the descriptor cache");
// tensors at most this long are updated together (src/optim/optimizer.cpp)
constexpr int64_t kMultiTensorElements = 1 << 16;

}  // namespace multinorm::cuda_scratch
