// LogicalModel: the parameters of the unsharded model in a fixed order (Megatron-LM's module
// registration order), with names that use global layer and expert ids. The list (names,
// shapes, classes, N) depends on the ModelSpec only; the pipeline placement of each parameter
// (stage, chunk) on pp and vpp, which is why a LogicalModel is built for a configuration.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "topologies/model_spec.h"
#include "topologies/parallel_config.h"

namespace tally::topologies {

enum class GradNormGroup : std::uint8_t { main, mtp };
// Megatron-LM's grad_norm_group attribute: "" (absent) or "mtp".
std::string_view grad_norm_group_name(GradNormGroup group);

struct LogicalParam {
  int id = 0;        // index in LogicalModel::params()
  std::string name;  // global ids: "decoder.layers.3.mlp.experts.local_experts.5.linear_fc2.bias"
  ParamClass param_class = ParamClass::replicated;
  Shape shape;
  std::int64_t numel = 0;
  int stage = 0;   // pipeline stage
  int chunk = 0;   // virtual pipeline chunk on that stage
  int layer = -1;  // global decoder layer; -1 outside decoder layers (MTP layers included)
  int expert = -1;  // global expert; -1 for non-expert params
  GradNormGroup grad_norm_group = GradNormGroup::main;
  // The word embedding the output layer shares: with pp > 1 the last stage holds a `shared`
  // copy of it; with pp == 1 it is one parameter, counted once.
  bool tied = false;
  // Megatron-LM's is_embedding_or_output_parameter: the word embedding (and any vocab-parallel
  // param) and the untied output layer. Emerging optimizers leave these to Adam.
  bool embedding_or_output = false;
};

// The sizes a LogicalModel was validated for; the sharding checks a RankLayout against them.
struct ModelPlacement {
  int tp = 1, etp = 1, ep = 1, pp = 1, vpp = 1;
  int gtp = 1, egtp = 1;
  friend bool operator==(const ModelPlacement&, const ModelPlacement&) = default;
};

class InvalidModel : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The extra copies of the word embedding on the last stage when pp > 1 (Megatron-LM's
// setup_embeddings_and_output_layer): all carry `shared` and are never counted.
enum class SharedCopy : std::uint8_t {
  none,
  output_layer,  // tied output layer on the last stage
  mtp_embedding  // the MTP stage's embedding (when MTP layers exist)
};

class LogicalModel {
 public:
  // Throws InvalidModel with check_model(spec, config)'s message. `config` must pass
  // check_config; the default is a single rank.
  explicit LogicalModel(ModelSpec spec, const ParallelConfig& config = {});

  const ModelSpec& spec() const { return spec_; }
  const ModelPlacement& placement() const { return placement_; }
  std::span<const LogicalParam> params() const { return params_; }
  const LogicalParam& param(int id) const { return params_.at(id); }
  int size() const { return static_cast<int>(params_.size()); }
  std::int64_t total_elements() const { return total_; }  // N, every logical element once
  std::int64_t total_elements(GradNormGroup group) const;
  int num_experts() const { return spec_.num_experts; }
  int experts_per_ep_rank() const { return placement_.ep > 0 ? spec_.num_experts / placement_.ep : 0; }

  // The tied word embedding (LogicalParam::tied), or -1.
  int tied_embedding() const { return tied_id_; }
  // The copy of the word embedding the last stage holds when pp > 1 (SharedCopy::none when it
  // holds none), and the id of the param it copies (-1 when none).
  SharedCopy last_stage_copy() const { return copy_; }
  int last_stage_copy_of() const { return copy_of_; }

  // Megatron-LM's name on a rank: decoder layers numbered from 0 on every (stage, chunk),
  // routed experts numbered within their EP rank. `local_expert` is ignored for non-experts.
  std::string local_name(int id, int local_expert) const;
  std::string local_name(SharedCopy copy) const;  // "output_layer.weight", ...

  // The parameters of one (stage, chunk), in order, as runs of consecutive ids. A run whose
  // expert_block_size is k > 0 holds whole experts: k params for each of its experts, starting
  // at first_expert, so a rank can take just its own experts without walking the others.
  struct Run {
    int begin = 0, end = 0;
    int expert_block_size = 0;
    int first_expert = -1;
  };
  struct ChunkRuns {
    int chunk = 0;
    std::vector<Run> runs;
  };
  // The chunks of `stage` that hold parameters, ascending (never more than the parameters, so
  // a huge vpp costs nothing).
  std::span<const ChunkRuns> chunks(int stage) const { return by_stage_.at(stage); }
  std::span<const Run> runs(int stage, int chunk) const;  // empty when the chunk holds none

 private:
  ModelSpec spec_;
  ModelPlacement placement_;
  std::vector<LogicalParam> params_;
  // Names with {L} / {E}: each distinct one once (a layer's patterns repeat in every layer), and
  // per param its index.
  std::vector<std::string> patterns_;
  std::vector<std::uint32_t> pattern_of_;  // kNameIsPattern: no placeholder, the name itself
  static constexpr std::uint32_t kNameIsPattern = 0xffffffffu;
  std::vector<std::vector<ChunkRuns>> by_stage_;
  std::vector<int> chunk_first_layer_;  // gpt: first decoder layer of stage * vpp + chunk
  std::int64_t total_ = 0;
  int tied_id_ = -1;
  int copy_of_ = -1;
  SharedCopy copy_ = SharedCopy::none;
};

}  // namespace tally::topologies
