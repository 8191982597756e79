// Data parallelism on paper (include/multinorm/scaling_model.h): NCCL's collectives on the links of a
// DGX A100 or DGX H100 node and the InfiniBand between nodes, and the trainer's overlap of the gradient
// reduction with the backward pass (src/parallel/data_parallel.cpp), step by step.
#include "multinorm/scaling_model.h"

#include <algorithm>
#include <numeric>

#include "multinorm/data_parallel.h"
#include "multinorm/error.h"
#include "multinorm/llama_model.h"
#include "multinorm/optimizer.h"
#include "multinorm/param_groups.h"
#include "multinorm/shard_plan.h"
#include "multinorm/update_scalars.h"

namespace multinorm {

// Bandwidths are what NCCL reaches, not line rates (GB/s = 1e9 B/s):
// - A100 SXM4, NVLink3: 12 links, 300 GB/s each way (600 GB/s total). NCCL's rings reach ~230 GB/s of
//   bus bandwidth on 8 A100s: each link carries ~20 GB/s of payload from the SMs, 240 GB/s for 12, and
//   other limits leave ~230 (NVIDIA's answer in github.com/NVIDIA/nccl-tests/issues/149).
// - H100 SXM5, NVLink4: 18 links, 450 GB/s each way (900 GB/s total). Rings (reduce, broadcast, or
//   NCCL_ALGO=RING) reach ~370 GB/s after ~20% protocol overhead; the all-reduce runs on NVLink SHARP
//   and peaks near 480 GB/s of bus bandwidth on 8 GPUs (github.com/NVIDIA/nccl-tests/issues/212;
//   476 GB/s measured in github.com/NVIDIA/nccl-tests/issues/290).
// - Between nodes, one NIC a GPU. DGX A100: 8 ConnectX-6 HDR at 200 Gb/s, the 200 Gb/s a GPU;
//   NVIDIA measures 192 GB/s of all-reduce bus bandwidth between DGX A100s over the eight, 24 GB/s a
//   NIC (github.com/NVIDIA/nccl/issues/812). DGX H100: 8 ConnectX-7 NDR at 400 Gb/s, what H100
//   clusters are built with (the 200 Gb/s would put three times an A100's FLOPs behind an
//   A100's link); NCCL moves 46-48 GB/s through each (github.com/NVIDIA/nccl-tests/issues/290): 46.
// - Across nodes a ring's channels go through all of a node's NICs, so its bus bandwidth is the
//   node's NICs together, 8 x 24 = 192 GB/s on DGX A100s (what NVIDIA measures), not one NIC's.
// Latency: NCCL's own tuning model for rings with the Simple protocol (large messages), in
// src/graph/tuning.cc of github.com/NVIDIA/nccl: 8.4 us a call, 3.4 us a step over NVLink, 14 us a
// step over the network.
const Interconnect* find_interconnect(const std::string& gpu) {
  static const Interconnect links[] = {
      {"a100", 8, 230.0, 230.0, 24.0, 200.0, 8.4, 3.4, 14.0},
      {"h100", 8, 480.0, 370.0, 46.0, 400.0, 8.4, 3.4, 14.0},
      {"h200", 8, 480.0, 370.0, 46.0, 400.0, 8.4, 3.4, 14.0},  // DGX H200: the same NVLink4 and NICs as DGX H100
  };
  for (const Interconnect& l : links)
    if (l.gpu == gpu) return &l;
  return nullptr;
}

int nodes_of(int ranks, const Interconnect& ic) { return (ranks + ic.gpus_per_node - 1) / ic.gpus_per_node; }

double bus_bandwidth_gbs(Collective c, int ranks, const Interconnect& ic) {
  if (ranks <= ic.gpus_per_node) return c == Collective::AllReduce ? ic.nvlink_all_reduce_gbs : ic.nvlink_ring_gbs;
  return std::min(ic.nvlink_ring_gbs, ic.gpus_per_node * ic.nic_gbs);
}

double collective_latency_s(Collective c, int ranks, const Interconnect& ic) {
  if (ranks <= 1) return 0.0;
  const int nodes = nodes_of(ranks, ic);
  const int steps = c == Collective::AllReduce ? 2 * (ranks - 1) : ranks - 1;
  const int inter = c == Collective::AllReduce ? 2 * (nodes - 1) : nodes - 1;
  return 1e-6 * (ic.base_latency_us + (steps - inter) * ic.nvlink_step_us + inter * ic.net_step_us);
}

double collective_seconds(Collective c, double bytes, int ranks, const Interconnect& ic) {
  if (ranks <= 1) return 0.0;
  const double factor = c == Collective::AllReduce ? 2.0 * (ranks - 1) / ranks : 1.0;
  return collective_latency_s(c, ranks, ic) + factor * bytes / (bus_bandwidth_gbs(c, ranks, ic) * 1e9);
}

double DataParallelStep::micro_batch_s() const { return std::accumulate(ready_s.begin(), ready_s.end(), tail_s); }

namespace {

// The two streams of the last micro-batch and GradientSync::finish(): the compute stream's clock, the
// collective stream's, each bucket's collectives' end, and the staging conversions queued.
struct Streams {
  double compute = 0, net = 0, staging = 0;
  std::vector<double> done;
};

// GradientSync::start(i): with S staging slots, bucket i - S is narrowed back first (the compute stream
// waits for its collectives), bucket i widened into the slot; its collectives follow on their stream.
void start_bucket(const DataParallelStep& s, const std::vector<double>& collective_s, size_t i, Streams& t) {
  const size_t slots = static_cast<size_t>(s.staging_slots);
  if (slots > 0) {
    if (i >= slots) {
      t.compute = std::max(t.compute, t.done[i - slots]);
      t.compute += s.narrow_s_per_element * s.buckets[i - slots].elements;
      t.staging += s.narrow_s_per_element * s.buckets[i - slots].elements;
    }
    t.compute += s.widen_s_per_element * s.buckets[i].elements;
    t.staging += s.widen_s_per_element * s.buckets[i].elements;
  }
  t.net = std::max(t.net, t.compute) + collective_s[i];
  t.done[i] = t.net;
}

// The backward pass's reports start the buckets in order (with overlap); the rest start after it.
Streams run_last_micro_batch(const DataParallelStep& s, const std::vector<double>& collective_s) {
  int ranges = 0;
  for (const BucketPlan& b : s.buckets) ranges += b.ranges;
  if (ranges != static_cast<int>(s.ready_s.size()))
    throw Error("data-parallel prediction: the buckets hold " + std::to_string(ranges) + " ranges, the backward pass reported " +
                std::to_string(s.ready_s.size()));
  Streams t;
  t.done.assign(s.buckets.size(), 0.0);
  size_t next = 0;
  int reported = 0, closing = s.buckets.empty() ? 0 : s.buckets[0].ranges;
  for (double seconds : s.ready_s) {
    t.compute += seconds;
    ++reported;
    while (s.overlap && next < s.buckets.size() && reported >= closing) {
      start_bucket(s, collective_s, next++, t);
      if (next < s.buckets.size()) closing += s.buckets[next].ranges;
    }
  }
  t.compute += s.tail_s;
  while (next < s.buckets.size()) start_bucket(s, collective_s, next++, t);
  return t;
}

}  // namespace

ScalingPrediction predict_data_parallel(const DataParallelStep& s, int ranks, const Interconnect& ic) {
  if (ranks < 1) throw Error("data-parallel prediction: ranks must be at least 1, got " + std::to_string(ranks));
  ScalingPrediction p;
  p.ranks = ranks;
  p.nodes = nodes_of(ranks, ic);
  const double micro_batch = s.micro_batch_s(), before = static_cast<double>(s.accumulation - 1) * micro_batch;
  p.step_1_s = p.step_s = p.compute_s = static_cast<double>(s.accumulation) * micro_batch + s.update_s;
  if (ranks == 1) return p;
  auto call = [&](Collective c, double bytes) {
    ++p.collectives;
    p.latency_s += collective_latency_s(c, ranks, ic);
    return collective_seconds(c, bytes, ranks, ic);
  };
  const Collective gradients = s.sharded ? Collective::Reduce : Collective::AllReduce;
  std::vector<double> collective_s;
  for (const BucketPlan& b : s.buckets) {
    double t = 0;
    for (int64_t elements : b.calls) t += call(gradients, 4.0 * static_cast<double>(elements));  // FP32
    collective_s.push_back(t);
  }
  p.reduction_s = std::accumulate(collective_s.begin(), collective_s.end(), 0.0);
  p.last_bucket_s = collective_s.empty() ? 0.0 : collective_s.back();
  Streams t = run_last_micro_batch(s, collective_s);
  // finish(): the host waits for every collective; the buckets still in their slots are narrowed back.
  double clock = std::max(t.compute, t.net);
  const size_t n = s.buckets.size(), slots = static_cast<size_t>(s.staging_slots);
  for (size_t i = slots > 0 && n > slots ? n - slots : 0; slots > 0 && i < n; ++i) {
    clock += s.narrow_s_per_element * s.buckets[i].elements;
    t.staging += s.narrow_s_per_element * s.buckets[i].elements;
  }
  for (int64_t bytes : s.statistics_bytes) clock += call(Collective::AllReduce, static_cast<double>(bytes));
  const double update = s.update_s * s.update_share;
  for (int64_t bytes : s.gather_bytes) p.gather_s += call(Collective::Broadcast, static_cast<double>(bytes));
  p.step_s = before + clock + update + p.gather_s;  // the next forward pass waits for the new weights
  p.staging_s = t.staging;
  p.compute_s = before + micro_batch + t.staging + update;
  p.exposed_s = p.step_s - p.compute_s;
  return p;
}

namespace {

// Roofline seconds of the kernels recorded since the last take; at each of the backward pass's reports.
class ReportClock final : public GradientListener {
 public:
  ReportClock(Backend& recorder, const DevicePeak& peak, const RooflineAssumptions& a) : rec_(recorder), peak_(peak), a_(a) {}
  double take() {
    double s = 0;
    for (const KernelCost& k : take_kernel_costs(rec_)) s += roofline_seconds(k, peak_, a_);
    return s;
  }
  void gradients_ready(int64_t, int64_t) override { reports.push_back(take()); }
  void progress() override {}
  std::vector<double> reports;

 private:
  Backend& rec_;
  const DevicePeak& peak_;
  const RooflineAssumptions& a_;
};

// The buckets and owners GradientSync and the sharded Optimizer use for `ranks` ranks.
void plan_collectives(DataParallelStep& s, const LlamaModel& model, const RunConfig& run, int ranks) {
  const ShardPlan plan = plan_shards(assign_optimizers(model.tensors(), run.optimizer), run, ranks, 0, run.parallel.shard_optimizer);
  s.sharded = plan.sharded();
  s.overlap = run.parallel.overlap;
  for (const GradientBucket& g : gradient_buckets(model.store(), static_cast<int64_t>(run.parallel.bucket_mb * 1048576.0), nullptr)) {
    BucketPlan b{g.ranges, g.end - g.begin, {}};
    if (!plan.sharded()) b.calls.push_back(b.elements);
    for (const OwnerRun& r : plan.sharded() ? owner_runs(plan, model.tensors(), g.begin, g.end) : std::vector<OwnerRun>{})
      b.calls.push_back(r.end - r.begin);
    s.buckets.push_back(b);
  }
  if (ranks > 1 && model.grad_dtype() != DType::F32)
    s.staging_slots = std::min<int64_t>(run.parallel.staging_buckets, static_cast<int64_t>(s.buckets.size()));
  s.statistics_bytes = {kLossTotalsDoubles * 8};
  if (!plan.sharded()) return;
  s.statistics_bytes.push_back(static_cast<int64_t>(model.tensors().size()) * 8);  // the sums of squares, FP64
  for (const OwnerRun& r : owner_runs(plan, model.tensors(), 0, model.store().arena_elements())) s.gather_bytes.push_back((r.end - r.begin) * dtype_bytes(model.dtype()));
  std::vector<double> load(static_cast<size_t>(ranks), 0.0);
  for (size_t i = 0; i < plan.owner.size(); ++i) load[static_cast<size_t>(plan.owner[i])] += plan.cost[i];
  const double total = std::accumulate(load.begin(), load.end(), 0.0);
  s.update_share = total > 0 ? *std::max_element(load.begin(), load.end()) / total : 1.0;
}

}  // namespace

DataParallelStep record_data_parallel_step(const RunConfig& run, DType dtype, int64_t B, int64_t T, int ranks, const DevicePeak& peak,
                                           const RooflineAssumptions& a) {
  auto rec = make_cost_recorder();
  LlamaModel model(*rec, run.model, dtype, B, T, run.precision.grads);
  Optimizer optimizer(model.store(), run);
  std::vector<int32_t> tokens(static_cast<size_t>(B * T), 0);
  const MicroBatch mb{tokens.data(), tokens.data(), nullptr, B, T};
  ReportClock clock(*rec, peak, a);
  clock.take();  // not the set-up's
  model.store().set_gradient_listener(&clock);  // as GradientSync::arm() does for the last micro-batch
  model.queue_forward_backward(mb, 1.0f);
  model.store().set_gradient_listener(nullptr);
  DataParallelStep s;
  s.ready_s = clock.reports;
  s.tail_s = clock.take();
  optimizer.step(1, 1);
  s.update_s = clock.take();
  // The staging conversions: a BF16 bucket into its FP32 slot and back, bandwidth-bound.
  const double grad_bytes = static_cast<double>(dtype_bytes(model.grad_dtype()));
  s.widen_s_per_element = s.narrow_s_per_element = roofline_seconds({"convert", CostUnit::Memory, 1, grad_bytes + 4.0, 0.0}, peak, a);
  plan_collectives(s, model, run, ranks);
  return s;
}

}  // namespace multinorm
