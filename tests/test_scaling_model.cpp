// Data parallelism on paper (scaling_model.h): NCCL's ring times, the trainer's overlap of the
// gradient buckets with the backward pass, and the scaling efficiency `bench model --predict --ranks`
// prints. Hand-computed figures and the properties any such model must have; the figures themselves
// are predictions, checked against no GPU.
#include <gtest/gtest.h>

#include "multinorm/data_parallel.h"
#include "multinorm/kernel_costs.h"
#include "multinorm/llama_model.h"
#include "multinorm/run_config.h"
#include "multinorm/scaling_model.h"

using namespace multinorm;

namespace {

RunConfig run_for(const std::string& model, const std::string& optimizer = "sinkgd", bool shard = true) {
  json doc = {{"model", {{"config", std::string(MULTINORM_CONFIGS_DIR) + "/models/" + model + ".json"}}},
              {"optimizer", {{"name", optimizer}}},
              {"parallel", {{"shard_optimizer", shard}}}};
  return run_config_from_json(doc, "test");
}

// A GPU's roofline (the default fractions of peak: the properties below hold for any) and links.
struct Gpu {
  const DevicePeak* peak;
  const Interconnect* links;
  RooflineAssumptions assume;
};
Gpu gpu(const std::string& name) {
  Gpu g{find_device_peak(name), find_interconnect(name), {}};
  EXPECT_NE(g.peak, nullptr);
  EXPECT_NE(g.links, nullptr);
  return g;
}

ScalingPrediction predict(const RunConfig& run, const Gpu& g, int ranks, DataParallelStep* step = nullptr) {
  const DataParallelStep s = record_data_parallel_step(run, DType::BF16, 32, 256, ranks, *g.peak, g.assume);
  if (step) *step = s;
  return predict_data_parallel(s, ranks, *g.links);
}

// A step made by hand: `buckets` buckets of one range each, `backward_s` of compute before each report.
DataParallelStep hand_step(int buckets, double backward_s, int64_t elements) {
  DataParallelStep s;
  s.ready_s.assign(static_cast<size_t>(buckets), backward_s);
  for (int i = 0; i < buckets; ++i) s.buckets.push_back({1, elements, {elements}});
  s.update_s = 1e-3;
  return s;
}

}  // namespace

// One GPU: no collective, no exposed time, efficiency exactly 1; the step is the roofline's micro-batch
// and update (the listener's slices of the micro-batch add up to record_step_costs' whole one).
TEST(ScalingModel, OneGpuHasNoCommunication) {
  const Gpu a100 = gpu("a100");
  const RunConfig run = run_for("llama_60m");
  DataParallelStep s;
  const ScalingPrediction p = predict(run, a100, 1, &s);
  EXPECT_EQ(p.collectives, 0);
  EXPECT_EQ(p.reduction_s, 0.0);
  EXPECT_EQ(p.exposed_s, 0.0);
  EXPECT_EQ(p.gather_s, 0.0);
  EXPECT_EQ(p.efficiency(), 1.0);
  EXPECT_FALSE(s.sharded);
  EXPECT_EQ(s.staging_slots, 0);
  const StepCosts c = record_step_costs(run, DType::BF16, 32, 256);
  double micro_batch = 0, update = 0;
  for (const KernelCost& k : c.micro_batch) micro_batch += roofline_seconds(k, *a100.peak, a100.assume);
  for (const KernelCost& k : c.update) update += roofline_seconds(k, *a100.peak, a100.assume);
  EXPECT_NEAR(s.micro_batch_s(), micro_batch, 1e-12 * micro_batch);
  EXPECT_NEAR(s.update_s, update, 1e-12 * update);
  EXPECT_NEAR(p.step_s, micro_batch + update, 1e-12 * p.step_s);
}

// The ring's time for one bucket, computed by hand: 2(N-1)/N x bytes at the bus bandwidth plus NCCL's
// latency (8.4 us + 3.4 us a NVLink step + 14 us a network step); across nodes the bus bandwidth is the
// node's 8 NICs (A100: 8 x 24 GB/s = 192 GB/s, below NVLink's 230).
TEST(ScalingModel, RingTimeOfOneBucketIsTheFormula) {
  const Interconnect& ic = *find_interconnect("a100");
  const double bytes = 25.0 * 1048576 * 4;
  const double in_node = (8.4 + 14 * 3.4) * 1e-6 + 2.0 * 7 / 8 * bytes / 230e9;
  EXPECT_NEAR(collective_seconds(Collective::AllReduce, bytes, 8, ic), in_node, 1e-12);
  const double nodes8 = (8.4 + (126 - 14) * 3.4 + 14 * 14.0) * 1e-6 + 2.0 * 63 / 64 * bytes / 192e9;
  EXPECT_NEAR(collective_seconds(Collective::AllReduce, bytes, 64, ic), nodes8, 1e-12);
  const double reduce16 = (8.4 + 14 * 3.4 + 1 * 14.0) * 1e-6 + bytes / 192e9;  // a chain: 15 steps, 1 across
  EXPECT_NEAR(collective_seconds(Collective::Reduce, bytes, 16, ic), reduce16, 1e-12);
  EXPECT_NEAR(collective_seconds(Collective::Broadcast, bytes, 16, ic), reduce16, 1e-12);
  EXPECT_EQ(collective_seconds(Collective::AllReduce, bytes, 1, ic), 0.0);
  // The same bucket through the timeline: one all-reduce, all of it after the backward pass.
  const DataParallelStep s = hand_step(1, 0.1, 25 * 1048576);
  const ScalingPrediction p = predict_data_parallel(s, 64, ic);
  EXPECT_NEAR(p.reduction_s, nodes8, 1e-12);
  EXPECT_EQ(p.collectives, 1);  // the bucket (a hand-made step has no statistics to sum)
}

// Past one node the same bytes take longer, for every collective and GPU: the NICs are slower than
// NVLink and the network's steps slower than NVLink's.
TEST(ScalingModel, InterNodeIsSlowerThanIntraNode) {
  for (const std::string name : {"a100", "h100", "h200"})
    for (Collective c : {Collective::AllReduce, Collective::Reduce, Collective::Broadcast}) {
      const Interconnect& ic = *find_interconnect(name);
      EXPECT_LT(bus_bandwidth_gbs(c, 16, ic), bus_bandwidth_gbs(c, 8, ic)) << name;
      for (double bytes : {1024.0, 25.0 * 1048576, 4.0 * 1073741824}) {
        const double factor8 = c == Collective::AllReduce ? 2.0 * 7 / 8 : 1.0, factor16 = c == Collective::AllReduce ? 2.0 * 15 / 16 : 1.0;
        EXPECT_GT(collective_seconds(c, bytes, 16, ic), collective_seconds(c, bytes, 8, ic)) << name << " " << bytes;
        // per byte of the ring's traffic, latency aside
        const double per16 = (collective_seconds(c, bytes, 16, ic) - collective_latency_s(c, 16, ic)) / factor16;
        const double per8 = (collective_seconds(c, bytes, 8, ic) - collective_latency_s(c, 8, ic)) / factor8;
        EXPECT_GT(per16, per8) << name << " " << bytes;
      }
    }
}

// A fixed micro-batch a GPU: more GPUs never predict a higher efficiency, for llama_60m to llama_1b on
// both GPUs; 512 GPUs are below 8. With the replicated optimizer from one GPU on; sharded, from one
// node on: below that the busiest rank's share of the update still halves with each doubling (llama_1b
// on 4 A100s saves 4 ms of update more than on 2, for 1.6 ms more of communication).
TEST(ScalingModel, EfficiencyFallsWithTheNumberOfGpus) {
  for (const std::string name : {"a100", "h100"})
    for (const std::string model : {"llama_60m", "llama_130m", "llama_350m", "llama_1b"})
      for (bool shard : {true, false}) {
        const Gpu g = gpu(name);
        const RunConfig run = run_for(model, "sinkgd", shard);
        double last = 1.0, at8 = 0;
        for (int n = shard ? 8 : 1; n <= 512; n *= 2) {
          const double e = predict(run, g, n).efficiency();
          EXPECT_LE(e, last + 1e-12) << name << " " << model << " shard " << shard << " at " << n;
          EXPECT_LE(e, 1.0 + 1e-12);
          last = e;
          if (n == 8) at8 = e;
        }
        EXPECT_LT(last, at8) << name << " " << model << " shard " << shard;
      }
}

// Nothing hides the last bucket: it starts when the backward pass has finished (only the loss totals'
// kernels run after its report), so the exposed time is at least its collectives less that tail;
// without overlap, at least the whole reduction less the tail.
TEST(ScalingModel, ExposedTimeIsAtLeastTheLastBucket) {
  for (const std::string name : {"a100", "h100"})
    for (const std::string model : {"llama_60m", "llama_1b"})
      for (int n : {2, 8, 64, 512}) {
        RunConfig run = run_for(model);
        DataParallelStep s;
        const ScalingPrediction p = predict(run, gpu(name), n, &s);
        EXPECT_GT(p.last_bucket_s, 0.0);
        EXPECT_LT(s.tail_s, 0.01 * p.last_bucket_s) << "the tail is a few microseconds";
        EXPECT_GE(p.exposed_s, p.last_bucket_s - s.tail_s) << name << " " << model << " at " << n;
        run.parallel.overlap = false;
        const ScalingPrediction q = predict(run, gpu(name), n);
        EXPECT_GE(q.exposed_s, q.reduction_s - s.tail_s) << name << " " << model << " at " << n;
        EXPECT_GE(q.step_s, p.step_s);
      }
}

// The buckets are the trainer's (gradient_buckets over gradient_ready_order()): every range reported
// once, every gradient in one collective (all-reduce) or in its owners' reduces (sharded).
TEST(ScalingModel, BucketsAreTheTrainersBuckets) {
  const Gpu a100 = gpu("a100");
  const RunConfig run = run_for("llama_1b");
  DataParallelStep s;
  predict(run, a100, 8, &s);
  auto rec = make_cost_recorder();
  LlamaModel model(*rec, run.model, DType::BF16, 32, 256, run.precision.grads);
  const auto buckets = gradient_buckets(model.store(), static_cast<int64_t>(run.parallel.bucket_mb * 1048576.0), nullptr);
  ASSERT_EQ(s.buckets.size(), buckets.size());
  EXPECT_EQ(s.ready_s.size(), model.store().gradient_ready_order().size());
  int64_t elements = 0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    EXPECT_EQ(s.buckets[i].ranges, buckets[i].ranges);
    EXPECT_EQ(s.buckets[i].elements, buckets[i].end - buckets[i].begin);
    int64_t called = 0;
    for (int64_t c : s.buckets[i].calls) called += c;
    EXPECT_EQ(called, s.buckets[i].elements);
    elements += s.buckets[i].elements;
  }
  EXPECT_EQ(elements, model.store().arena_elements());  // (the recorder's arena is the CUDA backend's: the down projection's rows padded)
  EXPECT_TRUE(s.sharded);
  EXPECT_EQ(s.staging_slots, run.parallel.staging_buckets);
  EXPECT_LT(s.update_share, 0.5);
}

// With S staging slots the backward pass runs at most S buckets ahead of the network: with one slot
// bucket i is widened only once bucket i - 1's collective is done, so the network waits for each
// conversion; with three it does not. The conversions themselves are the same either way.
TEST(ScalingModel, StagingSlotsHoldTheBackwardPassBack) {
  const Interconnect& ic = *find_interconnect("a100");
  DataParallelStep s = hand_step(6, 1e-4, 50'000'000);  // 200 MB a bucket: ~1.5 ms each over 8 NVLink GPUs
  s.widen_s_per_element = s.narrow_s_per_element = 6.0 / (2039e9 * 0.8);  // BF16 <-> FP32 at 80% of HBM
  const ScalingPrediction none = predict_data_parallel(s, 8, ic);  // FP32 gradients: no staging
  s.staging_slots = 1;
  const ScalingPrediction one = predict_data_parallel(s, 8, ic);
  s.staging_slots = 3;
  const ScalingPrediction three = predict_data_parallel(s, 8, ic);
  const double convert = s.widen_s_per_element * 50'000'000;
  // The network's critical path holds bucket 0's widening, then with one slot a narrowing and a
  // widening before each of buckets 1-5 and the last narrowing after the wait (12 conversions); with
  // three slots the three narrowings after the wait only (4).
  EXPECT_NEAR(one.step_s - three.step_s, 8 * convert, 1e-12);
  EXPECT_GT(three.step_s, none.step_s);
  EXPECT_NEAR(one.compute_s, three.compute_s, 1e-15);
  EXPECT_NEAR(one.compute_s - none.compute_s, 6 * 2 * convert, 1e-12);
}
