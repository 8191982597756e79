// The parameter and gradient arenas (param_store.h).
#include "multinorm/param_store.h"

#include "multinorm/error.h"

namespace multinorm {

ParamStore::ParamStore(Backend& backend, std::vector<TensorSpec> tensors, DType dtype, DType grad_dtype, ArenaRanges ready_order)
    : be_(backend), specs_(std::move(tensors)), dtype_(dtype), grad_dtype_(grad_dtype), ready_order_(std::move(ready_order)) {
  if (grad_dtype_ != dtype_ && !(dtype_ == DType::BF16 && grad_dtype_ == DType::F32))
    throw Error(std::string("model: ") + dtype_name(grad_dtype_) + " gradients of " + dtype_name(dtype_) +
                " weights are not supported (FP32 gradients go with BF16 weights)");
  nparams_ = count_parameters(specs_);
  params_ = be_.allocate(nparams_ * dtype_bytes(dtype_));
  grads_ = be_.allocate(nparams_ * dtype_bytes(grad_dtype_));
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
  // Stage FP32 in a backend buffer and convert there (RNE to bf16).
  void* staging = be_.allocate(nparams_ * 4);
  be_.to_device(staging, values.data(), nparams_ * 4);
  be_.convert(params(), Buf{staging, DType::F32}, nparams_);
  be_.release(staging);
}

static std::vector<float> arena_to_host(Backend& be, Buf arena, int64_t n) {
  std::vector<float> out(n);
  void* staging = be.allocate(n * 4);
  be.convert(Buf{staging, DType::F32}, arena, n);
  be.to_host(out.data(), staging, n * 4);
  be.release(staging);
  return out;
}

std::vector<float> ParamStore::params_to_host() const { return arena_to_host(be_, params(), nparams_); }
std::vector<float> ParamStore::grads_to_host() const { return arena_to_host(be_, grads(), nparams_); }

void ParamStore::zero_grads() {
  be_.zero(grads(), nparams_);
  be_.zero({loss_totals_, DType::F32}, sizeof(LossTotals) / 4);
}

}  // namespace multinorm
