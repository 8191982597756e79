#include "multinorm/data_parallel.h"

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

GradientSync::GradientSync(LlamaModel& model, Communicator& comm, const ShardPlan& plan, int64_t bucket_bytes, bool overlap)
    : model_(model), comm_(comm), plan_(plan), overlap_(overlap) {
  // Buckets: consecutive ranges of the backward pass's order, closed once they reach bucket_bytes.
  const auto order = model_.gradient_ready_order();
  for (const auto& [begin, end] : order) {
    if (buckets_.empty() || (buckets_.back().end - buckets_.back().begin) * 4 >= bucket_bytes) buckets_.push_back({begin, end});
    Bucket& b = buckets_.back();
    b.begin = std::min(b.begin, begin);
    b.end = std::max(b.end, end);
    ++b.ranges;
    bucket_of_range_.push_back(static_cast<int>(buckets_.size()) - 1);
  }
  if (comm_.size() > 1 && model_.grad_dtype() != DType::F32) staging_ = model_.backend().allocate(model_.num_params() * 4);
  reduced_bytes_ = model_.num_params() * 4;
}

GradientSync::~GradientSync() {
  model_.set_gradient_listener(nullptr);
  if (staging_) model_.backend().release(staging_);
}

void GradientSync::arm() {
  if (comm_.size() == 1) return;
  armed_ = overlap_;
  if (armed_) model_.set_gradient_listener(this);
}

void GradientSync::gradients_ready(int64_t, int64_t) {
  if (!armed_) return;
  ++buckets_[static_cast<size_t>(bucket_of_range_[static_cast<size_t>(ranges_seen_++)])].ready;
  while (next_ < buckets_.size() && buckets_[next_].ready == buckets_[next_].ranges) start(buckets_[next_++]);
}

void GradientSync::progress() {
  if (armed_) comm_.progress();
}

// Sums one bucket over the ranks: all-reduce, or with a sharded optimizer a reduce of each run of
// tensors with one owner to that owner.
void GradientSync::start(const Bucket& b) {
  Backend& be = model_.backend();
  const Buf grads = staging_ ? Buf{staging_, DType::F32} : model_.grads();
  if (staging_) be.convert(grads.at(b.begin), model_.grads().at(b.begin), b.end - b.begin);
  if (!plan_.sharded()) {
    comm_.all_reduce_sum(grads.at(b.begin).ptr, b.end - b.begin, DType::F32, "all-reduce of a gradient bucket");
    return;
  }
  for (const OwnerRun& r : owner_runs(plan_, model_.tensors(), b.begin, b.end))
    comm_.reduce_sum(grads.at(r.begin).ptr, r.end - r.begin, DType::F32, r.owner, "reduce of gradients to their owner");
}

void GradientSync::finish() {
  model_.set_gradient_listener(nullptr);
  if (comm_.size() == 1) return;
  while (next_ < buckets_.size()) start(buckets_[next_++]);
  const auto t = std::chrono::steady_clock::now();
  comm_.wait_all();
  last_wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  if (staging_) model_.backend().convert(model_.grads(), Buf{staging_, DType::F32}, model_.num_params());
  for (Bucket& b : buckets_) b.ready = 0;
  next_ = 0;
  ranges_seen_ = 0;
  armed_ = false;
}

}  // namespace multinorm
