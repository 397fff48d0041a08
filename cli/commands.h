// The tally command's subcommands. Each registers itself on the app and, when chosen, runs
// with the options it parsed, writing to the context's streams and setting its exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <iosfwd>
#include <string>

#include "run/backend.h"

namespace tally::cli {

struct CommandContext {
  std::ostream& out;
  std::ostream& err;
  run::Backend& backend;  // where the commands that run cases run them
  int exit_code = 0;
};

void add_topo_command(CLI::App& app, CommandContext& context);
void add_enumerate_command(CLI::App& app, CommandContext& context);
void add_layout_command(CLI::App& app, CommandContext& context);
// `command_line` is how this invocation was typed, for the replay line of a failure.
void add_run_command(CLI::App& app, CommandContext& context, std::string command_line);
void add_show_command(CLI::App& app, CommandContext& context);
void add_replay_command(CLI::App& app, CommandContext& context);
void add_fuzz_command(CLI::App& app, CommandContext& context);
void add_mutants_command(CLI::App& app, CommandContext& context);
void add_sweep_command(CLI::App& app, CommandContext& context);
void add_check_command(CLI::App& app, CommandContext& context);

// `word` as a shell reads it back: as it is when it is plain, else single-quoted.
std::string shell_quote(const std::string& word);

// Parses argv, runs the chosen command and returns the process exit code: 0 good, 1 a counting
// failure, 2 bad input (one line on err), 3 an infrastructure failure.
int run_tally(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace tally::cli
