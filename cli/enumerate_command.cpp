// tally enumerate: every configuration Megatron-LM accepts for a world size; with
// --dist-opt-instances, each number of distributed-optimizer instances it takes; with --corner,
// only those in one of Megatron-LM's own layout corners (fuzz/generators.h), where its groups
// miscount with no fault; with --by-order, how many of them each rank order has.
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>

#include "cli/commands.h"
#include "cli/number_flags.h"
#include "cli/usage_error.h"
#include "fuzz/findings.h"
#include "fuzz/generators.h"
#include "topologies/enumerate.h"

namespace tally::cli {

namespace {

struct EnumerateOptions {
  int world = 0;
  bool json = false;
  bool count_only = false;
  std::string order;
  topologies::EnumerateFilter filter;
  std::string instances = "1";  // a number, or "all": every number above 1 Megatron-LM takes
  std::string corner;           // "": every configuration
  bool by_order = false;
};

// The configurations `c` stands for under --dist-opt-instances: its own (one instance) or each
// number of instances check_config takes.
std::vector<topologies::ParallelConfig> with_instances(const topologies::ParallelConfig& c, const std::string& instances) {
  std::vector<topologies::ParallelConfig> out;
  const int first = instances == "all" ? 2 : std::stoi(instances);
  const int last = instances == "all" ? c.world : first;
  for (int k = first; k <= last; ++k) {
    topologies::ParallelConfig with = c;
    with.dist_opt_instances = k;
    if (!topologies::check_config(with)) out.push_back(with);
  }
  return out;
}

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
  command->add_option("--dist-opt-instances", options->instances,
                      "Distributed-optimizer instances: a number (default 1), or all: each number above 1 that "
                      "the configuration takes (it must divide DP x CP and EDP), a configuration each");
  command->add_option("--corner", options->corner,
                      "Only configurations in one of Megatron-LM's own layout corners, where its groups "
                      "miscount with no fault (docs/findings): experts-as-dense, instances-split-their-shards");
  command->add_flag("--by-order", options->by_order,
                    "Print how many configurations each of the 120 orders has (with --corner: in the corner), "
                    "and how many orders have one");
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
    if (options->instances != "all") {
      const std::string& text = options->instances;
      if (text.empty() || text.size() > 7 || text.find_first_not_of("0123456789") != std::string::npos ||
          std::stoi(text) < 1)
        throw UsageError("--dist-opt-instances: expected a whole number, 1 or more, or all, got '" + text + "'");
    }
    fuzz::LayoutCorner corner = fuzz::LayoutCorner::none;
    if (!options->corner.empty()) {
      for (fuzz::LayoutCorner c : {fuzz::LayoutCorner::experts_as_dense, fuzz::LayoutCorner::instances_split_their_shards})
        if (options->corner == fuzz::layout_corner_id(c)) corner = c;
      if (corner == fuzz::LayoutCorner::none)
        throw UsageError("--corner: expected experts-as-dense or instances-split-their-shards, got '" + options->corner + "'");
    }
    // A corner is a fact about the groups: a configuration lies in it whether or not it lies in the
    // other one too.
    const auto in_corner = [corner](const topologies::ParallelConfig& c) {
      if (corner == fuzz::LayoutCorner::experts_as_dense) return fuzz::experts_as_dense_with_other_groups(c);
      if (corner == fuzz::LayoutCorner::instances_split_their_shards) return fuzz::instances_split_their_shards(c);
      return true;
    };
    std::map<std::string, std::int64_t> by_order;  // every order enumerated, with its count

    std::ostream& out = context.out;
    const bool list = !options->count_only && !options->by_order;
    bool first = true;
    std::int64_t count = 0;
    if (options->json) out << "{\"world\":" << world << (list ? ",\"configs\":[" : "");
    topologies::for_each_config(world, options->filter, [&](const topologies::ParallelConfig& one) {
      by_order.try_emplace(one.order, 0);
      for (const topologies::ParallelConfig& c : with_instances(one, options->instances)) {
          if (!in_corner(c)) continue;
          ++count;
          ++by_order[c.order];
          if (!list) continue;
          if (options->json) {
            nlohmann::ordered_json j = {{"tp", c.tp},   {"cp", c.cp},
                                        {"pp", c.pp},   {"dp", topologies::dp(c)},
                                        {"ep", c.ep},   {"etp", c.etp},
                                        {"edp", topologies::edp(c)}, {"order", c.order}};
            if (options->instances != "1") j["dist_opt_instances"] = c.dist_opt_instances;
            out << (first ? "" : ",") << j.dump();
          } else {
            out << "tp " << c.tp << "  cp " << c.cp << "  pp " << c.pp << "  dp "
                << topologies::dp(c) << "  ep " << c.ep << "  etp " << c.etp << "  edp "
                << topologies::edp(c) << "  order " << c.order
                << (options->instances != "1" ? "  instances " + std::to_string(c.dist_opt_instances) : "") << '\n';
          }
          first = false;
      }
    });
    std::int64_t orders_with_one = 0;
    for (const auto& [order, n] : by_order) orders_with_one += n > 0;
    const std::string what = options->corner.empty() ? "" : " in the corner " + options->corner;
    if (options->json) {
      out << (list ? "]" : "") << ",\"count\":" << count;
      if (options->by_order) out << ",\"by_order\":" << nlohmann::ordered_json(by_order).dump();
      out << "}\n";
    } else {
      if (options->by_order)
        for (const auto& [order, n] : by_order) out << order << "  " << n << '\n';
      out << count << " valid configuration" << (count == 1 ? "" : "s") << " of world " << world << what;
      if (options->by_order) out << ", in " << orders_with_one << " of " << by_order.size() << " orders";
      out << '\n';
    }
    context.exit_code = kExitPass;
  });
}

}  // namespace tally::cli
