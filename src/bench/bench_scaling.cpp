// `multinorm bench model --predict a100|h100 --ranks N`: the roofline step of one GPU with what data
// parallelism adds to it on 1, 2, 4, ... N GPUs (include/multinorm/scaling_model.h), and the
// predicted scaling efficiency: the step on one GPU over the step on N, the same micro-batch a GPU.
#include <cstdio>

#include "multinorm/bench.h"
#include "multinorm/error.h"
#include "multinorm/json_file.h"
#include "multinorm/scaling_model.h"

namespace multinorm {

namespace {

// llm-foundry's measurement the prediction is read against: MPT-1B at sequence length 2048 on A100
// 40 GB with 1600 Gb/s a node (8 x 200 Gb/s RoCE), FSDP: 19,271 tokens/s a GPU on 8 GPUs, 18,647 on
// 128 (github.com/mosaicml/llm-foundry, scripts/train/benchmarking/README.md).
constexpr const char* kFoundry = "llm-foundry measured 96.8% from 8 to 128 A100s (MPT-1B, FSDP, 8 x 200 Gb/s a node)";

// 1, 2, 4, ... below `ranks`, then `ranks`: past one node only whole nodes.
std::vector<int> rank_counts(int ranks, const Interconnect& ic) {
  if (ranks < 1) throw Error("bench model --ranks: at least 1 GPU, got " + std::to_string(ranks));
  if (ranks > ic.gpus_per_node && ranks % ic.gpus_per_node != 0)
    throw Error("bench model --ranks " + std::to_string(ranks) + ": past one node, whole nodes of " + std::to_string(ic.gpus_per_node) +
                " GPUs (a multiple of " + std::to_string(ic.gpus_per_node) + ")");
  std::vector<int> counts;
  for (int n = 1; n < ranks; n *= 2) counts.push_back(n);
  counts.push_back(ranks);
  return counts;
}

void print_header(const RunConfig& run, const Interconnect& ic, const DataParallelStep& s, int ranks) {
  std::printf("  data parallelism on paper, up to %d x %s, %d a node: NCCL rings at %.0f GB/s of all-reduce bus bandwidth over NVLink\n"
              "  (%.0f for a reduce or broadcast), %d x %.0f Gb/s NICs at %.0f GB/s each between nodes; %.1f us a call + %.1f us a step over\n"
              "  NVLink, %.1f over the network (sources: src/bench/scaling_model.cpp)\n",
              ranks, ic.gpu.c_str(), ic.gpus_per_node, ic.nvlink_all_reduce_gbs, ic.nvlink_ring_gbs, ic.gpus_per_node, ic.nic_gbits, ic.nic_gbs,
              ic.base_latency_us, ic.nvlink_step_us, ic.net_step_us);
  std::printf("  %zu gradient buckets (parallel.bucket_mb %.0f MiB, FP32), %s; optimizer %s; one micro-batch an update a GPU\n", s.buckets.size(),
              run.parallel.bucket_mb, s.overlap ? "each started as the backward pass finishes it" : "all started after the backward pass",
              run.parallel.shard_optimizer ? "sharded: a reduce to each owner's run of tensors, then its broadcast of the new weights"
                                           : "replicated: an all-reduce a bucket");
  std::printf("    %6s %5s %6s %10s %10s %12s %10s %10s %10s %10s %10s\n", "GPUs", "nodes", "calls", "1 GPU ms", "staging ms", "reduction ms",
              "latency ms", "exposed ms", "gather ms", "step ms", "efficiency");
}

void print_row(const ScalingPrediction& p) {
  std::printf("    %6d %5d %6d %10.3f %10.3f %12.3f %10.3f %10.3f %10.3f %10.3f %9.1f%%\n", p.ranks, p.nodes, p.collectives, p.step_1_s * 1e3,
              p.staging_s * 1e3, p.reduction_s * 1e3, p.latency_s * 1e3, p.exposed_s * 1e3, p.gather_s * 1e3, p.step_s * 1e3,
              100.0 * p.efficiency());
}

json row_json(const ScalingPrediction& p) {
  return {{"ranks", p.ranks}, {"nodes", p.nodes}, {"collectives", p.collectives}, {"step_1_gpu_s", p.step_1_s}, {"step_s", p.step_s},
          {"compute_s", p.compute_s}, {"staging_s", p.staging_s}, {"reduction_s", p.reduction_s}, {"latency_s", p.latency_s}, {"exposed_s", p.exposed_s},
          {"last_bucket_s", p.last_bucket_s}, {"gather_s", p.gather_s}, {"efficiency", p.efficiency()}};
}

json interconnect_json(const Interconnect& ic) {
  return {{"gpu", ic.gpu}, {"gpus_per_node", ic.gpus_per_node}, {"nvlink_all_reduce_gbs", ic.nvlink_all_reduce_gbs},
          {"nvlink_ring_gbs", ic.nvlink_ring_gbs}, {"nic_gbs", ic.nic_gbs}, {"nic_gbits", ic.nic_gbits},
          {"base_latency_us", ic.base_latency_us}, {"nvlink_step_us", ic.nvlink_step_us}, {"net_step_us", ic.net_step_us}};
}

}  // namespace

void bench_scaling_predict(const ModelBenchOptions& o, const RunConfig& run, const DevicePeak& peak, const RooflineAssumptions& a) {
  const Interconnect* ic = find_interconnect(peak.name);
  if (!ic) throw Error("bench model --ranks: no interconnect figures for '" + peak.name + "'");
  const DType dt = parse_dtype(o.precision);
  std::vector<ScalingPrediction> rows;
  DataParallelStep step;  // on the most GPUs: the header's buckets
  for (int n : rank_counts(o.ranks, *ic)) {
    step = record_data_parallel_step(run, dt, o.batch, o.seq, n, peak, a);
    rows.push_back(predict_data_parallel(step, n, *ic));
  }
  if (o.json) {
    json out = {{"model", run.model.name}, {"run", run.name}, {"gpu", peak.name}, {"batch", o.batch}, {"seq", o.seq}, {"precision", o.precision},
                {"bucket_mb", run.parallel.bucket_mb}, {"buckets", step.buckets.size()}, {"overlap", run.parallel.overlap},
                {"shard_optimizer", run.parallel.shard_optimizer}, {"interconnect", interconnect_json(*ic)}, {"scaling", json::array()}};
    for (const ScalingPrediction& p : rows) out["scaling"].push_back(row_json(p));
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  print_header(run, *ic, step, o.ranks);
  for (const ScalingPrediction& p : rows) print_row(p);
  std::printf("  staging: BF16 gradients into FP32 slots and back; reduction: the gradient collectives back to back; latency: every call's;\n"
              "  exposed: the step less the compute stream's own work (micro-batch, staging, the busiest rank's update); gather: the\n"
              "  weight broadcasts after a sharded update (in exposed). A prediction from the roofline, not a measurement;\n  %s\n", kFoundry);
}

}  // namespace multinorm
