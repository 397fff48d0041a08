// RapidCheck generators for whole cases: parallel configurations valid by construction (every
// axis, every order Megatron-LM accepts, worlds up to a bound), GPT/MoE and custom layouts,
// optimizer models, gradient modes and dtypes, clipping, p-norms, and one fault per case.
//
// How they shrink. Every choice is one pick of an index that RapidCheck shrinks towards 0, and
// index 0 is always the simplest choice: size 1 for an axis, the default order, one layer per
// chunk, the fewest experts, the smallest hidden size, a feature switched off. Picks are made in
// a fixed sequence whatever their values (a value a configuration makes irrelevant is still
// picked, then ignored), and a pick is a multiplier or a raw index, not a size computed from the
// configuration: when an early pick shrinks (pp 4 -> 2), RapidCheck regenerates every later pick
// from the same random stream, so the model keeps its shape (the same layers per chunk, the same
// experts per EP rank) on the smaller world. A case picks, in this order: its fault, its
// scenario, the configuration (pp, tp, cp, dp, etp, ep, vpp, order, instances), the model, then
// the optimizer and gradients; shrinking walks them in the same order, so the world shrinks
// first, then layers and experts, then sizes, then options.
//
// RapidCheck's size parameter (0..100) bounds the world when `grow_with_size` is set: worlds of
// at most max_world^(size/100) ranks, so small sizes give small worlds.
#pragma once

#include <string_view>

#include <rapidcheck.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "casefile/case.h"
#include "vocab/faults.h"
#include "topologies/model_spec.h"
#include "topologies/presets.h"
#include "topologies/parallel_config.h"

namespace tally::fuzz {

struct TopologyGenOptions {
  int max_world = 64;          // no world larger than this
  int max_axis = 0;            // tp, cp, pp and dp at most this (0: no bound); etp and ep divide
                               // tp * cp * dp
  bool grow_with_size = true;  // the world bound grows with RapidCheck's size (see above)
  int max_vpp = 3;             // virtual pipeline chunks per stage, when pp > 1
  // Every configuration has exactly this world (0: any): the world of an mpi or nccl job,
  // whose process count is fixed. The axes are then divisors of it.
  int exact_world = 0;
  // Leave out the corner where Megatron-LM's own layout miscounts without any fault: EP 1 and
  // ETP = TP (experts treated as dense) while the ETP groups differ from the TP groups. Several
  // distributed-optimizer instances are generated in the default order only, always (in other
  // orders an instance need not hold whole partial data-parallel groups).
  bool avoid_megatron_corners = true;
};

// Whether Megatron-LM's layout assumptions hold for `config`, so that a fault-free path must
// pass: the ETP groups equal the TP groups whenever experts are treated as dense (EP 1, ETP =
// TP), and several distributed-optimizer instances only in the default order.
bool megatron_layout_assumptions_hold(const topologies::ParallelConfig& config);
// The first of those corners alone: experts treated as dense (EP 1, ETP = TP, EGTP = GTP) whose
// ETP (EGTP) groups are not the TP (GTP) groups.
bool experts_as_dense_with_other_groups(const topologies::ParallelConfig& config);
// The second, exactly: several distributed-optimizer instances whose grad-stats groups (the ranks of
// one instance, which megatron-core builds from the expert grid) do not hold, of each rank's DP-CP
// group (or EDP group), just the contiguous slice its instance shards over. Then every rank counts
// some dense shards twice and others not at all. Megatron-LM's two orders never do; most others can.
bool instances_split_their_shards(const topologies::ParallelConfig& config);

// Megatron-LM's own layout corners, where its groups miscount with no fault: a defect of the groups,
// not of a norm code, each written up in docs/findings.
enum class LayoutCorner { none, experts_as_dense, instances_split_their_shards };
LayoutCorner megatron_layout_corner(const topologies::ParallelConfig& config);
std::string_view layout_corner_name(LayoutCorner corner);  // "experts as dense with ETP groups unlike TP groups

// A configuration that passes check_config.
rc::Gen<topologies::ParallelConfig> gen_config(const TopologyGenOptions& options = {});

// Models that pass check_model(spec, config). Small: hundreds to a few thousand elements.
rc::Gen<topologies::ModelSpec> gen_gpt_model(const topologies::ParallelConfig& config);
rc::Gen<topologies::ModelSpec> gen_custom_model(const topologies::ParallelConfig& config);
rc::Gen<topologies::ModelSpec> gen_model(const topologies::ParallelConfig& config);

// Optimizer model, gradient mode, dtype, seed and class mask, accumulation, clipping, p-norms,
// bucket size; never faults. Passes casefile::check_case for any config and model.
rc::Gen<vocab::PathOptions> gen_path_options();

// The element count of the big tensor of the big-zeros scenario: 2^24 + 1, more than a float32
// zero count can hold exactly.
inline constexpr std::int64_t kBigZerosElements = (std::int64_t{1} << 24) + 1;

struct CaseGenOptions {
  TopologyGenOptions topology;
  // Each case switches on one of these, drawn uniformly (never shrunk); empty: no fault.
  std::vector<vocab::Fault> faults;
  // The big-zeros scenario: a world of at most 4 ranks, a custom layout with one replicated
  // tensor of kBigZerosElements elements, all-zero gradients. It is the only trigger of
  // zero-count-in-float32, and one such case costs as much as about a thousand ordinary ones
  // (75 ms against 80 us), so it is rare: one case in `big_zeros_one_in`, except cases whose
  // fault is zero-count-in-float32 (one in `big_zeros_one_in_for_its_fault`). 0: never.
  int big_zeros_one_in = 20000;
  int big_zeros_one_in_for_its_fault = 20;
  // GPT models only and never the big-zeros scenario: a real framework builds no custom layout.
  // The picks are made all the same, so a campaign's other choices do not move.
  bool gpt_only = false;
  // Non-empty: every case's model is one of these architecture presets (drawn uniformly) laid out on
  // its configuration, which is drawn again where the drawn preset has no model (never the
  // big-zeros scenario). Empty: tally's generated models, with the same picks as ever.
  std::vector<topologies::Preset> presets;
  // Applied to every generated case and to every shrink of it: a real target's limits
  // (run::Target::within). Empty: none.
  std::function<casefile::Case(casefile::Case)> restrict_to;
  // Only the cases it keeps, and only such shrinks (after restrict_to): `--norm-code`, a campaign
  // of one norm code of a real target. It must keep some of the cases: the generator gives up
  // (rc::GenerationFailure) after kKeepOnlyDraws draws in a row it drops. Empty: every case.
  std::function<bool(const casefile::Case&)> keep_only;
};
// How many draws in a row keep_only may drop before the generator gives up.
inline constexpr int kKeepOnlyDraws = 20000;
// How many configurations a case with presets may draw before one lays out its preset.
inline constexpr int kPresetDraws = 1000;

// A whole case (topology, model, path options with its fault); passes casefile::check_case. Its
// description is empty (the campaign names it). Its expectation is unset.
rc::Gen<casefile::Case> gen_case(const CaseGenOptions& options);

// casefile::Case `index` of a campaign with seed `campaign_seed`: gen_case run with
// rc::Random(case_seed(campaign_seed, index)) at size case_size_param(index), so a campaign is
// repeated exactly from its seed. Sizes sweep 0..100 over every 101 cases: worlds from one
// rank up to max_world, again and again.
std::uint64_t case_seed(std::uint64_t campaign_seed, std::int64_t index);
int case_size_param(std::int64_t index);
rc::Shrinkable<casefile::Case> generate_case(const CaseGenOptions& options, std::uint64_t campaign_seed,
                                   std::int64_t index);

// Every parallel axis, layer, expert and parameter count of a case, for tests and reports.
struct CaseSize {
  int world = 1;
  int layers = 0;       // decoder layers (gpt) or 0 (custom)
  int experts = 0;      // num_experts
  int params = 0;       // logical parameters
  std::int64_t elements = 0;
};
CaseSize case_size(const casefile::Case& c);

}  // namespace tally::fuzz
