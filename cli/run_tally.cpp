#include <iostream>
#include <memory>

#include "cli/backend_flags.h"
#include "cli/commands.h"
#include "cli/usage_error.h"
#include "comm/mpi_communicator.h"

namespace tally::cli {

std::string shell_quote(const std::string& word) {
  const bool plain = !word.empty() && word.find_first_not_of(
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=,:+@%") == std::string::npos;
  if (plain) return word;
  std::string quoted = "'";
  for (char ch : word) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return quoted + "'";
}

namespace {

// argv as a shell would need it typed again: words with shell metacharacters single-quoted.
std::string shell_command(int argc, const char* const* argv) {
  std::string out = "tally";
  for (int i = 1; i < argc; ++i) out += " " + shell_quote(argv[i]);
  return out;
}

// Registers every command, parses argv and runs the chosen one with `backend`.
int dispatch_command(int argc, const char* const* argv, std::ostream& out, std::ostream& err,
                run::Backend& backend) {
  CLI::App app{
      "tally: checks that a distributed gradient norm counts every parameter element exactly "
      "once, in every parallel topology (TP, CP, PP, DP, EP, ETP) of Megatron-LM."};
  app.name("tally");
  app.require_subcommand(1);
  app.set_version_flag("--version", "tally 0.1.0");
  CommandContext context{out, err, backend};
  add_topo_command(app, context);
  add_enumerate_command(app, context);
  add_layout_command(app, context);
  add_run_command(app, context, shell_command(argc, argv));
  add_show_command(app, context);
  add_replay_command(app, context);
  add_fuzz_command(app, context);
  add_mutants_command(app, context);
  add_sweep_command(app, context);
  add_check_command(app, context);
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const CLI::App* command : app.get_subcommands([](CLI::App*) { return true; })) {
      names += (names.empty() ? "" : ", ") + command->get_name();
      known = known || command->get_name() == argv[1];
    }
    if (!known) {
      err << "tally: error: unknown command '" << argv[1] << "' (commands: " << names << ")\n";
      return kExitBadInput;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return kExitPass;
  } catch (const CLI::CallForAllHelp&) {
    out << app.help("", CLI::AppFormatMode::All);
    return kExitPass;
  } catch (const CLI::CallForVersion& version) {
    out << version.what() << '\n';
    return kExitPass;
  } catch (const CLI::ParseError& error) {
    // Help requested on a subcommand arrives as CallForHelp too; everything else is bad input.
    err << "tally: error: " << error.what() << " (see tally --help)\n";
    return kExitBadInput;
  } catch (const UsageError& error) {
    err << "tally: error: " << error.what() << '\n';
    return kExitBadInput;
  } catch (const std::exception& error) {
    err << "tally: internal error: " << error.what() << '\n';
    return kExitInfra;
  }
  return context.exit_code;
}

#if TALLY_HAVE_MPI
static_assert(comm::kJobEndedExitCode == kExitInfra, "a job ended by MpiSession::end_job exits 3");

// MPI_Init, or null after one line on err when it fails (there is no job yet to end).
std::unique_ptr<comm::MpiSession> start_mpi(std::ostream& err, const BackendChoice& choice) {
  try {
    return std::make_unique<comm::MpiSession>(nullptr, nullptr,
                                              comm::MpiOptions{choice.timeout_seconds});
  } catch (const comm::InfraError& error) {
    err << "tally: infrastructure failure: " << error.what() << '\n';
    return nullptr;
  }
}
#endif

// Rank 0 runs the command; the other ranks serve its cases and exit with its exit code.
int run_under_mpi(int argc, const char* const* argv, std::ostream& out, std::ostream& err,
                  const BackendChoice& choice) {
#if TALLY_HAVE_MPI
  const std::unique_ptr<comm::MpiSession> session = start_mpi(err, choice);
  if (!session) return kExitInfra;
  if (session->rank() != 0) return run::serve_mpi_cases(*session);
  // A failure that leaves other processes waiting never returns here (the backend ends the
  // job), so finish() only runs when every process can still answer it.
  run::MpiBackend backend(*session);
  const int code = dispatch_command(argc, argv, out, err, backend);
  backend.finish(code);
  return code;
#else
  (void)argc, (void)argv, (void)out, (void)choice;
  err << "tally: error: --backend mpi: this tally was built without MPI (install libopenmpi-dev "
         "and configure with -DTALLY_ENABLE_MPI=ON)\n";
  return kExitBadInput;
#endif
}

// The nccl backend: one process per GPU, --ranks-per-gpu ranks each; rank 0 runs the command.
int run_under_nccl(int argc, const char* const* argv, std::ostream& out, std::ostream& err,
                   const BackendChoice& choice) {
#if TALLY_HAVE_MPI
  std::string why;
  if (!run::nccl_engine_available(&why)) {
    err << "tally: error: --backend nccl: " << why << '\n';
    return kExitBadInput;
  }
  const std::unique_ptr<comm::MpiSession> session = start_mpi(err, choice);
  if (!session) return kExitInfra;
  std::unique_ptr<run::RankEngine> engine = run::make_nccl_engine(*session, choice.ranks_per_gpu);
  if (session->rank() != 0) return run::serve_mpi_cases(*session, *engine);
  run::MpiBackend backend(*session, std::move(engine));
  const int code = dispatch_command(argc, argv, out, err, backend);
  backend.finish(code);
  return code;
#else
  (void)argc, (void)argv, (void)out, (void)choice;
  err << "tally: error: --backend nccl: this tally was built without the nccl backend (needs "
         "CUDA, MPI and NCCL; configure with -DTALLY_ENABLE_NCCL=ON)\n";
  return kExitBadInput;
#endif
}

}  // namespace

int run_tally(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  const BackendChoice choice = backend_choice(argc, argv);
  if (choice.name == "mpi") return run_under_mpi(argc, argv, out, err, choice);
  if (choice.name == "nccl") return run_under_nccl(argc, argv, out, err, choice);
  run::SimBackend sim;
  return dispatch_command(argc, argv, out, err, sim);
}

}  // namespace tally::cli
