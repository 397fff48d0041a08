// tally layout: the logical parameters of a model and N, or what one rank holds of it.
#include <iomanip>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <ostream>
#include <sstream>

#include "cli/commands.h"
#include "cli/layout_json.h"
#include "cli/model_flags.h"
#include "cli/number_flags.h"
#include "cli/topology_flags.h"
#include "cli/usage_error.h"
#include "casefile/model_json.h"
#include "topologies/logical_model.h"
#include "topologies/rank_layout.h"
#include "topologies/sharding.h"

namespace tally::cli {

namespace {

using topologies::LocalParam;
using topologies::LogicalModel;
using topologies::LogicalParam;
using topologies::RankLayout;

struct LayoutOptions {
  TopologyFlags topology;
  ModelFlags model;
  std::optional<int> rank;
  bool json = false;
};

// Without --world: the smallest world both grids divide (dp = 1 where the expert grid allows).
topologies::ParallelConfig to_config(TopologyFlags flags) {
  if (flags.world == 0) {
    const std::int64_t dense = std::int64_t{flags.tp} * flags.cp * flags.pp;
    const std::int64_t expert = std::int64_t{flags.etp.value_or(flags.tp)} * flags.ep * flags.pp;
    if (dense >= 1 && expert >= 1) {
      const std::int64_t world = std::lcm(dense, expert);
      flags.world = world > topologies::kMaxWorld ? topologies::kMaxWorld + 1 : static_cast<int>(world);
    }
  }
  return to_valid_config(flags);
}

std::string ranks_string(std::span<const int> ranks) {
  std::string out = "[";
  if (ranks.size() > 16)
    return out + std::to_string(ranks.front()) + "," + std::to_string(ranks[1]) + ",...," +
           std::to_string(ranks.back()) + "] (" + std::to_string(ranks.size()) + " ranks)";
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? "," : "") + std::to_string(ranks[i]);
  return out + "]";
}

std::vector<std::int64_t> dims(const topologies::Shape& shape) {
  return {shape.dims.begin(), shape.dims.begin() + shape.rank};
}

void print_header(std::ostream& out, const LogicalModel& model, const RankLayout& layout) {
  const topologies::ParallelConfig& c = layout.config();
  out << "model  " << topologies::describe(model.spec()) << '\n'
      << "config world " << c.world << "  dense: tp " << c.tp << ", cp " << c.cp << ", pp " << c.pp
      << ", dp " << layout.dp();
  if (topologies::uses_gtp(c)) out << ", gtp " << c.gtp;
  out << "  expert: etp " << c.etp << ", ep " << c.ep << ", edp " << layout.edp();
  if (topologies::uses_gtp(c)) out << ", egtp " << c.egtp;
  out << "  order " << c.order;
  if (c.vpp != 1) out << "  vpp " << c.vpp;
  out << '\n';
}

std::string group_note(const LogicalModel& model, const LogicalParam& p) {
  std::string note(topologies::grad_norm_group_name(p.grad_norm_group));
  if (p.tied) {
    if (!note.empty()) note += ", ";
    note += "tied to the output layer";
  }
  if (p.id == model.last_stage_copy_of()) {
    if (!note.empty()) note += ", ";
    note += "shared copy on the last stage";
  }
  return note;
}

void print_params(std::ostream& out, const LogicalModel& model, const RankLayout& layout) {
  print_header(out, model, layout);
  std::size_t width = 4;
  for (const LogicalParam& p : model.params()) width = std::max(width, p.name.size());
  out << '\n' << std::right << std::setw(6) << "id" << "  " << std::left
      << std::setw(static_cast<int>(width)) << "name" << "  " << std::setw(18) << "class"
      << std::setw(14) << "shape" << std::right << std::setw(12) << "numel" << std::setw(7)
      << "stage" << std::setw(7) << "chunk" << std::setw(8) << "expert" << "  notes\n";
  for (const LogicalParam& p : model.params()) {
    out << std::right << std::setw(6) << p.id << "  " << std::left
        << std::setw(static_cast<int>(width)) << p.name << "  " << std::setw(18)
        << topologies::class_name(p.param_class) << std::setw(14) << topologies::shape_string(p.shape)
        << std::right << std::setw(12) << p.numel << std::setw(7) << p.stage << std::setw(7)
        << p.chunk << std::setw(8) << (p.expert >= 0 ? std::to_string(p.expert) : "-");
    const std::string note = group_note(model, p);
    out << (note.empty() ? "" : "  ") << note << '\n';
  }
  out << "\nN = " << model.total_elements() << " elements in " << model.size() << " parameters";
  const std::int64_t mtp = model.total_elements(topologies::GradNormGroup::mtp);
  if (mtp > 0) out << " (" << mtp << " of them in the mtp grad-norm group)";
  out << '\n';
  if (model.last_stage_copy() != topologies::SharedCopy::none)
    out << "the last stage also holds " << model.local_name(model.last_stage_copy())
        << ", a shared copy of " << model.param(model.last_stage_copy_of()).name
        << ": never counted\n";
}

nlohmann::ordered_json params_json(const LogicalModel& model, const RankLayout& layout) {
  nlohmann::ordered_json j;
  j["model"] = casefile::model_spec_to_json(model.spec());
  j["config"] = config_json(layout);
  nlohmann::ordered_json params = nlohmann::ordered_json::array();
  for (const LogicalParam& p : model.params()) {
    nlohmann::ordered_json q;
    q["id"] = p.id;
    q["name"] = p.name;
    q["class"] = topologies::class_name(p.param_class);
    q["shape"] = dims(p.shape);
    q["numel"] = p.numel;
    q["stage"] = p.stage;
    q["chunk"] = p.chunk;
    q["expert"] = p.expert;
    q["grad_norm_group"] = topologies::grad_norm_group_name(p.grad_norm_group);
    q["tied"] = p.tied;
    params.push_back(std::move(q));
  }
  j["params"] = std::move(params);
  j["total_elements"] = model.total_elements();
  j["mtp_elements"] = model.total_elements(topologies::GradNormGroup::mtp);
  if (model.last_stage_copy() != topologies::SharedCopy::none)
    j["last_stage_copy"] = {{"local_name", model.local_name(model.last_stage_copy())},
                            {"copy_of", model.last_stage_copy_of()}};
  else
    j["last_stage_copy"] = nullptr;
  return j;
}

// Megatron-LM's duplicate filter (HEAD semantics): never a shared copy; a distinct shard always;
// a replicated param on rank 0 of its replication group.
struct Verdict {
  bool counted = false;
  std::string why;
};

Verdict judge(const RankLayout& layout, int rank, const LocalParam& p) {
  if (p.shared) return {false, "never counted (shared copy)"};
  auto where = [&](topologies::Family family) {
    return std::string(topologies::family_name(family)) + " index " +
           std::to_string(layout.index_in(family, rank)) + " of " +
           ranks_string(layout.group_ranks(family, rank));
  };
  if (const topologies::GtpCheck gtp = topologies::gtp_check(p, layout, rank); !gtp.keeps)
    return {false, "dropped (" + where(gtp.family) + ")"};
  if (p.tensor_model_parallel) return {true, "counted (distinct shard)"};
  const topologies::Family family = topologies::replication_family(p);
  const bool first = layout.index_in(family, rank) == 0;
  return {first, (first ? "counted (" : "dropped (") + where(family) + ")"};
}

std::string attributes(const LocalParam& p) {
  std::string out;
  auto add = [&out](const std::string& text) { out += (out.empty() ? "" : " ") + text; };
  if (p.tensor_model_parallel) add("tmp dim " + std::to_string(p.partition_dim));
  if (p.gtp_weight_remat) add("gtp shard");
  if (!p.allreduce) add("allreduce=false");
  if (p.shared) add("shared");
  if (p.grad_norm_group != topologies::GradNormGroup::main)
    add("grad_norm_group=" + std::string(topologies::grad_norm_group_name(p.grad_norm_group)));
  return out.empty() ? "-" : out;
}

void print_rank(std::ostream& out, const LogicalModel& model, const RankLayout& layout, int rank,
                bool json) {
  const std::vector<LocalParam> locals = topologies::local_params(model, layout, rank);
  const topologies::Coordinates c = layout.coordinates(rank);
  if (json) {
    nlohmann::ordered_json j;
    j["model"] = casefile::model_spec_to_json(model.spec());
    j["config"] = config_json(layout);
    j["rank"] = rank;
    j["coordinates"] = coordinates_json(layout, rank);
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const LocalParam& p : locals) {
      const LogicalParam& logical = model.param(p.logical_id);
      const Verdict verdict = judge(layout, rank, p);
      const topologies::Family family = topologies::replication_family(p);
      nlohmann::ordered_json q;
      q["local_name"] = topologies::local_name(model, p);
      q["logical_id"] = p.logical_id;
      q["name"] = logical.name;
      q["class"] = topologies::class_name(p.param_class);
      q["offset"] = std::vector<std::int64_t>(p.slice.offset.begin(), p.slice.offset.begin() + p.slice.rank);
      q["extent"] = std::vector<std::int64_t>(p.slice.extent.begin(), p.slice.extent.begin() + p.slice.rank);
      q["numel"] = p.slice.numel();
      q["chunk"] = p.vpp_chunk;
      q["local_expert"] = p.local_expert;
      q["tensor_model_parallel"] = p.tensor_model_parallel;
      q["partition_dim"] = p.partition_dim;
      q["allreduce"] = p.allreduce;
      q["shared"] = p.shared;
      q["grad_norm_group"] = topologies::grad_norm_group_name(p.grad_norm_group);
      if (topologies::uses_gtp(layout.config())) {
        const topologies::Family gtp = topologies::gtp_replication_family(p);
        q["is_gtp_weight_remat"] = p.gtp_weight_remat;
        q["gtp_family"] = topologies::family_name(gtp);
        q["gtp_index"] = layout.index_in(gtp, rank);
      }
      q["replication_family"] = topologies::family_name(family);
      q["replication_index"] = layout.index_in(family, rank);
      q["counted"] = verdict.counted;
      list.push_back(std::move(q));
    }
    j["local_params"] = std::move(list);
    out << j.dump() << '\n';
    return;
  }
  print_header(out, model, layout);
  const bool gtp = topologies::uses_gtp(layout.config());
  out << "rank   " << rank << "  dense: tp " << c.tp << ", cp " << c.cp << ", dp " << c.dp
      << ", pp " << c.pp;
  if (gtp) out << ", gtp " << c.gtp;
  out << "  expert: etp " << c.etp << ", ep " << c.ep << ", edp " << c.edp;
  if (gtp) out << ", egtp " << c.egtp;
  out << "\n\n";
  std::size_t local_width = 10, name_width = 12, slice_width = 5;
  std::vector<std::string> local_names, slices;
  for (const LocalParam& p : locals) {
    local_names.push_back(topologies::local_name(model, p));
    slices.push_back(topologies::slice_string(p.slice));
    local_width = std::max(local_width, local_names.back().size());
    name_width = std::max(name_width, model.param(p.logical_id).name.size());
    slice_width = std::max(slice_width, slices.back().size());
  }
  out << std::left << std::setw(static_cast<int>(local_width)) << "local name" << "  "
      << std::setw(static_cast<int>(name_width) + 9) << "logical param" << std::setw(static_cast<int>(slice_width))
      << "slice" << std::right << std::setw(10) << "numel" << "  " << std::left << std::setw(32)
      << "attributes" << "duplicate filter\n";
  std::int64_t held = 0, counted = 0;
  for (std::size_t i = 0; i < locals.size(); ++i) {
    const LocalParam& p = locals[i];
    const Verdict verdict = judge(layout, rank, p);
    held += p.slice.numel();
    if (verdict.counted) counted += p.slice.numel();
    std::ostringstream logical;
    logical << std::right << std::setw(5) << p.logical_id << "  " << model.param(p.logical_id).name;
    out << std::left << std::setw(static_cast<int>(local_width)) << local_names[i] << "  "
        << std::setw(static_cast<int>(name_width) + 9) << logical.str()
        << std::setw(static_cast<int>(slice_width)) << slices[i] << std::right << std::setw(10) << p.slice.numel()
        << "  " << std::left << std::setw(32) << attributes(p) << verdict.why << '\n';
  }
  out << "\nrank " << rank << " holds " << locals.size() << " local params, " << held
      << " elements; the duplicate filter counts " << counted << " of them\n";
}

}  // namespace

void add_layout_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<LayoutOptions>();
  CLI::App* command = app.add_subcommand(
      "layout",
      "The logical parameters of a model (names, classes, shapes, stages) and their element "
      "count N, or what one rank holds: slices, Megatron-LM attributes and the duplicate filter. "
      "Without --world, the smallest world the sizes allow");
  add_topology_flags(*command, options->topology, /*world_required=*/false);
  add_model_flags(*command, options->model);
  command->add_option("--rank", options->rank, "Show what this rank holds")->check(any_int());
  command->add_flag("--json", options->json, "Machine-readable output");
  command->callback([options, &context] {
    const RankLayout layout(to_config(options->topology));
    std::optional<LogicalModel> model;
    try {
      model.emplace(to_model_spec(options->model, layout.config()), layout.config());
    } catch (const topologies::InvalidModel& error) {
      throw UsageError(error.what());
    }
    // The layout is Megatron-LM's (its attributes and duplicate filter), so its build rules hold.
    if (std::optional<std::string> error = topologies::check_megatron_expert_bias(model->spec(), layout.config()))
      throw UsageError(*error);
    if (options->rank) {
      if (*options->rank < 0 || *options->rank >= layout.world())
        throw UsageError("--rank " + std::to_string(*options->rank) + " is outside world " +
                         std::to_string(layout.world()) + " (ranks are 0.." +
                         std::to_string(layout.world() - 1) + ")");
      print_rank(context.out, *model, layout, *options->rank, options->json);
    } else if (options->json) {
      context.out << params_json(*model, layout).dump() << '\n';
    } else {
      print_params(context.out, *model, layout);
    }
    context.exit_code = kExitPass;
  });
}

}  // namespace tally::cli
