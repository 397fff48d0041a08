// --backend, --timeout and --ranks-per-gpu, shared by the commands that run cases. The backend is chosen before
// the command line is parsed (an mpi job must start MPI first, and only rank 0 runs the
// command); these options document and validate the flags on each command.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace tally::cli {

// A watchdog shorter than a second would fire on the ordinary skew between ranks starting up;
// one longer than about 11 days is not a watchdog.
inline constexpr double kLeastTimeoutSeconds = 1.0;
inline constexpr double kMostTimeoutSeconds = 1e6;

struct BackendChoice {
  std::string name = "sim";     // sim | mpi | nccl
  double timeout_seconds = 60;  // the mpi and nccl backends' watchdog on every collective
  int ranks_per_gpu = 1;        // nccl: k virtual ranks per GPU (world = processes * k)
};

// Reads --backend, --timeout and --ranks-per-gpu from argv without parsing anything else.
BackendChoice backend_choice(int argc, const char* const* argv);

void add_backend_flags(CLI::App& command);

}  // namespace tally::cli
