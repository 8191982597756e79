// The Communicator seam under mpirun (2 or 3 ranks): every collective (all-reduce, reduce to a
// root, reduce-scatter, all-gather in and out of place, broadcast), FP32 and BF16, several started
// before one wait_all(), on the MPI communicator over host memory and, when the emulated CUDA plugin
// is given, on the CUDA backend's NCCL communicator over (emulated) device memory. Values are small
// integers, exact in BF16, so every sum is checked exactly against the formula.
// usage: mpirun -np N communicator_tests [emulated CUDA plugin]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "../kernels/common/bf16.h"
#include "multinorm/backend.h"
#include "multinorm/comm.h"
#include "multinorm/data_parallel.h"
#include "multinorm/device.h"
#include "multinorm/error.h"

using namespace multinorm;

namespace {

int g_checks = 0, g_failures = 0;

// Buffers in the communicator's memory: host vectors for MPI, backend allocations for NCCL.
struct Memory {
  Backend* backend = nullptr;  // null: host memory
  void* alloc(int64_t bytes) { return backend ? backend->allocate(bytes) : std::calloc(static_cast<size_t>(bytes), 1); }
  void release(void* p) { backend ? backend->release(p) : std::free(p); }
  void put(void* dst, const std::vector<float>& v, DType t) {
    std::vector<uint8_t> raw = encode(v, t);
    backend ? backend->to_device(dst, raw.data(), static_cast<int64_t>(raw.size())) : (void)std::copy(raw.begin(), raw.end(), static_cast<uint8_t*>(dst));
  }
  std::vector<float> get(const void* src, int64_t n, DType t) {
    std::vector<uint8_t> raw(static_cast<size_t>(n * dtype_bytes(t)));
    if (backend) backend->to_host(raw.data(), src, static_cast<int64_t>(raw.size()));
    else std::copy(static_cast<const uint8_t*>(src), static_cast<const uint8_t*>(src) + raw.size(), raw.begin());
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      v[static_cast<size_t>(i)] = t == DType::F32 ? reinterpret_cast<const float*>(raw.data())[i]
                                                  : to_f32(reinterpret_cast<const bf16*>(raw.data())[i]);
    return v;
  }
  static std::vector<uint8_t> encode(const std::vector<float>& v, DType t) {
    std::vector<uint8_t> raw(v.size() * static_cast<size_t>(dtype_bytes(t)));
    for (size_t i = 0; i < v.size(); ++i)
      if (t == DType::F32) reinterpret_cast<float*>(raw.data())[i] = v[i];
      else reinterpret_cast<bf16*>(raw.data())[i] = to_bf16(v[i]);
    return raw;
  }
};

void expect(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    std::fprintf(stderr, "rank %d: FAILED: %s\n", Comm::world().rank(), what.c_str());
  }
}

void expect_values(const std::vector<float>& got, const std::function<float(int64_t)>& want, const std::string& what) {
  int64_t bad = -1;
  for (size_t i = 0; i < got.size() && bad < 0; ++i)
    if (got[i] != want(static_cast<int64_t>(i))) bad = static_cast<int64_t>(i);
  expect(bad < 0, what + (bad < 0 ? "" : ": element " + std::to_string(bad) + " is " + std::to_string(got[static_cast<size_t>(bad)]) +
                                               ", expected " + std::to_string(want(bad))));
}

void run_all(Communicator& c, Memory& mem, DType t) {
  const int r = c.rank(), N = c.size();
  const std::string tag = c.name() + " " + dtype_name(t) + ": ";
  const float offsets = static_cast<float>(N * (N - 1) / 2);  // sum over ranks of r
  const int64_t n = 1000;
  auto value = [&](int rank, int64_t i) { return static_cast<float>(i % 7 + rank + 1); };
  std::vector<float> mine(static_cast<size_t>(n)), wide(static_cast<size_t>(n * N));
  for (int64_t i = 0; i < n; ++i) mine[static_cast<size_t>(i)] = value(r, i);
  for (int64_t i = 0; i < n * N; ++i) wide[static_cast<size_t>(i)] = value(r, i);

  // Several collectives in flight, then one wait.
  void* ar = mem.alloc(n * 4);
  void* red = mem.alloc(n * 4);
  void* bc = mem.alloc(n * 4);
  void* rs_send = mem.alloc(n * N * 4);
  void* rs_recv = mem.alloc(n * 4);
  void* ag = mem.alloc(n * N * 4);
  void* ag_own = mem.alloc(n * 4);
  void* ag_out = mem.alloc(n * N * 4);
  mem.put(ar, mine, t);
  mem.put(red, mine, t);
  std::vector<float> b(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) b[static_cast<size_t>(i)] = r == N - 1 ? static_cast<float>(i % 13) : -1.0f;
  mem.put(bc, b, t);
  mem.put(rs_send, wide, t);
  std::vector<float> own(static_cast<size_t>(n)), ag_init(static_cast<size_t>(n * N), -1.0f);
  for (int64_t i = 0; i < n; ++i) own[static_cast<size_t>(i)] = static_cast<float>(r * 60 + i % 50);
  for (int64_t i = 0; i < n; ++i) ag_init[static_cast<size_t>(r * n + i)] = own[static_cast<size_t>(i)];
  mem.put(ag, ag_init, t);  // in place: this rank's block already holds its part
  mem.put(ag_own, own, t);
  const int64_t eb = dtype_bytes(t);
  c.all_reduce_sum(ar, n, t, "test all-reduce");
  c.reduce_sum(red, n, t, N - 1, "test reduce");
  c.broadcast(bc, n, t, N - 1, "test broadcast");
  c.reduce_scatter_sum(rs_send, rs_recv, n, t, "test reduce-scatter");
  c.all_gather(static_cast<char*>(ag) + r * n * eb, ag, n, t, "test all-gather in place");
  c.all_gather(ag_own, ag_out, n, t, "test all-gather");
  c.progress();
  c.wait_all();
  expect(c.progress(), tag + "nothing pending after wait_all");

  expect_values(mem.get(ar, n, t), [&](int64_t i) { return static_cast<float>(N * (i % 7 + 1)) + offsets; }, tag + "all-reduce");
  expect_values(mem.get(red, n, t), [&](int64_t i) {
    return r == N - 1 ? static_cast<float>(N * (i % 7 + 1)) + offsets : value(r, i);
  }, tag + "reduce to the last rank (others unchanged)");
  expect_values(mem.get(bc, n, t), [&](int64_t i) { return static_cast<float>(i % 13); }, tag + "broadcast from the last rank");
  expect_values(mem.get(rs_recv, n, t), [&](int64_t i) {
    return static_cast<float>(N * ((r * n + i) % 7 + 1)) + offsets;
  }, tag + "reduce-scatter");
  auto gathered = [&](int64_t j) { return static_cast<float>((j / n) * 60 + (j % n) % 50); };
  expect_values(mem.get(ag, n * N, t), gathered, tag + "all-gather in place");
  expect_values(mem.get(ag_out, n * N, t), gathered, tag + "all-gather");
  for (void* p : {ar, red, bc, rs_send, rs_recv, ag, ag_own, ag_out}) mem.release(p);

  // A BF16 sum is rounded to nearest even at each addition (as NCCL's ring does): 256 + 1 = 257
  // lies halfway between 256 and 258 and goes to 256 (truncation would too; 255 + 2 = 257 -> 256,
  // 257 + 2 = 259 -> 260 tells nearest-even from truncation). The other ranks add zeros.
  if (t == DType::BF16) {
    void* x = mem.alloc(4);
    mem.put(x, {r == 0 ? 256.0f : r == 1 ? 1.0f : 0.0f, r == 0 ? 258.0f : r == 1 ? 1.0f : 0.0f}, t);
    c.all_reduce_sum(x, 2, t, "test bf16 rounding");
    c.wait_all();
    const std::vector<float> got = mem.get(x, 2, t);
    expect(got[0] == 256.0f && got[1] == 260.0f, tag + "BF16 sums rounded to nearest even: 256+1 -> " +
                                                    std::to_string(got[0]) + ", 258+1 -> " + std::to_string(got[1]));
    mem.release(x);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc > 1) ::setenv("MULTINORM_CUDA_PLUGIN", argv[1], 1);
    Comm& comm = Comm::world();
    comm.set_timeout(60);
    if (comm.size() < 2) throw Error("run under mpirun with at least 2 ranks");
    {
      auto mpi = make_mpi_communicator(comm);
      Memory host;
      for (DType t : {DType::F32, DType::BF16}) run_all(*mpi, host, t);
    }
    if (argc > 1) {
      auto backend = make_backend(choose_backend("cuda"), 1);
      auto nccl = make_gradient_communicator(*backend, comm);
      expect(nccl->name().find("NCCL") != std::string::npos, "the CUDA backend's communicator is NCCL: " + nccl->name());
      Memory device{backend.get()};
      for (DType t : {DType::F32, DType::BF16}) run_all(*nccl, device, t);
      // A host pointer is refused as NCCL would refuse it.
      std::vector<float> host(4);
      bool refused = false;
      try {
        nccl->all_reduce_sum(host.data(), 4, DType::F32, "test host pointer");
      } catch (const Error& e) {
        refused = std::string(e.what()).find("invalid argument") != std::string::npos;
      }
      expect(refused, "a host buffer handed to the NCCL communicator is an error");
    }
    int64_t totals[2] = {g_checks, g_failures};
    comm.allreduce_sum(totals, 2);
    if (comm.root()) std::printf("communicators: %lld checks on %d ranks, %lld failed\n", (long long)totals[0], comm.size(), (long long)totals[1]);
    return totals[1] == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "communicator_tests: %s\n", e.what());
    Comm::world().abort_all(1);
    return 1;
  }
}
