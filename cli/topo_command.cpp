// tally topo: every process group of one configuration, as a table or as JSON.
#include <iomanip>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>

#include "cli/commands.h"
#include "cli/layout_json.h"
#include "cli/number_flags.h"
#include "cli/topology_flags.h"
#include "cli/usage_error.h"
#include "topologies/rank_layout.h"

namespace tally::cli {

namespace {

using topologies::Family;
using topologies::GroupId;
using topologies::RankLayout;

// The families `tally topo --json` prints, in its documented order.
constexpr std::array<Family, 15> kPrintedFamilies = {
    Family::tp,       Family::cp,         Family::dp,          Family::dp_cp,
    Family::pp,       Family::tp_pp,      Family::tp_cp,       Family::tp_dp_cp,
    Family::tp_dp,    Family::expt_tp,    Family::expt_ep,     Family::expt_dp,
    Family::expt_tp_ep, Family::expt_tp_ep_pp, Family::embedding};

struct TopoOptions {
  TopologyFlags topology;
  bool json = false;
  std::optional<int> rank;
  int max_groups = 8;
  bool all = false;
};

void write_ranks(std::ostream& out, std::span<const int> ranks) {
  out << '[';
  for (std::size_t i = 0; i < ranks.size(); ++i) out << (i ? "," : "") << ranks[i];
  out << ']';
}

void print_layout_json(std::ostream& out, const RankLayout& layout) {
  nlohmann::ordered_json j = config_json(layout);
  nlohmann::ordered_json& groups = j["groups"];
  std::vector<Family> printed(kPrintedFamilies.begin(), kPrintedFamilies.end());
  // megatron-core 0.19's GTP families, where the configuration has them.
  for (Family family : topologies::megatron_families(layout.config())
                           .subspan(topologies::kMegatron0161FamilyCount))
    printed.push_back(family);
  for (Family family : printed) {
    nlohmann::json list = nlohmann::json::array();
    for (int g = 0; g < layout.group_count(family); ++g) {
      std::span<const int> ranks = layout.ranks({family, g});
      list.push_back(std::vector<int>(ranks.begin(), ranks.end()));
    }
    groups[std::string(topologies::family_name(family))] = std::move(list);
  }
  out << j.dump() << '\n';
}

void print_header(std::ostream& out, const RankLayout& layout) {
  const topologies::ParallelConfig& c = layout.config();
  out << "world " << c.world << "  dense: tp " << c.tp << ", cp " << c.cp << ", pp " << c.pp
      << ", dp " << layout.dp();
  if (topologies::uses_gtp(c)) out << ", gtp " << c.gtp;
  out << "  expert: etp " << c.etp << ", ep " << c.ep << ", edp " << layout.edp();
  if (topologies::uses_gtp(c)) out << ", egtp " << c.egtp;
  out << "  order " << c.order;
  if (c.vpp != 1) out << "  vpp " << c.vpp;
  if (c.dist_opt_instances != 1) out << "  dist-opt instances " << c.dist_opt_instances;
  out << '\n';
}

void print_layout_table(std::ostream& out, const RankLayout& layout, int max_groups) {
  print_header(out, layout);
  out << '\n' << std::left << std::setw(18) << "family" << std::right << std::setw(7) << "groups"
      << std::setw(6) << "size" << "  ranks\n";
  bool truncated = false;
  for (Family family : topologies::megatron_families(layout.config())) {
    const int count = layout.group_count(family);
    out << std::left << std::setw(18) << topologies::family_name(family) << std::right
        << std::setw(7) << count << std::setw(6) << layout.ranks({family, 0}).size() << " ";
    const int shown = max_groups > 0 ? std::min(count, max_groups) : count;
    for (int g = 0; g < shown; ++g) {
      out << ' ';
      std::span<const int> ranks = layout.ranks({family, g});
      if (ranks.size() > 64) {
        out << '[' << ranks.front() << ',' << ranks[1] << ",...," << ranks.back() << "] ("
            << ranks.size() << " ranks)";
      } else {
        write_ranks(out, ranks);
      }
    }
    if (shown < count) {
      out << " ... " << count - shown << " more";
      truncated = true;
    }
    out << '\n';
  }
  if (truncated) out << "\n(--all lists every group; --json prints them as JSON)\n";
}

void print_rank(std::ostream& out, const RankLayout& layout, int rank, bool json) {
  const topologies::Coordinates c = layout.coordinates(rank);
  if (json) {
    nlohmann::ordered_json j = config_json(layout);
    j["rank"] = rank;
    j["coordinates"] = coordinates_json(layout, rank);
    nlohmann::ordered_json& groups = j["groups"];
    for (Family family : topologies::megatron_families(layout.config())) {
      const std::optional<GroupId> group = layout.group_of(family, rank);
      if (!group) {
        groups[std::string(topologies::family_name(family))] = nullptr;
        continue;
      }
      std::span<const int> ranks = layout.ranks(*group);
      groups[std::string(topologies::family_name(family))] = {
          {"group", group->index},
          {"index", layout.index_in(family, rank)},
          {"ranks", std::vector<int>(ranks.begin(), ranks.end())}};
    }
    out << j.dump() << '\n';
    return;
  }
  print_header(out, layout);
  const bool gtp = topologies::uses_gtp(layout.config());
  out << "\nrank " << rank << "  dense: tp " << c.tp << ", cp " << c.cp << ", dp " << c.dp
      << ", pp " << c.pp;
  if (gtp) out << ", gtp " << c.gtp;
  out << "  expert: etp " << c.etp << ", ep " << c.ep << ", edp " << c.edp;
  if (gtp) out << ", egtp " << c.egtp;
  out << "\n\n"
      << std::left << std::setw(18) << "family" << std::right << std::setw(7) << "group"
      << std::setw(7) << "index" << "  ranks\n";
  for (Family family : topologies::megatron_families(layout.config())) {
    out << std::left << std::setw(18) << topologies::family_name(family) << std::right;
    const std::optional<GroupId> group = layout.group_of(family, rank);
    if (!group) {
      out << std::setw(7) << "-" << std::setw(7) << "-" << "  (none: a middle pipeline stage)\n";
      continue;
    }
    out << std::setw(7) << group->index << std::setw(7) << layout.index_in(family, rank) << "  ";
    std::span<const int> ranks = layout.ranks(*group);
    if (ranks.size() > 64)
      out << '[' << ranks.front() << ",...," << ranks.back() << "] (" << ranks.size()
          << " ranks)";
    else
      write_ranks(out, ranks);
    out << '\n';
  }
}

}  // namespace

void add_topo_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<TopoOptions>();
  CLI::App* command = app.add_subcommand(
      "topo", "Print every process group of a configuration, as Megatron-LM lays out ranks");
  add_topology_flags(*command, options->topology, /*world_required=*/true);
  command->add_flag("--json", options->json, "Machine-readable output");
  command->add_option("--rank", options->rank,
                      "Show one rank: its coordinates and its group in every family")
      ->check(any_int());
  command->add_option("--max-groups", options->max_groups,
                      "Groups listed per family in the table (0: all)")
      ->check(any_int())
      ->capture_default_str();
  command->add_flag("--all", options->all, "List every group in the table");
  command->callback([options, &context] {
    const RankLayout layout(to_valid_config(options->topology));
    if (options->rank) {
      if (*options->rank < 0 || *options->rank >= layout.world())
        throw UsageError("--rank " + std::to_string(*options->rank) + " is outside world " +
                         std::to_string(layout.world()) + " (ranks are 0.." +
                         std::to_string(layout.world() - 1) + ")");
      print_rank(context.out, layout, *options->rank, options->json);
    } else if (options->json) {
      print_layout_json(context.out, layout);
    } else {
      if (options->max_groups < 0)
        throw UsageError("--max-groups must be at least 0 (got " +
                         std::to_string(options->max_groups) + ")");
      print_layout_table(context.out, layout, options->all ? 0 : options->max_groups);
    }
    context.exit_code = kExitPass;
  });
}

}  // namespace tally::cli
