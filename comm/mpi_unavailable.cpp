// Built instead of mpi_communicator.cpp when tally is configured without MPI.
#include "comm/mpi_communicator.h"

namespace tally::comm {

bool mpi_available() { return false; }

}  // namespace tally::comm
