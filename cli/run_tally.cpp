#include <iostream>

#include "cli/commands.h"
#include "cli/usage_error.h"

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

}  // namespace

int run_tally(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  CLI::App app{
      "tally: checks that a distributed gradient norm counts every parameter element exactly "
      "once, in every parallel topology (TP, CP, PP, DP, EP, ETP) of Megatron-LM."};
  app.name("tally");
  app.require_subcommand(1);
  app.set_version_flag("--version", "tally 0.1.0");
  CommandContext context{out, err};
  add_topo_command(app, context);
  add_enumerate_command(app, context);
  add_layout_command(app, context);
  add_run_command(app, context, shell_command(argc, argv));
  add_show_command(app, context);
  add_replay_command(app, context);
  add_fuzz_command(app, context);
  add_mutants_command(app, context);
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
  }
  return context.exit_code;
}

}  // namespace tally::cli
