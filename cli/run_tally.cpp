#include <iostream>

#include "cli/commands.h"
#include "cli/usage_error.h"

namespace tally::cli {

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
