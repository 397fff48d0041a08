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

inline rc::Gen<ModelCase> valid_case(int max_factor = 3) {
  return rc::gen::exec([max_factor] {
    const topologies::ParallelConfig c = *valid_config_with_vpp(max_factor);
    return ModelCase{c, *model_spec_for(c)};
  });
}

}  // namespace tally::testing
