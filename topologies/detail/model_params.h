// The one walk over a ModelSpec's parameters, in Megatron-LM's module registration order. Both
// validation (bounds) and LogicalModel use it, so what is checked is what is built.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "topologies/model_spec.h"

namespace tally::topologies::detail {

// Where a parameter lives in the pipeline before sizes are known.
enum class Anchor : std::uint8_t {
  first_chunk,    // stage 0, chunk 0 (embeddings)
  decoder_layer,  // the (stage, chunk) that holds `layer`
  last_chunk,     // last stage, last chunk (final norm, output layer, MTP)
  explicit_stage  // a custom param's own stage and chunk
};

struct ParamDraft {
  // The name with "{L}" for the global decoder layer and "{E}" for the global expert, so the
  // local name (layers and experts numbered from 0 on each rank) comes from the same text.
  std::string pattern;
  ParamClass param_class = ParamClass::replicated;
  Shape shape;
  Anchor anchor = Anchor::first_chunk;
  int layer = -1;   // global decoder layer, -1 outside the decoder layers
  int expert = -1;  // global expert, -1 for non-expert params
  int stage = 0;    // explicit_stage only
  int chunk = 0;
  bool mtp_group = false;  // in the separate `mtp` grad-norm group
  bool output_layer = false;  // the untied output layer
  bool tied = false;       // the word embedding the output layer shares
  // The parameters of one expert are consecutive; expert_block_size > 0 on the first one says
  // how many there are (the sharding uses it to skip whole blocks of remote experts).
  int expert_block_size = 0;
};

// Replaces "{L}" and "{E}" in `pattern`.
std::string format_name(std::string_view pattern, int layer, int expert);

// Dims are saturated at kMaxElements + 1 so an oversized spec is reported, not overflowed.
std::int64_t saturated_numel(const Shape& shape);

// The number of parameters `for_each_param` visits, in O(1) for the GPT family (saturating).
std::int64_t param_count(const ModelSpec& spec);

// Decoder layers in each chunk of each stage (gpt; sizes that pass check_model).
std::vector<int> layers_per_chunk(const ModelSpec& spec, int pp, int vpp);

// Visits every parameter in order. Sizes must have passed the positivity checks.
void for_each_param(const ModelSpec& spec, const std::function<void(const ParamDraft&)>& visit);

}  // namespace tally::topologies::detail
