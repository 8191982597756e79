// Data parallelism: every rank holds the whole model, computes the gradient of its own micro-batches
// (the loader gives each rank a disjoint slice of every global step), and the gradients are summed
// over the ranks before the optimizer step. Gradients travel in buckets (contiguous ranges of the
// gradient arena, whole layers) through a Communicator: MPI on the CPU backend, NCCL on the CUDA
// backend. With overlap, a bucket is reduced as soon as the last micro-batch's backward pass has
// finished its layers, while the layers below are still being differentiated. With a sharded
// optimizer (shard_plan.h) each tensor is reduced to its owner only (reduce instead of all-reduce);
// the owner updates it and broadcasts the new weights (Optimizer).
#pragma once
#include <memory>
#include <vector>

#include "multinorm/comm.h"
#include "multinorm/communicator.h"
#include "multinorm/param_store.h"
#include "multinorm/shard_plan.h"

namespace multinorm {

// The gradient communicator for `model`'s backend: MPI over host memory for the CPU backend, the
// backend's own (NCCL) for a device backend, its id bootstrapped over `comm`. One rank: identities.
std::unique_ptr<Communicator> make_gradient_communicator(Backend& backend, Comm& comm);
std::unique_ptr<Communicator> make_mpi_communicator(Comm& comm);

// Buckets: consecutive ranges of the store's gradient_ready_order(), closed once they reach
// bucket_bytes (FP32); bucket_of_range (optional) gets each range's bucket.
struct GradientBucket {
  int64_t begin = 0, end = 0;  // arena elements
  int ranges = 0;
};
std::vector<GradientBucket> gradient_buckets(const ParamStore& params, int64_t bucket_bytes, std::vector<int>* bucket_of_range);
// The FP32 staging GradientSync allocates for the store's BF16 gradients over `ranks` ranks:
// staging_buckets slots of the largest bucket (at most one a bucket); 0 with FP32 gradients or one rank.
int64_t gradient_staging_bytes(const ParamStore& params, int64_t bucket_bytes, int ranks, int64_t staging_buckets);

class GradientSync final : public GradientListener {
 public:
  // bucket_bytes: a bucket closes at the first layer boundary at or past this many bytes (of the
  // reduction dtype, FP32). overlap = false reduces every bucket after the backward pass.
  // staging_buckets: with BF16 gradients, the FP32 slots buckets are summed in (parallel.staging_buckets).
  GradientSync(ParamStore& params, Communicator& comm, const ShardPlan& plan, int64_t bucket_bytes, bool overlap,
               int64_t staging_buckets = 2);
  ~GradientSync() override;
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  // Before the last micro-batch of an update (with overlap, its backward pass starts the buckets).
  void arm();
  // After the last micro-batch: starts the buckets not started yet, waits for all of them. On
  // return each rank's tensors (all of them, when not sharded) hold the sum over the ranks.
  void finish();
  // Seconds finish() waited for communication in the last update (what overlap did not hide).
  double last_wait_seconds() const { return last_wait_s_; }
  // Gradient bytes each rank sends per update (the reduction dtype; a ring's 2(N-1)/N is left out).
  int64_t reduced_bytes() const { return reduced_bytes_; }
  int buckets() const { return static_cast<int>(buckets_.size()); }
  // Device (or host) bytes of the FP32 staging that BF16 gradients are reduced in: staging_buckets
  // slots (at most one a bucket) of the largest bucket; 0 with FP32 gradients or one rank.
  int64_t staging_bytes() const { return slots_ * slot_elements_ * 4; }

  void gradients_ready(int64_t begin, int64_t end) override;
  void progress() override;

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;  // arena elements
    int ranges = 0, ready = 0;   // gradient_ready_order() ranges it holds, and those reported
    int64_t mark = -1;           // the communicator's mark after its collectives (with staging)
  };
  void start(size_t i);
  void narrow_back(size_t i);
  Buf slot(size_t i) const;  // bucket i's staging slot
  ParamStore& params_;
  Communicator& comm_;
  ShardPlan plan_;
  bool overlap_, armed_ = false;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_range_;  // gradient_ready_order() index -> bucket
  size_t next_ = 0;                   // the next bucket to start (buckets start in order)
  int64_t ranges_seen_ = 0;
  void* staging_ = nullptr;           // FP32 slots for BF16 gradients: summed in FP32, rounded once
  int64_t slots_ = 0, slot_elements_ = 0;  // staging slots, each of the largest bucket
  size_t narrowed_ = 0;               // buckets [0, narrowed_) are back in the arena
  double last_wait_s_ = 0;
  int64_t reduced_bytes_ = 0;
};

}  // namespace multinorm
