#include "multinorm/data_parallel.h"

#include <algorithm>
#include <chrono>

#include "multinorm/error.h"

namespace multinorm {

std::unique_ptr<Communicator> make_gradient_communicator(Backend& backend, Comm& comm) {
  if (comm.size() == 1 || backend.host_memory()) return make_mpi_communicator(comm);
  // A device backend reduces in its own memory: rank 0 makes the id, MPI carries it to the others.
  std::vector<uint8_t> id = comm.root() ? backend.collective_id() : std::vector<uint8_t>{};
  int64_t bytes = static_cast<int64_t>(id.size());
  comm.broadcast(&bytes, sizeof(bytes), 0);
  id.resize(static_cast<size_t>(bytes));
  comm.broadcast(id.data(), bytes, 0);
  return backend.create_communicator(id, comm.rank(), comm.size(), comm.timeout());
}

std::vector<GradientBucket> gradient_buckets(const ParamStore& params, int64_t bucket_bytes, std::vector<int>* bucket_of_range) {
  std::vector<GradientBucket> buckets;
  for (const auto& [begin, end] : params.gradient_ready_order()) {
    if (buckets.empty() || (buckets.back().end - buckets.back().begin) * 4 >= bucket_bytes) buckets.push_back({begin, end, 0});
    GradientBucket& b = buckets.back();
    b.begin = std::min(b.begin, begin);
    b.end = std::max(b.end, end);
    ++b.ranges;
    if (bucket_of_range) bucket_of_range->push_back(static_cast<int>(buckets.size()) - 1);
  }
  return buckets;
}

int64_t gradient_staging_bytes(const ParamStore& params, int64_t bucket_bytes, int ranks, int64_t staging_buckets) {
  if (ranks < 2 || params.grad_dtype() == DType::F32) return 0;
  const auto buckets = gradient_buckets(params, bucket_bytes, nullptr);
  int64_t largest = 0;
  for (const GradientBucket& b : buckets) largest = std::max(largest, b.end - b.begin);
  return std::min<int64_t>(staging_buckets, static_cast<int64_t>(buckets.size())) * largest * 4;
}

GradientSync::GradientSync(ParamStore& params, Communicator& comm, const ShardPlan& plan, int64_t bucket_bytes, bool overlap,
                           int64_t staging_buckets)
    : params_(params), comm_(comm), plan_(plan), overlap_(overlap) {
  // Buckets: consecutive ranges of the backward pass's order, closed once they reach bucket_bytes.
  for (const GradientBucket& g : gradient_buckets(params_, bucket_bytes, &bucket_of_range_)) buckets_.push_back({g.begin, g.end, g.ranges});
  // BF16 gradients are summed in FP32 and rounded once: each bucket is widened into one of two
  // staging slots, reduced there and narrowed back, so staging holds two buckets, not the arena.
  if (comm_.size() > 1 && params_.grad_dtype() != DType::F32) {
    for (const Bucket& b : buckets_) slot_elements_ = std::max(slot_elements_, b.end - b.begin);
    if (staging_buckets < 1) throw Error("parallel.staging_buckets must be at least 1, got " + std::to_string(staging_buckets));
    slots_ = std::min<int64_t>(staging_buckets, static_cast<int64_t>(buckets_.size()));
    staging_ = params_.backend().allocate(slots_ * slot_elements_ * 4);
  }
  reduced_bytes_ = params_.arena_elements() * 4;
}

GradientSync::~GradientSync() {
  params_.set_gradient_listener(nullptr);
  if (staging_) params_.backend().release(staging_);
}

void GradientSync::arm() {
  if (comm_.size() == 1) return;
  armed_ = overlap_;
  if (armed_) params_.set_gradient_listener(this);
}

void GradientSync::gradients_ready(int64_t, int64_t) {
  if (!armed_) return;
  ++buckets_[static_cast<size_t>(bucket_of_range_[static_cast<size_t>(ranges_seen_++)])].ready;
  while (next_ < buckets_.size() && buckets_[next_].ready == buckets_[next_].ranges) start(next_++);
}

void GradientSync::progress() {
  if (armed_) comm_.progress();
}

// Sums one bucket over the ranks: all-reduce, or with a sharded optimizer a reduce of each run of
// tensors with one owner to that owner. With S staging slots, bucket i takes slot i % S: the bucket
// that held the slot before (i - S) is narrowed back first, once its collectives are done (on a
// device, the compute stream waits for them; the host does not).
void GradientSync::start(size_t i) {
  Backend& be = params_.backend();
  Bucket& b = buckets_[i];
  Buf grads = params_.grads();
  int64_t base = 0;  // arena element at grads' start
  if (staging_) {
    if (i >= static_cast<size_t>(slots_)) narrow_back(i - static_cast<size_t>(slots_));
    grads = slot(i);
    base = b.begin;
    be.convert(grads, params_.grads().at(b.begin), b.end - b.begin);
  }
  if (!plan_.sharded()) {
    comm_.all_reduce_sum(grads.at(b.begin - base).ptr, b.end - b.begin, DType::F32, "all-reduce of a gradient bucket");
  } else {
    for (const OwnerRun& r : owner_runs(plan_, params_.tensors(), b.begin, b.end))
      comm_.reduce_sum(grads.at(r.begin - base).ptr, r.end - r.begin, DType::F32, r.owner, "reduce of gradients to their owner");
  }
  if (staging_) b.mark = comm_.mark();
}

Buf GradientSync::slot(size_t i) const {
  return Buf{staging_, DType::F32}.at(static_cast<int64_t>(i % static_cast<size_t>(slots_)) * slot_elements_);
}

// The reduced FP32 sums of bucket i back into the BF16 arena, rounded once.
void GradientSync::narrow_back(size_t i) {
  const Bucket& b = buckets_[i];
  comm_.after_mark(b.mark);
  params_.backend().convert(params_.grads().at(b.begin), slot(i), b.end - b.begin);
  narrowed_ = i + 1;
}

void GradientSync::finish() {
  params_.set_gradient_listener(nullptr);
  if (comm_.size() == 1) return;
  while (next_ < buckets_.size()) start(next_++);
  const auto t = std::chrono::steady_clock::now();
  comm_.wait_all();
  last_wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  if (staging_)
    for (size_t i = narrowed_; i < buckets_.size(); ++i)  // the last two buckets: their collectives are done
      params_.backend().convert(params_.grads().at(buckets_[i].begin), slot(i), buckets_[i].end - buckets_[i].begin);
  for (Bucket& b : buckets_) b.ready = 0, b.mark = -1;
  next_ = 0;
  narrowed_ = 0;
  ranges_seen_ = 0;
  armed_ = false;
}

}  // namespace multinorm
