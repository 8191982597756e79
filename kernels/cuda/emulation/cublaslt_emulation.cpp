// A CPU stand-in for the cuBLASLt calls the CUDA backend makes, with cuBLASLt's semantics: column-major
// matrices described by (type, rows, cols, ld) as stored, op() per TRANSA/TRANSB on the descriptor,
// D = alpha * op(A) op(B) + beta * C with FP32 compute and scale, BF16 or FP32 inputs, BF16 or FP32
// output; or TF32 compute (CUBLAS_COMPUTE_32F_FAST_TF32) of FP32 operands, each truncated to TF32.
// Dimensions, leading dimensions, type combinations and device pointers are validated the way
// cuBLASLt rejects them (CUBLAS_STATUS_INVALID_VALUE / NOT_SUPPORTED), so the backend's layout logic
// (row-major to column-major, transposes, odd leading dimensions) is exercised exactly as on a GPU.
//
// Alignment: cuBLASLt's heuristic picks an algorithm for the operand alignments the preference
// declares (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{A,B,C,D}_BYTES, 256 when not set), and that algorithm
// may rely on them: cublasLtMatmul with a pointer less aligned than its algorithm assumed is refused
// here (CUBLAS_STATUS_NOT_SUPPORTED), so a backend that caches plans by shape alone and then passes a
// less aligned pointer (an activation view, a SWAN buffer at an odd offset) fails in CI.
//
// Split-K: for a long reduction into a small output cuBLASLt may split K and add the partial sums in
// the output's type (CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE, or INPLACE in the output buffer), unless
// the preference's CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK forbids it (an H100 did so for a
// 5 x 6 x 5461 BF16 product, 2026-11-27). Here the worst it may do is what it does: where the
// preference allows a reduction in a 16-bit output type and K >= kSplitKMin, K is cut into kSplits
// slices and their sums are added into a running total rounded to the output type after each.
#include <cublasLt.h>

#include <cstring>
#include <vector>

#include "cuda_emulation.h"

namespace cuda_emu {
bool is_device_memory(const void* p, size_t bytes);
}

struct cublasLtContext {
  int unused = 0;
};

namespace {

struct Desc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
};
struct Layout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch = 1;   // CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT
  int64_t stride = 0;  // CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, in elements
};
// The preference's declared operand alignments and allowed split-K reductions, and the algorithm's
// assumed ones (the same numbers).
struct Preference {
  uint32_t a, b, c, d;
  uint32_t reductions;  // CUBLASLT_REDUCTION_SCHEME_* bits
};
constexpr Preference kDefaultPreference{256, 256, 256, 256, CUBLASLT_REDUCTION_SCHEME_MASK};  // cuBLASLt's default
static_assert(sizeof(Preference) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "the preference fits its opaque type");
static_assert(sizeof(Preference) <= sizeof(cublasLtMatmulAlgo_t), "the preference fits the opaque algorithm");
constexpr uint64_t kSplitKMin = 1024, kSplits = 32;
static_assert(sizeof(Desc) <= sizeof(cublasLtMatmulDescOpaque_t), "descriptor state fits the opaque type");
static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "layout state fits the opaque type");

template <class T, class O>
T get(const O* o) {
  T t;
  std::memcpy(&t, o->data, sizeof(T));
  return t;
}
template <class T, class O>
void put(O* o, const T& t) {
  std::memcpy(o->data, &t, sizeof(T));
}

float load(const void* p, cudaDataType t, int64_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}
// An FP32 operand as a TF32 tensor core takes it: its 13 low mantissa bits dropped (truncated, the
// worst a conversion may do; an operand already TF32, as split TF32's halves are, is unchanged).
float tf32_operand(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  u &= 0xffffe000u;
  std::memcpy(&v, &u, sizeof(u));
  return v;
}
void store(void* p, cudaDataType t, int64_t i, float v) {
  if (t == CUDA_R_32F) static_cast<float*>(p)[i] = v;
  else static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);  // round to nearest even, as cuBLASLt
}
int64_t bytes_of(const Layout& l) { return l.type == CUDA_R_32F ? 4 : 2; }
bool on_device(const void* p, const Layout& l) {
  const int64_t last = (l.batch - 1) * l.stride;  // the last matrix of a batch, in elements
  return cuda_emu::is_device_memory(p, static_cast<size_t>((last + (l.cols - 1) * l.ld + l.rows) * bytes_of(l)));
}

// D = alpha op(A) op(B) + beta C, column-major as cuBLASLt stores it (defined below the C interface).
// split: the length of the K slices whose sums are added in the output's type (0: none).
void multiply(const Desc& d, const Layout& a, const Layout& b, const Layout& c, const Layout& dl, uint64_t m, uint64_t n, uint64_t k,
              uint64_t split, float al, const void* A, const void* B, float be, const void* C, void* D);

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasLtGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_(emulated error)";
  }
}
const char* cublasLtGetStatusString(cublasStatus_t s) { return cublasLtGetStatusName(s); }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
  const bool supported = compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_FAST_TF32;  // all the backend uses
  if (!supported || scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  *d = new cublasLtMatmulDescOpaque_t{};
  put(*d, Desc{compute, scale});
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t size) {
  Desc desc = get<Desc>(d);
  if (attr == CUBLASLT_MATMUL_DESC_TRANSA || attr == CUBLASLT_MATMUL_DESC_TRANSB) {
    if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    int32_t op;
    std::memcpy(&op, buf, sizeof(op));
    if (op != CUBLAS_OP_N && op != CUBLAS_OP_T) return CUBLAS_STATUS_NOT_SUPPORTED;
    (attr == CUBLASLT_MATMUL_DESC_TRANSA ? desc.trans_a : desc.trans_b) = static_cast<cublasOperation_t>(op);
    put(d, desc);
    return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld) {
  if (type != CUDA_R_32F && type != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (ld < static_cast<int64_t>(rows) || rows == 0 || cols == 0) return CUBLAS_STATUS_INVALID_VALUE;  // column-major: ld >= rows
  *l = new cublasLtMatrixLayoutOpaque_t{};
  put(*l, Layout{type, rows, cols, ld});
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const void* buf, size_t size) {
  Layout layout = get<Layout>(l);
  if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT) {
    if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&layout.batch, buf, sizeof(int32_t));
    if (layout.batch < 1) return CUBLAS_STATUS_INVALID_VALUE;
  } else if (attr == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET) {
    if (size != sizeof(int64_t)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&layout.stride, buf, sizeof(int64_t));
  } else {
    return CUBLAS_STATUS_NOT_SUPPORTED;  // all the backend sets
  }
  put(l, layout);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = new cublasLtMatmulPreferenceOpaque_t{};
  put(*p, kDefaultPreference);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) return size == sizeof(uint64_t) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
  Preference al = get<Preference>(p);
  if (attr == CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK) {
    if (size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&al.reductions, buf, sizeof(uint32_t));
    put(p, al);
    return CUBLAS_STATUS_SUCCESS;
  }
  uint32_t* field = attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES   ? &al.a
                    : attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES ? &al.b
                    : attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES ? &al.c
                    : attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES ? &al.d
                                                                         : nullptr;
  if (!field) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(field, buf, sizeof(uint32_t));
  put(p, al);
  return CUBLAS_STATUS_SUCCESS;
}

namespace {
// Checks what cuBLASLt checks; returns m, n, k of D[m,n] = op(A)[m,k] op(B)[k,n].
cublasStatus_t shapes(const Desc& d, const Layout& a, const Layout& b, const Layout& c, const Layout& dl, uint64_t& m, uint64_t& n, uint64_t& k) {
  m = d.trans_a == CUBLAS_OP_N ? a.rows : a.cols;
  k = d.trans_a == CUBLAS_OP_N ? a.cols : a.rows;
  const uint64_t kb = d.trans_b == CUBLAS_OP_N ? b.rows : b.cols;
  n = d.trans_b == CUBLAS_OP_N ? b.cols : b.rows;
  if (kb != k || c.rows != m || c.cols != n || dl.rows != m || dl.cols != n) return CUBLAS_STATUS_INVALID_VALUE;
  if (a.batch != dl.batch || b.batch != dl.batch || c.batch != dl.batch) return CUBLAS_STATUS_INVALID_VALUE;
  if (a.type != b.type || c.type != dl.type) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (a.type == CUDA_R_32F && c.type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (d.compute == CUBLAS_COMPUTE_32F_FAST_TF32 && a.type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;  // TF32 takes FP32 operands
  return CUBLAS_STATUS_SUCCESS;
}
}  // namespace

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                              cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D, cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* count) {
  uint64_t m, n, k;
  const cublasStatus_t s = shapes(get<Desc>(op), get<Layout>(A), get<Layout>(B), get<Layout>(C), get<Layout>(D), m, n, k);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  *count = requested > 0 ? 1 : 0;
  if (requested > 0) {
    std::memset(&results[0], 0, sizeof(results[0]));
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].workspaceSize = 0;
    results[0].wavesCount = 1.0f;
    const Preference al = get<Preference>(pref);
    std::memcpy(&results[0].algo, &al, sizeof(al));  // what the algorithm may rely on
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t op, const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                              const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc,
                              void* D, cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void*, size_t, cudaStream_t stream) {
  const Desc d = get<Desc>(op);
  const Layout a = get<Layout>(Adesc), b = get<Layout>(Bdesc), c = get<Layout>(Cdesc), dl = get<Layout>(Ddesc);
  uint64_t m, n, k;
  if (const cublasStatus_t s = shapes(d, a, b, c, dl, m, n, k); s != CUBLAS_STATUS_SUCCESS) return s;
  if (!on_device(A, a) || !on_device(B, b) || !on_device(D, dl) || (C != D && !on_device(C, c))) return CUBLAS_STATUS_INVALID_VALUE;
  Preference pref = kDefaultPreference;  // no algorithm: cuBLASLt's own pick, with the default preference
  if (algo) {  // pointers less aligned than the algorithm was chosen for
    std::memcpy(&pref, algo, sizeof(pref));
    auto aligned = [](const void* p, uint32_t bytes) { return bytes == 0 || reinterpret_cast<uintptr_t>(p) % bytes == 0; };
    if (!aligned(A, pref.a) || !aligned(B, pref.b) || !aligned(C, pref.c) || !aligned(D, pref.d)) return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const bool reduced_allowed = (pref.reductions & (CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE | CUBLASLT_REDUCTION_SCHEME_INPLACE)) != 0;
  const uint64_t split = reduced_allowed && dl.type != CUDA_R_32F && k >= kSplitKMin ? (k + kSplits - 1) / kSplits : 0;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  // A capturing stream records the product with the scalars' values now (cuBLASLt reads host
  // scalars when the call is made, so a graph replays the values captured) and the descriptors as
  // they are (the backend's plans outlive its graphs).
  if (cuda_emu::record_if_capturing(stream, [=] { multiply(d, a, b, c, dl, m, n, k, split, al, A, B, be, C, D); })) return CUBLAS_STATUS_SUCCESS;
  multiply(d, a, b, c, dl, m, n, k, split, al, A, B, be, C, D);
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"

namespace {
void multiply_one(const Desc& d, const Layout& a, const Layout& b, const Layout& c, const Layout& dl, uint64_t m, uint64_t n, uint64_t k,
                  uint64_t split, float al, const void* A, const void* B, float be, const void* C, void* D);
// A batch: matrix i of each operand `stride` elements after matrix i - 1.
void multiply(const Desc& d, const Layout& a, const Layout& b, const Layout& c, const Layout& dl, uint64_t m, uint64_t n, uint64_t k,
              uint64_t split, float al, const void* A, const void* B, float be, const void* C, void* D) {
  auto at = [](const void* p, const Layout& l, int64_t i) { return static_cast<const char*>(p) + i * l.stride * bytes_of(l); };
  for (int64_t i = 0; i < dl.batch; ++i)
    multiply_one(d, a, b, c, dl, m, n, k, split, al, at(A, a, i), at(B, b, i), be, at(C, c, i), const_cast<char*>(at(D, dl, i)));
}
// v rounded to `type` (a 16-bit output's partial sums, split-K)
float rounded(cudaDataType type, float v) {
  alignas(4) unsigned char cell[4];
  store(cell, type, 0, v);
  return load(cell, type, 0);
}
void multiply_one(const Desc& d, const Layout& a, const Layout& b, const Layout& c, const Layout& dl, uint64_t m, uint64_t n, uint64_t k,
                  uint64_t split, float al, const void* A, const void* B, float be, const void* C, void* D) {
  const bool ta = d.trans_a == CUBLAS_OP_T, tb = d.trans_b == CUBLAS_OP_T, tf32 = d.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  auto operand = [tf32](const void* p, const Layout& l, int64_t i) { return tf32 ? tf32_operand(load(p, l.type, i)) : load(p, l.type, i); };
  std::vector<float> column(m), total(split ? m : 0);  // total: the running split-K sum
  for (uint64_t j = 0; j < n; ++j) {
    std::fill(column.begin(), column.end(), 0.0f);
    std::fill(total.begin(), total.end(), 0.0f);
    for (uint64_t p = 0; p < k; ++p) {
      const float bv = operand(B, b, tb ? static_cast<int64_t>(p * b.ld + j) : static_cast<int64_t>(j * b.ld + p));
      for (uint64_t i = 0; i < m; ++i) column[i] += operand(A, a, ta ? static_cast<int64_t>(i * a.ld + p) : static_cast<int64_t>(p * a.ld + i)) * bv;
      if (split && ((p + 1) % split == 0 || p + 1 == k)) {  // a slice's sum into the total, in the output's type
        for (uint64_t i = 0; i < m; ++i) total[i] = rounded(dl.type, total[i] + column[i]), column[i] = 0.0f;
      }
    }
    for (uint64_t i = 0; i < m; ++i) {
      const float prior = be != 0.0f ? be * load(C, c.type, static_cast<int64_t>(j * c.ld + i)) : 0.0f;  // beta = 0: C not read
      store(D, dl.type, static_cast<int64_t>(j * dl.ld + i), al * (split ? total[i] : column[i]) + prior);
    }
  }
}
}  // namespace
