// Built instead of nccl_communicator.cpp when tally is configured without CUDA, MPI or NCCL.
#include "comm/nccl_communicator.h"

namespace tally::comm {

bool nccl_available() { return false; }

}  // namespace tally::comm
