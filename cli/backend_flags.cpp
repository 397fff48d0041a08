#include "cli/backend_flags.h"
#include "cli/number_flags.h"

#include <cstdlib>
#include <string_view>

namespace tally::cli {

BackendChoice backend_choice(int argc, const char* const* argv) {
  BackendChoice choice;
  auto value_of = [&](int i, std::string_view flag) -> const char* {
    const std::string_view arg = argv[i];
    if (arg == flag) return i + 1 < argc ? argv[i + 1] : nullptr;
    if (arg.size() > flag.size() && arg.substr(0, flag.size()) == flag && arg[flag.size()] == '=')
      return argv[i] + flag.size() + 1;
    return nullptr;
  };
  for (int i = 1; i < argc; ++i) {
    if (const char* v = value_of(i, "--backend")) choice.name = v;
    if (const char* v = value_of(i, "--timeout")) {
      // An invalid value keeps the default here; parsing the command rejects it with exit 2.
      if (!real_number_error(v, kLeastTimeoutSeconds, kMostTimeoutSeconds))
        choice.timeout_seconds = std::strtod(v, nullptr);
    }
    if (const char* v = value_of(i, "--ranks-per-gpu")) {
      if (!whole_number_error(v, 1, 1 << 20)) choice.ranks_per_gpu = std::atoi(v);
    }
  }
  return choice;
}

void add_backend_flags(CLI::App& command) {
  command
      .add_option("--backend", "Where the ranks run: sim (all in this process), mpi (one process "
                               "per rank: mpirun -np WORLD tally ... --backend mpi) or nccl (one "
                               "process per GPU: mpirun -np GPUS tally ... --backend nccl)")
      ->check(CLI::IsMember({"sim", "mpi", "nccl"}))
      ->default_str("sim");
  command
      .add_option("--timeout", "mpi, nccl: seconds a collective may wait before the job ends with "
                               "exit code 3 (a rank that never joined); nccl waits at most half "
                               "of it inside NCCL")
      ->type_name("SECONDS")
      ->check(real_number(kLeastTimeoutSeconds, kMostTimeoutSeconds))
      ->default_str("60");
  command
      .add_option("--ranks-per-gpu", "nccl: virtual ranks per GPU; the case's world must be "
                                     "(mpirun -np) * this")
      ->type_name("INT")
      ->check(whole_number(1, 1 << 20))
      ->default_str("1");
}

}  // namespace tally::cli
