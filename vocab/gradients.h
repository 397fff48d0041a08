// The gradients of each logical param of a case, resolved once: the case's generator, zeros for a
// class outside the selected ones, or the values the case states for the param (a constant, a
// scale or a list). The path, the oracle and the manifest writer all read this one table.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "vocab/path_options.h"
#include "kernels/gradient_generator.h"
#include "topologies/logical_model.h"

namespace tally::vocab {

// Whether the case states any gradient values: in `gradients.stated` or a custom layout's own.
bool states_gradients(const GradientSpec& gradients, const topologies::ModelSpec& model);

// One spec per logical param, by id. A listed spec points at its values in `gradients` or in
// `model`'s spec, which must outlive the table.
std::vector<kernels::GeneratorSpec> param_generators(const GradientSpec& gradients,
                                                     const topologies::LogicalModel& model);

// The first stated gradient that cannot apply to `model`, as one line naming it and the rule:
// a name the model does not have, a class none of its params has, a list whose length is not
// the param's element count, a value that is not finite.
std::optional<std::string> check_stated(const GradientSpec& gradients, const topologies::LogicalModel& model);

// The rules a stated gradient obeys without the model: finite values of at most
// max_stated_magnitude(dtype) (a scale at most a ninth of it), a list of 1..kMaxStatedValues;
// `what` names it in the message.
std::optional<std::string> check_stated_gradient(const topologies::StatedGradient& gradient,
                                                 const std::string& what, kernels::Dtype dtype);
double max_stated_magnitude(kernels::Dtype dtype);

// The largest |value| the generator's mode gives (kernels/gradient_generator.h: normal and sparse
// at most 8.58, rank-encoded 8, zeros 0, the others 1).
double largest_generated(kernels::GradientMode mode);
// The largest |value| a stated gradient gives, a scale multiplying values of at most `generated`.
double largest_stated(const topologies::StatedGradient& gradient, double generated);
// The largest |gradient| of `gradients`: its generator's and every stated gradient's.
double largest_gradient(const GradientSpec& gradients);

// "p0 = 0.1", "expert-row-bias x 3", "w = [4 values]" for summaries.
std::string describe_stated(const GradientSpec& gradients, const topologies::ModelSpec& model);

}  // namespace tally::vocab
