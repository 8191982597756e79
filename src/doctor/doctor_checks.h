// The checks of `multinorm doctor` (include/multinorm/doctor.h): the CUDA backend against the CPU
// backend at one model's shapes.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "multinorm/backend.h"
#include "multinorm/model_config.h"
#include "multinorm/run_config.h"

namespace multinorm {

struct DoctorCheck {
  std::string section;  // op, optimizer, update, checkpoint
  std::string name, dtype, shape;
  double error = 0;  // max |cuda - cpu| / max |cpu| over the outputs (0 for bit-exact checks that held)
  double bound = 0;
  bool ok = true;
  std::string failure;               // what went wrong (an exception, NaN, which output)
  std::vector<std::string> kernels;  // what the CUDA backend launched for it (its profile)
  struct Output {
    std::string label;
    double error, bound;
  };
  std::vector<Output> outputs;  // each output's error and bound
};

// A run config for the doctor's model: one micro-batch of B x T per update, a constant schedule,
// `optimizer` with momentum 0.9 and clipping at 0.5, weights and states in `precision`.
RunConfig doctor_run(const ModelConfig& m, const std::string& optimizer, const std::string& precision, int64_t B, int64_t T);

class DoctorChecks {
 public:
  // Shapes: the model's widths, a micro-batch of B sequences of T tokens.
  DoctorChecks(Backend& cpu, Backend& gpu, const ModelConfig& cfg, int64_t B, int64_t T);
  // Every section, or those named in `only` (op, optimizer, update, checkpoint).
  void run_all(const std::vector<std::string>& only = {});
  const std::vector<DoctorCheck>& results() const { return results_; }

  // The parts of run_all.
  void gemm_ops(DType t);
  void ops(DType t);
  void optimizers();
  void training_updates();
  void checkpoint_round_trip();

 private:
  // One output of a check: what the CUDA backend produced and what the CPU did.
  struct Output {
    std::string label;
    std::vector<float> gpu, cpu;
    double bound = -1;  // this output's own bound (else the check's)
  };
  // Runs body (which calls both backends and returns their outputs), compares the outputs against
  // `bound`, records the kernels the CUDA calls launched, and prints a line.
  void check(const std::string& section, const std::string& name, DType t, const std::string& shape, double bound,
             const std::function<std::vector<Output>()>& body);
  void print(const DoctorCheck& c) const;

  Backend &cpu_, &gpu_;
  ModelConfig cfg_;
  int64_t B_, T_;
  std::vector<DoctorCheck> results_;
};

}  // namespace multinorm
