// The parameter and gradient arenas (param_store.h).
#include "multinorm/param_store.h"

#include <algorithm>

#include "multinorm/error.h"

namespace multinorm {

namespace {
bool padded(const std::vector<TensorSpec>& specs) {
  return std::any_of(specs.begin(), specs.end(), [](const TensorSpec& t) { return t.arena_offset != t.offset || t.arena_ld != 0; });
}
// Calls fn(arena element, logical element, count) for each run a tensor keeps in both orders: a
// dense tensor whole, a padded one row by row; in table order, so logical <= arena throughout.
template <class Fn>
void for_each_run(const std::vector<TensorSpec>& specs, Fn fn) {
  for (const auto& t : specs) {
    if (!t.arena_ld) {
      fn(t.arena_offset, t.offset, t.numel());
      continue;
    }
    for (int64_t r = 0; r < t.rows(); ++r) fn(t.arena_offset + r * t.arena_ld, t.offset + r * t.cols(), t.cols());
  }
}
}  // namespace

ParamStore::ParamStore(Backend& backend, std::vector<TensorSpec> tensors, DType dtype, DType grad_dtype, ArenaRanges ready_order)
    : be_(backend), specs_(std::move(tensors)), dtype_(dtype), grad_dtype_(grad_dtype), ready_order_(std::move(ready_order)) {
  if (grad_dtype_ != dtype_ && !(dtype_ == DType::BF16 && grad_dtype_ == DType::F32))
    throw Error(std::string("model: ") + dtype_name(grad_dtype_) + " gradients of " + dtype_name(dtype_) +
                " weights are not supported (FP32 gradients go with BF16 weights)");
  nparams_ = count_parameters(specs_);
  arena_elements_ = multinorm::arena_elements(specs_);
  if (padded(specs_) && !be_.activation_layout(dtype_).pad_mlp_rows)
    throw Error(std::string("model: a tensor table with padded rows for the ") + be_.name() + " backend, which takes dense ones (layout_arena)");
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
  // Stage FP32 in a backend buffer in the arena's layout (a padded tensor row by row, its padding
  // zeroed: no host copy of the arena) and convert there (RNE to bf16).
  void* staging = be_.allocate(arena_elements_ * 4);
  if (padded(specs_)) {
    be_.zero(Buf{staging, DType::F32}, arena_elements_);
    for_each_run(specs_, [&](int64_t arena, int64_t logical, int64_t n) {
      be_.to_device(static_cast<float*>(staging) + arena, values.data() + logical, n * 4);
    });
  } else {
    be_.to_device(staging, values.data(), arena_elements_ * 4);
  }
  be_.convert(params(), Buf{staging, DType::F32}, arena_elements_);
  be_.release(staging);
}

std::vector<float> ParamStore::arena_to_host(Buf arena) const {
  std::vector<float> out(static_cast<size_t>(arena_elements_));
  void* staging = be_.allocate(arena_elements_ * 4);
  be_.convert(Buf{staging, DType::F32}, arena, arena_elements_);
  be_.to_host(out.data(), staging, arena_elements_ * 4);
  be_.release(staging);
  if (padded(specs_)) {  // the padding squeezed out in place: each run moves down (logical <= arena)
    for_each_run(specs_, [&](int64_t arena, int64_t logical, int64_t n) { std::copy(out.begin() + arena, out.begin() + arena + n, out.begin() + logical); });
    out.resize(static_cast<size_t>(nparams_));
  }
  return out;
}

std::vector<float> ParamStore::params_to_host() const { return arena_to_host(params()); }
std::vector<float> ParamStore::grads_to_host() const { return arena_to_host(grads()); }

void ParamStore::zero_grads() {
  be_.zero(grads(), arena_elements_);
  be_.zero({loss_totals_, DType::F32}, sizeof(LossTotals) / 4);
}

}  // namespace multinorm
