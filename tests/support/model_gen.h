// RapidCheck generators for (ParallelConfig, ModelSpec) pairs that tally accepts, by
// construction (fuzz/generators.h): every size that is split over tp, etp or ep is picked as a
// multiple of it. Models stay small (thousands of elements) so tests can count every element on
// every rank.
#pragma once

#include <rapidcheck.h>

#include <ostream>
#include <string>

#include "fuzz/generators.h"
#include "tests/support/config_gen.h"
#include "topologies/model_spec.h"

namespace tally::testing {

// valid_config plus virtual pipeline chunks (vpp 1 or 2 when pp > 1).
inline rc::Gen<topologies::ParallelConfig> valid_config_with_vpp(int max_factor = 3) {
  return fuzz::gen_config(test_topology(max_factor, 2));
}

// Specs that pass check_model(spec, config): the generators of fuzz/generators.h.
inline rc::Gen<topologies::ModelSpec> gpt_spec_for(const topologies::ParallelConfig& c) {
  return fuzz::gen_gpt_model(c);
}
inline rc::Gen<topologies::ModelSpec> custom_spec_for(const topologies::ParallelConfig& c) {
  return fuzz::gen_custom_model(c);
}
inline rc::Gen<topologies::ModelSpec> model_spec_for(const topologies::ParallelConfig& c) {
  return fuzz::gen_model(c);
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

// A GPT spec's attention made multi-latent (DeepSeek's), with small sizes: no GQA, its own heads.
inline topologies::ModelSpec with_multi_latent_attention(topologies::ModelSpec s) {
  s.multi_latent_attention = true;
  s.num_query_groups.reset();
  s.kv_channels.reset();
  s.q_lora_rank = *rc::gen::element<std::optional<int>>(std::nullopt, 1, 3);
  s.kv_lora_rank = *rc::gen::inRange(1, 4);
  s.qk_head_dim = *rc::gen::inRange(1, 3);
  s.qk_pos_emb_head_dim = *rc::gen::inRange(1, 3);
  s.v_head_dim = *rc::gen::inRange(1, 3);
  return s;
}

// A GPT model's attention is multi-latent one time in four (the fuzz generator draws it only for
// the deepseek-v3 preset, which keeps campaigns' seeds).
inline rc::Gen<ModelCase> valid_case(int max_factor = 3) {
  return rc::gen::exec([max_factor] {
    const topologies::ParallelConfig c = *valid_config_with_vpp(max_factor);
    topologies::ModelSpec spec = *model_spec_for(c);
    if (spec.kind == topologies::ModelKind::gpt && *rc::gen::inRange(0, 4) == 0)
      spec = with_multi_latent_attention(std::move(spec));
    return ModelCase{c, std::move(spec)};
  });
}

}  // namespace tally::testing
