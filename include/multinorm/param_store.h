// The trained parameters and what one update accumulates for them, in backend memory: the tensor
// table (model_spec.h), the parameter arena, the gradient arena and the update's loss totals. The
// model owns one and works in it (its forward pass reads the weights; its backward pass adds to the
// gradients, tells the gradient listener which ranges are final, and adds its losses to the totals);
// the optimizer, data parallelism's gradient sync and checkpoints take the store, not the model.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "multinorm/backend.h"
#include "multinorm/model_spec.h"

namespace multinorm {

// Told by the backward pass when a range [begin, end) of the gradient arena (elements) is final for
// the micro-batch, in the order ParamStore::gradient_ready_order() lists, and given progress() calls
// between the backward pass's ops: data parallelism starts reducing a layer's gradients while the
// layers below it are still being differentiated.
class GradientListener {
 public:
  virtual ~GradientListener() = default;
  virtual void gradients_ready(int64_t begin, int64_t end) = 0;
  virtual void progress() = 0;
};

// Arena ranges [begin, end), in elements (TensorSpec::arena_offset's).
using ArenaRanges = std::vector<std::pair<int64_t, int64_t>>;

class ParamStore {
 public:
  // `tensors`: laid out in the arenas (layout_arena; llama_parameters' dense layout is one).
  // `ready_order`: the ranges the backward pass finishes, in its order; they tile the arena.
  // `grad_dtype`: the parameters' dtype, or FP32 gradients of BF16 weights.
  ParamStore(Backend& backend, std::vector<TensorSpec> tensors, DType dtype, DType grad_dtype, ArenaRanges ready_order);
  ~ParamStore();
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  Backend& backend() const { return be_; }
  const std::vector<TensorSpec>& tensors() const { return specs_; }
  const TensorSpec& tensor(const std::string& name) const;
  DType dtype() const { return dtype_; }
  DType grad_dtype() const { return grad_dtype_; }
  int64_t num_params() const { return nparams_; }
  // The arenas' length in elements: num_params() and any padding of rows (TensorSpec::arena_ld),
  // which holds zeros. What runs over a whole arena or a range of it (sums of squares, clipping,
  // reductions, broadcasts) runs over these.
  int64_t arena_elements() const { return arena_elements_; }
  Buf params() const { return {params_, dtype_}; }
  Buf grads() const { return {grads_, grad_dtype_}; }
  // A tensor's weights and gradients, with its rows' stride where they are padded (Buf::ld).
  Buf param(const TensorSpec& t) const { return {params().at(t.arena_offset).ptr, dtype_, t.arena_ld}; }
  Buf grad(const TensorSpec& t) const { return {grads().at(t.arena_offset).ptr, grad_dtype_, t.arena_ld}; }
  // The update's loss totals, summed by the micro-batches' backward passes (the optimizer's
  // statistics read them).
  LossTotals* update_loss_totals() const { return loss_totals_; }

  // Parameters or gradients as FP32 on the host, in the tensors' logical order (TensorSpec::offset:
  // no padding), and back (RNE to BF16; the padding zeros).
  std::vector<float> params_to_host() const;
  std::vector<float> grads_to_host() const;
  void params_from_host(const std::vector<float>& values);
  // A new update starts: the gradients and the update's loss totals are zeroed.
  void zero_grads();

  const ArenaRanges& gradient_ready_order() const { return ready_order_; }
  void set_gradient_listener(GradientListener* listener) { listener_ = listener; }
  GradientListener* gradient_listener() const { return listener_; }

 private:
  std::vector<float> arena_to_host(Buf arena) const;

  Backend& be_;
  std::vector<TensorSpec> specs_;
  DType dtype_, grad_dtype_;
  int64_t nparams_ = 0, arena_elements_ = 0;
  ArenaRanges ready_order_;
  void* params_ = nullptr;
  void* grads_ = nullptr;
  LossTotals* loss_totals_ = nullptr;
  GradientListener* listener_ = nullptr;
};

}  // namespace multinorm
