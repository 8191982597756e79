// The part of NCCL the CUDA backend calls, for the emulated build: every collective is served by
// MPI over the emulated device's memory (host memory), so two emulated ranks run the NCCL
// communicator's code (kernels/cuda/nccl_communicator.cu) in the tests. Emulated streams complete
// work as it is issued, so each collective here completes before it returns; every rank issues
// the same collectives in the same order, as NCCL requires. Buffers must be emulated device memory
// (a host pointer is an error, as it would be for NCCL).
//
// A non-blocking communicator (ncclConfig_t.blocking = 0) behaves as NCCL's may: initialisation and
// every collective return ncclInProgress, and ncclCommGetAsyncError reports ncclInProgress for a few
// polls before ncclSuccess. A call on the communicator before that is ncclInvalidUsage, as NCCL's
// documentation forbids it: a caller that treats ncclInProgress as done fails here.
#include <mpi.h>
#include <nccl.h>

#include <cstring>

#include "../../common/bf16.h"

namespace cuda_emu {
bool is_device_memory(const void* p, size_t bytes);  // cuda_runtime_emulation.cpp
}

struct ncclComm {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  bool blocking = true;
  int in_progress = 0;  // polls of ncclCommGetAsyncError left before the last call is done
};

namespace {

constexpr char kMagic[] = "multinorm emulated NCCL";

void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  multinorm::bf16_sum_into(static_cast<const multinorm::bf16*>(in), static_cast<multinorm::bf16*>(inout), *len);
}

size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclFloat32: return 4;
    case ncclBfloat16: return 2;
    case ncclFloat64: return 8;
    default: return 0;  // the backend uses FP32, BF16 and (the update's statistics) FP64 only
  }
}
MPI_Datatype mpi_type(ncclDataType_t t) { return t == ncclFloat32 ? MPI_FLOAT : t == ncclFloat64 ? MPI_DOUBLE : MPI_UINT16_T; }
MPI_Op mpi_sum(ncclDataType_t t) {
  if (t != ncclBfloat16) return MPI_SUM;
  static MPI_Op op = [] {
    MPI_Op o;
    MPI_Op_create(&bf16_sum, 1, &o);
    return o;
  }();
  return op;
}

// Arguments NCCL would reject, or a buffer outside emulated device memory.
ncclResult_t check_args(ncclComm_t comm, ncclDataType_t t, ncclRedOp_t op, size_t count, int root,
                        std::initializer_list<std::pair<const void*, size_t>> buffers) {
  if (!comm || comm->comm == MPI_COMM_NULL) return ncclInvalidArgument;
  if (type_bytes(t) == 0 || op != ncclSum || root < 0 || root >= comm->size || count > (size_t{1} << 31) - 1)
    return ncclInvalidArgument;
  for (const auto& [p, elements] : buffers)
    if (elements && !cuda_emu::is_device_memory(p, elements * type_bytes(t))) return ncclInvalidArgument;
  return ncclSuccess;
}
ncclResult_t mpi(int rc) { return rc == MPI_SUCCESS ? ncclSuccess : ncclSystemError; }

constexpr int kInProgressPolls = 3;
// A call may start: not while the previous one is still in progress (non-blocking communicators).
bool busy(ncclComm_t comm) { return comm && comm->in_progress > 0; }
// A call's result on a non-blocking communicator: done here, reported as still in progress.
ncclResult_t finish(ncclComm_t comm, ncclResult_t r) {
  if (r != ncclSuccess || comm->blocking) return r;
  comm->in_progress = kInProgressPolls;
  return ncclInProgress;
}

}  // namespace

extern "C" {

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument (emulation: a buffer outside emulated device memory, a type or "
                                     "operation the backend does not use, or a rank outside the communicator)";
    case ncclSystemError: return "system error (emulation: an MPI call failed)";
    case ncclInvalidUsage: return "invalid usage (emulation: MPI is not initialised, the ranks disagree, or a call on a non-blocking "
                                  "communicator before ncclCommGetAsyncError reported the previous one done)";
    default: return "emulated NCCL error";
  }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0, sizeof(*id));
  std::memcpy(id->internal, kMagic, sizeof(kMagic));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  *out = nullptr;
  int initialized = 0, mpi_rank = 0, mpi_size = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return ncclInvalidUsage;
  if (std::memcmp(id.internal, kMagic, sizeof(kMagic)) != 0) return ncclInvalidArgument;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
  if (nranks != mpi_size || rank != mpi_rank) return ncclInvalidUsage;  // the emulation maps NCCL ranks to MPI's
  ncclComm* c = new ncclComm;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &c->comm) != MPI_SUCCESS) {
    delete c;
    return ncclSystemError;
  }
  c->rank = rank;
  c->size = nranks;
  c->blocking = !config || config->blocking != 0;
  *out = c;
  return finish(c, ncclSuccess);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async) {
  if (!comm) {
    *async = ncclInvalidArgument;
    return ncclSuccess;
  }
  *async = comm->in_progress > 0 ? ncclInProgress : ncclSuccess;
  if (comm->in_progress > 0) --comm->in_progress;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm->comm);
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  delete comm;  // the duplicated MPI communicator is left to MPI_Abort / MPI_Finalize
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t) {
  if (busy(comm)) return ncclInvalidUsage;
  if (const ncclResult_t r = check_args(comm, t, op, count, 0, {{send, count}, {recv, count}})) return r;
  return finish(comm, mpi(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count), mpi_type(t), mpi_sum(t),
                           comm->comm)));
}

ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t) {
  if (busy(comm)) return ncclInvalidUsage;
  const bool me = comm && comm->rank == root;
  if (const ncclResult_t r = check_args(comm, t, op, count, root, {{send, count}, {recv, me ? count : 0}})) return r;
  return finish(comm, mpi(MPI_Reduce(me && send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count), mpi_type(t), mpi_sum(t),
                        root, comm->comm)));
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t) {
  if (busy(comm)) return ncclInvalidUsage;
  if (const ncclResult_t r = check_args(comm, t, op, count, 0, {{send, count * (comm ? comm->size : 1)}, {recv, count}}))
    return r;
  return finish(comm, mpi(MPI_Reduce_scatter_block(send, recv, static_cast<int>(count), mpi_type(t), mpi_sum(t), comm->comm)));
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t t, ncclComm_t comm, cudaStream_t) {
  if (busy(comm)) return ncclInvalidUsage;
  if (const ncclResult_t r = check_args(comm, t, ncclSum, count, 0, {{send, count}, {recv, count * (comm ? comm->size : 1)}}))
    return r;
  const bool in_place = send == static_cast<const char*>(recv) + comm->rank * count * type_bytes(t);
  return finish(comm, mpi(MPI_Allgather(in_place ? MPI_IN_PLACE : send, static_cast<int>(count), mpi_type(t), recv,
                           static_cast<int>(count), mpi_type(t), comm->comm)));
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t) {
  if (busy(comm)) return ncclInvalidUsage;
  const bool me = comm && comm->rank == root;
  if (const ncclResult_t r = check_args(comm, t, ncclSum, count, root, {{send, me ? count : 0}, {recv, count}})) return r;
  if (me && send != recv) std::memmove(recv, send, count * type_bytes(t));
  return finish(comm, mpi(MPI_Bcast(recv, static_cast<int>(count), mpi_type(t), root, comm->comm)));
}

ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return ncclSuccess; }

}  // extern "C"
