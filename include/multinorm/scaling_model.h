// Data parallelism on paper: what N GPUs add to the roofline step of `bench model --predict`
// (kernel_costs.h). The buckets, the moment each one starts, the staging slots BF16 gradients are
// summed in and the shard plan are the trainer's own (GradientSync in data_parallel.cpp,
// plan_shards); the collectives are NCCL rings over NVLink inside an 8-GPU node and InfiniBand
// between nodes, at the bandwidths and latencies NCCL reaches (figures and sources in
// src/bench/scaling_model.cpp). A prediction, not a measurement.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "multinorm/kernel_costs.h"
#include "multinorm/run_config.h"

namespace multinorm {

// The links one GPU's collectives cross, as NCCL uses them.
struct Interconnect {
  std::string gpu;  // "a100", "h100"
  int gpus_per_node = 8;
  double nvlink_all_reduce_gbs = 0;  // an all-reduce's bus bandwidth inside a node (nccl-tests' busbw)
  double nvlink_ring_gbs = 0;        // a ring's or chain's (reduce, broadcast) inside a node
  double nic_gbs = 0;                // what NCCL moves through one GPU's NIC between nodes, GB/s
  double nic_gbits = 0;              // that NIC's line rate, Gb/s (for the printout)
  double base_latency_us = 0, nvlink_step_us = 0, net_step_us = 0;  // NCCL's ring latency model
};
// "a100" (DGX A100: NVLink3, HDR 200 Gb/s a GPU), "h100" or "h200" (DGX H100/H200: NVLink4, NDR
// 400 Gb/s a GPU); nullptr for another name.
const Interconnect* find_interconnect(const std::string& gpu);

enum class Collective { AllReduce, Reduce, Broadcast };
int nodes_of(int ranks, const Interconnect& ic);
// One call's bus bandwidth over `ranks` GPUs (whole nodes past one node): the NVLink figure inside a
// node; across nodes the slower of NVLink's ring figure and a node's NICs together (NCCL spreads a
// ring's channels over all of a node's NICs, so each NIC carries 1/gpus_per_node of a rank's traffic).
double bus_bandwidth_gbs(Collective c, int ranks, const Interconnect& ic);
// NCCL's per-call ring latency: a base plus one latency a step, 2(N-1) steps for an all-reduce and
// N-1 for a reduce or broadcast (a chain), of which the node-crossing ones at the network's latency.
double collective_latency_s(Collective c, int ranks, const Interconnect& ic);
// One call on `bytes`: latency + factor x bytes / bus bandwidth, the factor 2(N-1)/N for an
// all-reduce and 1 for a reduce or a broadcast (nccl-tests' PERFORMANCE.md). 0 on one rank.
double collective_seconds(Collective c, double bytes, int ranks, const Interconnect& ic);

// One gradient bucket as GradientSync issues it: the gradient_ready_order() ranges it holds and the
// FP32 elements of its collectives (one all-reduce, or one reduce to each run of one owner's tensors).
struct BucketPlan {
  int ranges = 0;
  int64_t elements = 0;
  std::vector<int64_t> calls;
};

// One rank's update as the timeline needs it, in seconds on the predicted GPU.
struct DataParallelStep {
  // The last micro-batch's compute stream between the backward pass's gradients_ready() reports:
  // [0] from the micro-batch's start (forward, loss head and the head's backward) to the first report.
  std::vector<double> ready_s;
  double tail_s = 0;            // after the last report (the micro-batch's loss into the update's totals)
  int64_t accumulation = 1;     // micro-batches per update on each rank; only the last one overlaps
  std::vector<BucketPlan> buckets;
  bool sharded = false, overlap = true;
  int64_t staging_slots = 0;    // FP32 slots BF16 gradients are summed in (0: FP32 gradients, no staging)
  double widen_s_per_element = 0, narrow_s_per_element = 0;  // BF16 -> FP32 slot, and back
  double update_s = 0;          // the whole model's optimizer update on one GPU
  double update_share = 1;      // the busiest rank's share of it under the shard plan (1: replicated)
  std::vector<int64_t> gather_bytes;  // sharded: each broadcast of new weights (one per owner run)
  std::vector<int64_t> statistics_bytes;  // the small all-reduces before the update (loss totals, sums of squares)
  double micro_batch_s() const;
};

struct ScalingPrediction {
  int ranks = 1, nodes = 1, collectives = 0;  // collectives: calls per update
  double step_1_s = 0;       // the same per-GPU work on one GPU: its micro-batches and the whole update
  double step_s = 0;         // one update on `ranks` GPUs
  double compute_s = 0;      // of which the compute stream's own work: micro-batches, staging, the busiest rank's update
  double staging_s = 0;      // of which BF16 gradients widened into their FP32 slots and narrowed back
  double exposed_s = 0;      // step_s - compute_s: the communication nothing hid
  double reduction_s = 0;    // the gradient collectives back to back (all of it exposed without overlap)
  double latency_s = 0;      // of which the calls' latency
  double last_bucket_s = 0;  // the last bucket's collectives (nothing left to hide them under)
  double gather_s = 0;       // sharded: the broadcasts of new weights after the update (exposed)
  double efficiency() const { return step_1_s / step_s; }
};
// The update on `ranks` GPUs as the trainer runs it: buckets start in order as the last micro-batch's
// backward pass finishes them (all at its end without overlap), one after another on the collective
// stream; with S staging slots bucket i waits for bucket i - S's collective before it is widened;
// then the wait for the last one, the statistics, the busiest rank's update and the weight broadcasts.
ScalingPrediction predict_data_parallel(const DataParallelStep& step, int ranks, const Interconnect& ic);

// The step of `run`'s model at micro-batch B x T on `peak`: the kernels between the backward pass's
// reports recorded from the model's own code (the cost recorder with a gradient listener), the update
// from the optimizer's, the buckets from gradient_buckets() and the owners from plan_shards() for
// `ranks` ranks, as the trainer builds them (one micro-batch per update).
DataParallelStep record_data_parallel_step(const RunConfig& run, DType dtype, int64_t B, int64_t T, int ranks,
                                           const DevicePeak& peak, const RooflineAssumptions& a);

}  // namespace multinorm
