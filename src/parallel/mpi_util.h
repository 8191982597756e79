// MPI helpers shared by the run's host communicator (comm.cpp) and the gradient communicator
// (mpi_communicator.cpp): error checks, datatypes and the BF16 sum, and waiting with a deadline.
#pragma once
#ifdef MULTINORM_HAVE_MPI
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "multinorm/dtype.h"

namespace multinorm::mpi {

// Throws Error("MPI: what: <MPI's message>") unless rc is MPI_SUCCESS (MPI_COMM_WORLD returns
// errors instead of aborting: see Comm()).
void check(int rc, const std::string& what);

// The MPI datatype and sum operation of a gradient dtype: MPI_FLOAT/MPI_SUM for FP32; for BF16,
// 16-bit words summed by a user operation in FP32 and rounded to nearest even.
MPI_Datatype datatype(DType t);
MPI_Op sum_op(DType t);

// MPI counts are int: a collective over n elements is started in pieces of at most this many.
constexpr int64_t kPiece = int64_t{1} << 30;

// Completes `requests` (then clears it) or, after `timeout_s`, throws an Error naming `what`, this
// rank and what the run was doing. Polls MPI_Testall without pause for the first second (the wait
// itself progresses MPI), then with short sleeps (a slow peer, not a transfer).
void wait_all(std::vector<MPI_Request>& requests, double timeout_s, const std::string& what);

}  // namespace multinorm::mpi
#endif
