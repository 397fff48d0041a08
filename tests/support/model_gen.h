// RapidCheck generators for (ParallelConfig, ModelSpec) pairs that tally accepts, by
// construction: every size that is split over tp, etp or ep is picked as a multiple of it.
// Models stay small (thousands of elements) so tests can count every element on every rank.
#pragma once

#include <rapidcheck.h>

#include <ostream>
#include <string>

#include "tests/support/config_gen.h"
#include "topologies/model_spec.h"

namespace tally::testing {

// valid_config plus virtual pipeline chunks (vpp 1 or 2 when pp > 1).
inline rc::Gen<topologies::ParallelConfig> valid_config_with_vpp(int max_factor = 3) {
  return rc::gen::exec([max_factor] {
    topologies::ParallelConfig c = *valid_config(max_factor);
    c.vpp = c.pp > 1 ? *rc::gen::inRange(1, 3) : 1;
    return c;
  });
}

// A GPT/MoE spec that passes check_model(spec, config).
inline rc::Gen<topologies::ModelSpec> gpt_spec_for(const topologies::ParallelConfig& c) {
  return rc::gen::exec([c] {
    using namespace topologies;
    ModelSpec s;
    s.kind = ModelKind::gpt;
    const int groups = c.tp * *rc::gen::inRange(1, 3);
    s.num_query_groups = groups;
    s.num_attention_heads = groups * *rc::gen::inRange(1, 3);
    s.mtp_num_layers = *rc::gen::inRange(0, 4) == 0 ? *rc::gen::inRange(1, 3) : 0;
    s.mtp_detach_heads = s.mtp_num_layers > 0 && *rc::gen::arbitrary<bool>();
    if (*rc::gen::arbitrary<bool>()) {
      s.kv_channels = *rc::gen::inRange(1, 4);
      s.hidden_size = *rc::gen::inRange(1, 9);
      if (s.mtp_num_layers > 0) s.hidden_size = c.tp * *rc::gen::inRange(1, 4);
    } else {
      s.kv_channels.reset();  // hidden / heads
      s.hidden_size = s.num_attention_heads * *rc::gen::inRange(1, 3);
      if (s.mtp_num_layers > 0) s.hidden_size *= c.tp;
    }
    s.vocab_size = c.tp * *rc::gen::inRange(1, 5);
    s.max_position_embeddings = *rc::gen::inRange(1, 6);
    s.ffn_hidden_size = c.tp * *rc::gen::inRange(1, 4);
    s.normalization = *rc::gen::element(Normalization::layer_norm, Normalization::rms_norm);
    s.qk_layernorm = *rc::gen::arbitrary<bool>();
    s.position_embedding =
        *rc::gen::element(PositionEmbedding::learned_absolute, PositionEmbedding::rope);
    s.softmax_type = *rc::gen::element(SoftmaxType::vanilla, SoftmaxType::learnable);
    s.untie_embeddings_and_output_weights = *rc::gen::arbitrary<bool>();
    s.swiglu = *rc::gen::arbitrary<bool>();
    const bool moe = c.ep > 1 || *rc::gen::arbitrary<bool>();
    if (moe) {
      s.num_experts = c.ep * *rc::gen::inRange(1, 4);
      s.moe_ffn_hidden_size = c.etp * *rc::gen::inRange(1, 3);
      s.moe_layer_freq = *rc::gen::inRange(1, 3);
    }
    // Megatron-LM: expert biases only with ETP 1; shared experts never have biases.
    s.add_bias_linear = !(moe && c.etp != 1) && *rc::gen::arbitrary<bool>();
    if (moe && !s.add_bias_linear && *rc::gen::arbitrary<bool>()) {
      s.moe_shared_expert_intermediate_size = c.tp * *rc::gen::inRange(1, 3);
      s.moe_shared_expert_gate = *rc::gen::arbitrary<bool>();
    }
    // Layers: even stages, or uneven first/last stages (multiples of vpp).
    const int stages = c.pp * c.vpp;
    if (c.pp > 1 && *rc::gen::inRange(0, 3) == 0) {
      const bool first = *rc::gen::arbitrary<bool>();
      const bool last = !first || *rc::gen::arbitrary<bool>();
      const int middle_stages = c.pp - (first ? 1 : 0) - (last ? 1 : 0);
      if (first) s.first_stage_layers = c.vpp * *rc::gen::inRange(1, 3);
      if (last) s.last_stage_layers = c.vpp * *rc::gen::inRange(1, 3);
      s.num_layers = s.first_stage_layers.value_or(0) + s.last_stage_layers.value_or(0) +
                     middle_stages * c.vpp * *rc::gen::inRange(1, 3);
    } else {
      s.num_layers = stages * *rc::gen::inRange(1, 3);
    }
    return s;
  });
}

// A custom layout that passes check_model(spec, config): 1..8 params of random classes.
inline rc::Gen<topologies::ModelSpec> custom_spec_for(const topologies::ParallelConfig& c) {
  return rc::gen::exec([c] {
    using namespace topologies;
    ModelSpec s;
    s.kind = ModelKind::custom;
    s.num_experts = c.ep * *rc::gen::inRange(1, 3);
    const int count = *rc::gen::inRange(1, 9);
    for (int i = 0; i < count; ++i) {
      CustomParam p;
      p.name = "p" + std::to_string(i);
      p.param_class = *rc::gen::elementOf(kAllParamClasses);
      const int dim = partition_dim(p.param_class);
      const int dims = std::max(dim + 1, *rc::gen::inRange(1, 4));
      for (int d = 0; d < dims; ++d) p.shape.push_back(*rc::gen::inRange(1, 4));
      if (dim >= 0) p.shape[dim] *= is_expert_class(p.param_class) ? c.etp : c.tp;
      p.stage = *rc::gen::inRange(0, c.pp);
      p.chunk = *rc::gen::inRange(0, c.vpp);
      if (is_expert_class(p.param_class)) p.expert = *rc::gen::inRange(0, s.num_experts);
      p.mtp = *rc::gen::inRange(0, 4) == 0;
      s.params.push_back(std::move(p));
    }
    if (*rc::gen::arbitrary<bool>()) {
      CustomParam tied;
      tied.name = "embedding";
      tied.param_class = ParamClass::vocab;
      tied.shape = {c.tp * *rc::gen::inRange(1, 4), *rc::gen::inRange(1, 4)};
      tied.tied = true;
      s.params.insert(s.params.begin(), std::move(tied));
    }
    return s;
  });
}

inline rc::Gen<topologies::ModelSpec> model_spec_for(const topologies::ParallelConfig& c) {
  return rc::gen::exec([c] {
    return *rc::gen::arbitrary<bool>() ? *custom_spec_for(c) : *gpt_spec_for(c);
  });
}

// A configuration and a model valid for it, printable in RapidCheck's counterexamples.
struct ModelCase {
  topologies::ParallelConfig config;
  topologies::ModelSpec spec;
};

inline void showValue(const ModelCase& c, std::ostream& os) {
  os << topologies::describe(c.config) << ", vpp " << c.config.vpp << "\n"
     << topologies::describe(c.spec);
  if (c.spec.kind == topologies::ModelKind::gpt)
    os << ", max_position_embeddings " << c.spec.max_position_embeddings << ", moe_layer_freq "
       << c.spec.moe_layer_freq;
  for (const topologies::CustomParam& p : c.spec.params) {
    os << "\n  " << p.name << " " << topologies::class_name(p.param_class) << " [";
    for (std::size_t i = 0; i < p.shape.size(); ++i) os << (i ? ", " : "") << p.shape[i];
    os << "] stage " << p.stage << " chunk " << p.chunk << " expert " << p.expert
       << (p.mtp ? " mtp" : "") << (p.tied ? " tied" : "");
  }
}

inline rc::Gen<ModelCase> valid_case(int max_factor = 3) {
  return rc::gen::exec([max_factor] {
    const topologies::ParallelConfig c = *valid_config_with_vpp(max_factor);
    return ModelCase{c, *model_spec_for(c)};
  });
}

}  // namespace tally::testing
