// tally enumerate: every configuration Megatron-LM accepts for a world size.
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>

#include "cli/commands.h"
#include "cli/number_flags.h"
#include "cli/usage_error.h"
#include "topologies/enumerate.h"

namespace tally::cli {

namespace {

struct EnumerateOptions {
  int world = 0;
  bool json = false;
  bool count_only = false;
  std::string order;
  topologies::EnumerateFilter filter;
};

void check_limit(const char* flag, int value) {
  if (value < 0)
    throw UsageError(std::string(flag) + " must be at least 0 (got " + std::to_string(value) +
                     "; 0 means no limit)");
}

}  // namespace

void add_enumerate_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<EnumerateOptions>();
  CLI::App* command = app.add_subcommand(
      "enumerate",
      "List every valid (tp, cp, pp, ep, etp, order) of a world size. Orders are the 120 that "
      "name all five axes (an order that omits an axis of size 1 equals one of them).");
  command->add_option("--world", options->world, "Number of ranks")
      ->required()
      ->check(whole_number(1, kIntMax));
  command->add_flag("--json", options->json, "Machine-readable output");
  command->add_flag("--count", options->count_only, "Print only the number of configurations");
  command->add_option("--order", options->order, "Only this order (e.g. tp-cp-ep-dp-pp)");
  command->add_option("--max-tp", options->filter.max_tp, "Largest tp (0: no limit)")->check(whole_number(0, kIntMax));
  command->add_option("--max-cp", options->filter.max_cp, "Largest cp (0: no limit)")->check(whole_number(0, kIntMax));
  command->add_option("--max-pp", options->filter.max_pp, "Largest pp (0: no limit)")->check(whole_number(0, kIntMax));
  command->add_option("--max-ep", options->filter.max_ep, "Largest ep (0: no limit)")->check(whole_number(0, kIntMax));
  command->add_option("--max-etp", options->filter.max_etp, "Largest etp (0: no limit)")->check(whole_number(0, kIntMax));
  command->callback([options, &context] {
    const int world = options->world;
    if (world < 1)
      throw UsageError("--world must be at least 1 (got " + std::to_string(world) + ")");
    if (world > topologies::kMaxWorld)
      throw UsageError("--world " + std::to_string(world) + " is larger than tally supports (at most " +
                       std::to_string(topologies::kMaxWorld) + " ranks)");
    check_limit("--max-tp", options->filter.max_tp);
    check_limit("--max-cp", options->filter.max_cp);
    check_limit("--max-pp", options->filter.max_pp);
    check_limit("--max-ep", options->filter.max_ep);
    check_limit("--max-etp", options->filter.max_etp);
    if (!options->order.empty()) {
      std::string error;
      options->filter.order = topologies::parse_order(options->order, &error);
      if (!options->filter.order) throw UsageError(error);
    }

    std::ostream& out = context.out;
    const bool list = !options->count_only;
    bool first = true;
    if (options->json) out << "{\"world\":" << world << (list ? ",\"configs\":[" : "");
    const std::int64_t count = topologies::for_each_config(
        world, options->filter, [&](const topologies::ParallelConfig& c) {
          if (!list) return;
          if (options->json) {
            nlohmann::ordered_json j = {{"tp", c.tp},   {"cp", c.cp},
                                        {"pp", c.pp},   {"dp", topologies::dp(c)},
                                        {"ep", c.ep},   {"etp", c.etp},
                                        {"edp", topologies::edp(c)}, {"order", c.order}};
            out << (first ? "" : ",") << j.dump();
          } else {
            out << "tp " << c.tp << "  cp " << c.cp << "  pp " << c.pp << "  dp "
                << topologies::dp(c) << "  ep " << c.ep << "  etp " << c.etp << "  edp "
                << topologies::edp(c) << "  order " << c.order << '\n';
          }
          first = false;
        });
    if (options->json)
      out << (list ? "]" : "") << ",\"count\":" << count << "}\n";
    else
      out << count << " valid configuration" << (count == 1 ? "" : "s") << " of world " << world
          << '\n';
    context.exit_code = kExitPass;
  });
}

}  // namespace tally::cli
