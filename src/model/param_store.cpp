// The parameter and gradient arenas (param_store.h).
#include "multinorm/param_store.h"

#include <algorithm>

#include "multinorm/error.h"

namespace multinorm {

namespace {
bool padded(const std::vector<TensorSpec>& specs) {
  return std::any_of(specs.begin(), specs.end(), [](const TensorSpec& t) { return t.arena_offset != t.offset || t.arena_ld != 0; });
}
// Host values from the tensors' logical order into the arenas' (zeros in the padding), and back.
std::vector<float> to_arena(const std::vector<TensorSpec>& specs, const std::vector<float>& logical, int64_t arena_elements) {
  std::vector<float> arena(static_cast<size_t>(arena_elements), 0.0f);
  for (const auto& t : specs)
    for (int64_t r = 0, cols = t.cols(), ld = t.arena_ld ? t.arena_ld : cols; r < t.numel() / cols; ++r)
      std::copy_n(logical.begin() + t.offset + r * cols, cols, arena.begin() + t.arena_offset + r * ld);
  return arena;
}
std::vector<float> from_arena(const std::vector<TensorSpec>& specs, const std::vector<float>& arena, int64_t nparams) {
  std::vector<float> logical(static_cast<size_t>(nparams));
  for (const auto& t : specs)
    for (int64_t r = 0, cols = t.cols(), ld = t.arena_ld ? t.arena_ld : cols; r < t.numel() / cols; ++r)
      std::copy_n(arena.begin() + t.arena_offset + r * ld, cols, logical.begin() + t.offset + r * cols);
  return logical;
}
}  // namespace

ParamStore::ParamStore(Backend& backend, std::vector<TensorSpec> tensors, DType dtype, DType grad_dtype, ArenaRanges ready_order)
    : be_(backend), specs_(std::move(tensors)), dtype_(dtype), grad_dtype_(grad_dtype), ready_order_(std::move(ready_order)) {
  if (grad_dtype_ != dtype_ && !(dtype_ == DType::BF16 && grad_dtype_ == DType::F32))
    throw Error(std::string("model: ") + dtype_name(grad_dtype_) + " gradients of " + dtype_name(dtype_) +
                " weights are not supported (FP32 gradients go with BF16 weights)");
  nparams_ = count_parameters(specs_);
  arena_elements_ = multinorm::arena_elements(specs_);
  params_ = be_.allocate(arena_elements_ * dtype_bytes(dtype_));
  grads_ = be_.allocate(arena_elements_ * dtype_bytes(grad_dtype_));
  loss_totals_ = static_cast<LossTotals*>(be_.allocate(sizeof(LossTotals)));
}

ParamStore::~ParamStore() {
  for (void* p : {params_, grads_, static_cast<void*>(loss_totals_)}) be_.release(p);
}

const TensorSpec& ParamStore::tensor(const std::string& name) const {
  for (const auto& t : specs_)
    if (t.name == name) return t;
  throw Error("model: no tensor named '" + name + "'");
}

void ParamStore::params_from_host(const std::vector<float>& values) {
  if (static_cast<int64_t>(values.size()) != nparams_)
    throw Error("model: expected " + std::to_string(nparams_) + " parameter values, got " + std::to_string(values.size()));
  const bool pad = padded(specs_);
  const std::vector<float> arena = pad ? to_arena(specs_, values, arena_elements_) : std::vector<float>{};
  const std::vector<float>& host = pad ? arena : values;
  // Stage FP32 in a backend buffer and convert there (RNE to bf16).
  void* staging = be_.allocate(arena_elements_ * 4);
  be_.to_device(staging, host.data(), arena_elements_ * 4);
  be_.convert(params(), Buf{staging, DType::F32}, arena_elements_);
  be_.release(staging);
}

std::vector<float> ParamStore::arena_to_host(Buf arena) const {
  std::vector<float> out(static_cast<size_t>(arena_elements_));
  void* staging = be_.allocate(arena_elements_ * 4);
  be_.convert(Buf{staging, DType::F32}, arena, arena_elements_);
  be_.to_host(out.data(), staging, arena_elements_ * 4);
  be_.release(staging);
  return padded(specs_) ? from_arena(specs_, out, nparams_) : out;
}

std::vector<float> ParamStore::params_to_host() const { return arena_to_host(params()); }
std::vector<float> ParamStore::grads_to_host() const { return arena_to_host(grads()); }

void ParamStore::zero_grads() {
  be_.zero(grads(), arena_elements_);
  be_.zero({loss_totals_, DType::F32}, sizeof(LossTotals) / 4);
}

}  // namespace multinorm
