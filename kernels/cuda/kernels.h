// Host entry points of the CUDA kernels (kernels/cuda/*.cu), called by the CUDA backend
// (cuda_backend.cu). Each launches on `stream` and returns without synchronising. Shapes and layouts
// are those of the Backend seam (include/multinorm/backend.h); T is the storage type (float or bf16)
// and G a gradient type. Scratch buffers come from the caller (the backend's reused workspace);
// each entry point says how much it needs.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <utility>
#include <vector>

#include "../common/optim_math.h"
#include "cuda_compat.h"
#include "multinorm/cuda_scratch.h"
#include "multinorm/write_back.h"

namespace multinorm::cuda {

// The floats of a per-column (per-channel) partial that one block keeps in dynamic shared memory:
// an A100's 163 KB opt-in (the smallest target; an H100 allows 227 KB) less the largest static
// scratch of its users (SinkGD's rows pass: 256 bytes; RMSNorm's backward rows: none). launch() opts
// in above 48 KB.
constexpr int64_t kSharedOptInFloats = (163 * 1024 - 256) / 4;

// ---- casts and reductions (convert.cu) --------------------------------------------------------------
template <class D, class S>
void convert(D* dst, const S* src, int64_t n, cudaStream_t stream);
template <class T>
void scale(T* x, int64_t n, float factor, cudaStream_t stream);
// dst[r, c] = src[r, c], r < rows, c < cols, rows dst_ld and src_ld elements apart, elements of 2 or 4
// bytes: a GEMM operand to or from its staged copy (cuda_scratch::gemm_staging).
void copy_rows(void* dst, int64_t dst_ld, const void* src, int64_t src_ld, int64_t rows, int64_t cols, int element_bytes, cudaStream_t stream);
// dst += src over rows x cols floats: an accumulating GEMM's staged FP32 output added back
// (cuda_scratch::gemm_adds_back).
void add_rows(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols, cudaStream_t stream);
// sum of squares in FP64, deterministic (fixed grid, fixed-order final sum) into *result (device)
constexpr int kSumSquaresBlocks = static_cast<int>(cuda_scratch::kSumSquaresBlocks);
template <class T>
void sum_squares(double* result, double* partials /* kSumSquaresBlocks */, const T* x, int64_t n, cudaStream_t stream);
// The same for `count` tensors of one dtype in two launches (results[i] the bits sum_squares gives
// tensor i): `items` (device memory) their pointers and lengths, partials kSumSquaresBlocks x count.
struct SumSquaresItem {
  const void* x;
  int64_t n;
};
template <class T>
void sum_squares_many(double* results, double* partials, const SumSquaresItem* items, int64_t count, cudaStream_t stream);
// s->stats from the per-tensor sums (optim_math::finish_statistics), one device thread.
void update_statistics(UpdateScalars* s, const LossTotals* loss, const double* squares, int64_t count, double grad_clip, cudaStream_t stream);
// x[n] *= s->stats.clip_factor, read on the device; nothing when it is 1 or the update is skipped.
template <class T>
void clip_gradients(T* x, int64_t n, const UpdateScalars* s, cudaStream_t stream);

// ---- embedding.cu --------------------------------------------------------------------------------
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int64_t BT, int64_t C, cudaStream_t stream);
// Deterministic backward, all on the device: positions sorted by (token, position) in `keys`
// (cuda_scratch::embedding_backward_bytes(BT, C) of scratch), then each token's run summed in chunks of 32 keys.
template <class T, class G>
void embedding_backward(G* dwte, const T* dout, const int32_t* tokens, int64_t BT, int64_t C, uint64_t* keys, cudaStream_t stream);

// ---- rmsnorm.cu ------------------------------------------------------------------------------------
template <class T>
void rmsnorm_forward(T* out, float* rstd, const T* x, const T* w, int64_t N, int64_t C, float eps, cudaStream_t stream);
// scratch: rmsnorm_backward_scratch(N, C) floats
int64_t rmsnorm_backward_scratch(int64_t N, int64_t C);
template <class T, class G>
void rmsnorm_backward(float* dx, T* dx_copy, G* dw, const float* dout, const T* x, const T* w, const float* rstd, int64_t N, int64_t C,
                      bool accumulate_dx, float* scratch, cudaStream_t stream);

// ---- rope.cu -----------------------------------------------------------------------------------------
template <class T>
void rope(T* qkv, const float* cos_sin, int64_t B, int64_t T_, int64_t H, int64_t D, bool inverse, cudaStream_t stream);

// ---- swiglu.cu -------------------------------------------------------------------------------------
// Row strides in elements of SwiGLU's arrays (2F and F where dense; the CUDA plan pads rows off 16
// bytes), and the columns where gate_up's and dgate_up's up halves start (F where dense; a 16-byte
// pack on in the plan's padded rows: cuda_scratch::mlp_up_column).
struct SwigluStrides {
  int64_t gate_up, out, dout, dgate_up;
  int64_t up, dup;
};
template <class T>
void swiglu_forward(T* out, const T* gate_up, int64_t N, int64_t F, const SwigluStrides& ld, cudaStream_t stream);
template <class T>
void swiglu_backward(T* dgate_up, T* out, const T* dout, const T* gate_up, int64_t N, int64_t F, const SwigluStrides& ld, cudaStream_t stream);

// ---- cross_entropy.cu --------------------------------------------------------------------------------
template <class T>
void cross_entropy(float* losses, T* dlogits, const float* logits, const int32_t* targets, const uint8_t* mask, int64_t N,
                   int64_t V, float grad_scale, cudaStream_t stream);
// totals += the micro-batch's losses where mask (optim_math's lane order): one block, reads 5 N bytes.
void accumulate_loss(LossTotals* totals, const float* losses, const uint8_t* mask, int64_t N, cudaStream_t stream);
// One row's softmax statistics over one vocabulary chunk: max and sum of exp(x - max).
struct ChunkStats {
  float max, sum;
};
// The fused loss head's two kernels (cross_entropy.cu): per vocabulary chunk of the FP32 tile
// [R, Vc] (logits columns v0 ..), its (max, sum of exp) into stats[R, chunks], the target's logit, and
// exp(x - max) as BF16 into dlogits (when given); then per row the loss and dlogits scaled in place.
void cross_entropy_chunk(ChunkStats* stats, float* target_logit, bf16* dlogits, const float* tile, const int32_t* targets, const uint8_t* mask,
                         int64_t R, int64_t Vc, int64_t v0, int64_t V, int64_t chunk, int64_t chunks, cudaStream_t stream);
void cross_entropy_finish(float* losses, bf16* dlogits, const ChunkStats* stats, const float* target_logit, const int32_t* targets,
                          const uint8_t* mask, int64_t R, int64_t V, int64_t Vc, int64_t chunks, float grad_scale, cudaStream_t stream);

// ---- attention.cu ----------------------------------------------------------------------------------
constexpr int kAttentionMaxHeadDim = 128;
template <class T>
void attention_forward(T* out, float* lse, const T* qkv, int64_t B, int64_t T_, int64_t H, int64_t D, cudaStream_t stream);
// scratch: B*H*T floats (rowsum(dout * out))
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int64_t B, int64_t T_, int64_t H,
                        int64_t D, float* scratch, cudaStream_t stream);
// attention_mma.cu: the tensor-core kernels attention_forward/backward use for BF16 storage when
// attention_mma_supported (D = 64 or 128, every pointer 16-byte aligned); other shapes and FP32
// storage run the SIMT kernels.
bool attention_mma_supported(int64_t D, std::initializer_list<const void*> pointers);
void attention_forward_mma(bf16* out, float* lse, const bf16* qkv, int64_t B, int64_t T, int64_t H, int64_t D, cudaStream_t stream);
// delta[B, H, T] = rowsum(dout * out), from attention.cu's delta kernel.
void attention_backward_mma(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta, int64_t B, int64_t T, int64_t H,
                            int64_t D, cudaStream_t stream);
template <class T>
void attention_decode(T* out, const T* qkv, T* k_cache, T* v_cache, int64_t pos, int64_t H, int64_t D, cudaStream_t stream);

// ---- optimizers (elementwise.cu, sinkgd.cu, swan.cu) -------------------------------------------------------
// Every optimizer launcher takes its scalars (lr, keep, Adam's) as `r`, formed on the host exactly as
// the CPU backend forms them (optim_math::rule_scalars), and an UpdateScalars slot `s`: when s.at is
// set, the kernels read the scalars and the write step from there when they run and write nothing
// for a skipped update (r and wb.step are then unused).
// An element-wise rule (its Step: kernels/common/elementwise_rules.h, shared with the CPU), one pass:
// reads w, g and `states` state arrays (the Step's count, or none where its rule keeps its state
// only sometimes), writes w and the states. `name`: the kernel's name in profiles (the list's).
template <class S>
struct ElementwiseStates {
  S* p[kMaxElementwiseStates];
};
template <class Step, class T, class G, class S>
void elementwise(const char* name, T* w, const G* g, ElementwiseStates<S> st, int states, int64_t n, const RuleScalars& r, const WriteBack& wb,
                 ScalarsRef s, cudaStream_t stream);
// Many tensors of one rule: `items` (device memory) describes up to kElementwiseManyPerLaunch tensors
// sharing dtypes, state count and arguments; one launch of `blocks` blocks (each tensor's first block
// in its item).
struct ElementwiseManyItem {
  void* w;
  const void* g;
  void* states[kMaxElementwiseStates];
  int64_t n;
  uint64_t tensor;       // stochastic-rounding tensor id
  int64_t first_block;   // this tensor's first block of the launch
};
static_assert(sizeof(ElementwiseManyItem) == cuda_scratch::kElementwiseManyItemBytes, "the memory plan counts this size");
constexpr int kElementwiseManyElementsPerBlock = 1024;
template <class Step, class T, class G, class S>
void elementwise_many(const char* name, const ElementwiseManyItem* items, int states, int64_t count, int64_t blocks, const RuleScalars& r,
                      const WriteBack& wb, ScalarsRef s, cudaStream_t stream);

// SinkGD on many W[m,n] at once: L iterations of three passes (the row scales u from v, each row
// chunk's column partials of u^2 G^2, the column scales v from the partials; FP32), then one pass
// writing W; each pass is one launch for every tensor of the call. `items` (device memory)
// describes up to kSinkgdManyPerLaunch tensors sharing dtypes and arguments, made by sinkgd_item and
// laid out by sinkgd_layout; each has its own scratch of sinkgd_scratch(m, n) floats.
int64_t sinkgd_scratch(int64_t m, int64_t n);
struct SinkgdManyItem {
  void* w;
  const void* g;
  float* scratch;                  // u (m), v (n), the row chunks' column partials (chunks x n)
  int64_t m, n, ld;                // ld: the row stride of w and g (n, or a padded arena's: TensorSpec::arena_ld)
  int64_t rows_per_chunk, chunks;  // a pass's row chunks: fixed by m (the same sums on every GPU)
  uint64_t tensor;                 // stochastic-rounding tensor id
  int64_t first_norm_block, first_partial_block, first_col_block, first_apply_block;  // this tensor's first block of each launch
  float sqrt_n, sqrt_m;
};
static_assert(sizeof(SinkgdManyItem) == cuda_scratch::kSinkgdManyItemBytes, "the memory plan counts this size");
SinkgdManyItem sinkgd_item(void* w, const void* g, int64_t m, int64_t n, int64_t ld, float* scratch, uint64_t tensor);
// The blocks of the four passes for items[0..count) (each item's first blocks set here; W of w_bytes, G of g_bytes).
struct SinkgdLayout {
  int64_t norm_blocks = 0, partial_blocks = 0, col_blocks = 0, apply_blocks = 0, max_n = 0;
};
SinkgdLayout sinkgd_layout(SinkgdManyItem* items, int64_t count, int64_t w_bytes, int64_t g_bytes);
template <class T, class G>
void sinkgd_many(const SinkgdManyItem* items, int64_t count, const SinkgdLayout& layout, int iterations, float eps, const RuleScalars& r,
                 const WriteBack& wb, ScalarsRef s, cudaStream_t stream);

// SWAN on a chunk of matrices of one Gram size k and one dtype pair (swan.cu): row normalisation,
// the Gram matrices, Newton-Schulz as strided-batched FP32 (or split TF32) cuBLASLt products, U and the apply; every
// decision (each matrix's convergence, the non-finite fallback, the update's skip flag) is made on
// the device, and the exact FP64 path runs in a host function in stream order when a matrix needs it.
// No host wait: the chunk can be captured in a graph. scratch: cuda_scratch::swan_plan's bytes;
// groups: the chunk's exact-path groups' staging in pinned host memory (swan_exact_groups' order).
class LtGemm;
struct SwanParams {
  float lr, decoupled_decay, eps, ns_tolerance;
  int ns_steps;
  bool standardize, exact;
  WriteBack write;
  ScalarsRef scalars;  // as the other optimizers' (the apply kernels read them)
  SwanStats* stats;    // device memory the chunk adds its statistics to (null: none)
  SwanProducts ns_products;  // FP32 or split TF32 Newton-Schulz products (cuda_scratch::swan_split_tf32)
};
struct SwanItem {
  void* w;
  const void* g;
  int64_t m, n, ld;  // ld: the row stride of w and g (n, or a padded arena's)
  uint64_t tensor;
};
// The host functions' descriptions of the exact path's staging: a group of a chunk's matrices
// (cuda_scratch::swan_exact_groups) staged from `pinned` on, one host function for the group (kept by
// the caller, by shapes, while a graph may run it).
struct SwanExactGroup;
SwanExactGroup* swan_exact_group(void* pinned, const std::vector<std::pair<int64_t, int64_t>>& shapes);
void swan_exact_group_free(SwanExactGroup* group);
// A descriptor table's device copy (the descriptor cache: uploaded once, found again by its bytes).
using Upload = std::function<const void*(const void* table, size_t bytes)>;
// A loop the device may end early (CudaQueue::device_loop): while the stream captures a graph, the
// body is captured once as a WHILE node's body, on the stream it is given, and true is returned; its
// last kernel says with cudaGraphSetConditional(handle, more) whether it runs again. Otherwise false:
// the caller runs the body its full count of times on its own stream, with handle 0 (nothing to set).
using DeviceLoopBody = std::function<void(cudaStream_t, cudaGraphConditionalHandle)>;
using DeviceLoop = std::function<bool(const DeviceLoopBody&)>;

template <class T, class G>
void swan_chunk(const SwanItem* items, int64_t count, const SwanParams& a, LtGemm& gemm, void* scratch, SwanExactGroup* const* groups,
                const DeviceLoop& loop, const Upload& upload, cudaStream_t stream);

}  // namespace multinorm::cuda
