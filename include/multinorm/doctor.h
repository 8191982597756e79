// `multinorm doctor`: first contact with a GPU node, in one command. It reports the environment (the
// driver, runtime, cuBLASLt and NCCL loaded and from where, every GPU), runs every Backend op and
// optimizer kernel of the CUDA backend against the CPU backend at a model's shapes (FP32 and BF16,
// the test suite's tolerances), one training update per optimizer on a reduced model on both
// backends, a checkpoint round trip across backends, NCCL across the node's GPUs when there are
// several, and a timed training step (tokens/s, TFLOP/s, MFU against the GPU's BF16 dense peak, the
// slowest kernels). Exits 1 when any check fails, naming the op and the kernels it launched; writes
// everything to a JSON report.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace multinorm {

struct DoctorOptions {
  // Model configs by name (configs/models/<name>.json, from the source tree or a bundle's
  // share/multinorm/configs) or path; "largest": the largest model whose training step fits the GPU.
  std::vector<std::string> models{"llama_60m"};
  int64_t batch = 4, seq = 256;  // the micro-batch of the op shapes and of the timed step
  int64_t step_batch = 0;        // the timed step's micro-batch instead (0: batch): the op checks' CPU side stays small
  int steps = 5;                 // timed steps
  int warmup = 2;                // untimed steps first
  bool bench = true;             // the timed step
  // Sections to run (op, optimizer, update, checkpoint); all when empty.
  std::vector<std::string> only;
  std::string report = "doctor.json";
  int threads = 0;  // CPU backend threads (0: all cores)
};

// Runs every check and writes the report; returns the process exit code (0: all passed).
int run_doctor(const DoctorOptions& o);

// Graphs captured and replayed over some timed steps: the micro-batch's (the model's cache) and the update's.
struct GraphCounts {
  int64_t micro_batch_captures = 0, micro_batch_replays = 0, update_captures = 0, update_replays = 0;
  GraphCounts operator-(const GraphCounts& b) const {
    return {micro_batch_captures - b.micro_batch_captures, micro_batch_replays - b.micro_batch_replays, update_captures - b.update_captures,
            update_replays - b.update_replays};
  }
};
// The timed step's warning when its graphed steps ran slower than its eager ones (seconds a step:
// eager, graphed as the trainer pipelines them, graphed with each update waited for at once), naming
// which of the three the figures point at: a capture within the timed steps, the replays, or the pipeline.
std::string graphs_slower_warning(double eager_s, double graphed_s, double graphed_waited_s, const GraphCounts& g, int steps);

// The BF16 dense tensor-core peak of a GPU by its name, in TFLOP/s; 0 when unknown.
double bf16_dense_peak_tflops(const std::string& device_name);

}  // namespace multinorm
