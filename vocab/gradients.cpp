#include "vocab/gradients.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "record/text.h"

namespace tally::vocab {

namespace {

using topologies::StatedGradient;

kernels::GeneratorSpec stated_spec(const kernels::GeneratorSpec& generator, const StatedGradient& g) {
  kernels::GeneratorSpec spec = generator;
  switch (g.kind) {
    case StatedGradient::Kind::constant:
      spec.stated = {kernels::StatedValues::Kind::constant, g.number, nullptr, 0};
      break;
    case StatedGradient::Kind::scale:
      spec.stated = {kernels::StatedValues::Kind::scaled, g.number, nullptr, 0};
      break;
    case StatedGradient::Kind::values:
      spec.stated = {kernels::StatedValues::Kind::listed, 0.0, g.values.data(),
                     static_cast<std::int64_t>(g.values.size())};
      break;
  }
  return spec;
}

std::string selector_text(const StatedFor& s) {
  return s.param.empty() ? "class " + std::string(topologies::class_name(*s.param_class))
                         : "param '" + s.param + "'";
}

std::string gradient_text(const StatedGradient& g) {
  switch (g.kind) {
    case StatedGradient::Kind::constant: return "= " + record::all_digits(g.number);
    case StatedGradient::Kind::scale: return "x " + record::all_digits(g.number);
    case StatedGradient::Kind::values: return "= [" + std::to_string(g.values.size()) + " values]";
  }
  return "";
}

}  // namespace

bool states_gradients(const GradientSpec& gradients, const topologies::ModelSpec& model) {
  return !gradients.stated.empty() ||
         std::any_of(model.params.begin(), model.params.end(),
                     [](const topologies::CustomParam& p) { return p.gradient.has_value(); });
}

std::vector<kernels::GeneratorSpec> param_generators(const GradientSpec& gradients,
                                                     const topologies::LogicalModel& model) {
  std::vector<kernels::GeneratorSpec> specs;
  specs.reserve(static_cast<std::size_t>(model.size()));
  kernels::GeneratorSpec zero = gradients.generator;
  zero.mode = kernels::GradientMode::zeros;
  for (const topologies::LogicalParam& p : model.params())
    specs.push_back((gradients.class_mask & class_bit(p.param_class)) ? gradients.generator : zero);
  if (gradients.stated.empty() && model.spec().kind != topologies::ModelKind::custom) return specs;

  std::unordered_map<std::string_view, int> by_name;
  for (const topologies::LogicalParam& p : model.params()) by_name.emplace(p.name, p.id);
  for (const topologies::CustomParam& c : model.spec().params)
    if (c.gradient)
      if (auto it = by_name.find(c.name); it != by_name.end())
        specs[static_cast<std::size_t>(it->second)] = stated_spec(gradients.generator, *c.gradient);
  // A scale multiplies the generated values, which are zeros where the class mask leaves the
  // param's class out (docs/case-files.md): it leaves those zeros.
  auto state = [&](int id, const StatedGradient& g) {
    const topologies::ParamClass c = model.param(id).param_class;
    if (g.kind == StatedGradient::Kind::scale && !(gradients.class_mask & class_bit(c))) {
      specs[static_cast<std::size_t>(id)] = zero;
      return;
    }
    specs[static_cast<std::size_t>(id)] = stated_spec(gradients.generator, g);
  };
  for (const StatedFor& s : gradients.stated) {
    if (!s.param.empty()) {
      if (auto it = by_name.find(s.param); it != by_name.end()) state(it->second, s.gradient);
      continue;
    }
    for (const topologies::LogicalParam& p : model.params())
      if (s.param_class && p.param_class == *s.param_class) state(p.id, s.gradient);
  }
  return specs;
}

std::optional<std::string> check_stated_gradient(const StatedGradient& g, const std::string& what,
                                                 kernels::Dtype dtype) {
  const double limit = max_stated_magnitude(dtype);
  // A generated value is at most 8.58 in magnitude (the normal mode's largest).
  const double scale_limit = limit / 9.0;
  auto bad = [&](double v, const std::string& which, double bound) -> std::optional<std::string> {
    if (!std::isfinite(v)) return what + ": " + which + " must be a finite number";
    if (std::abs(v) > bound)
      return what + ": " + which + " " + record::all_digits(v) + " is larger in magnitude than " +
             record::all_digits(bound) + ", the largest tally accepts for " +
             std::string(kernels::dtype_name(dtype)) + " gradients";
    return std::nullopt;
  };
  switch (g.kind) {
    case StatedGradient::Kind::constant: return bad(g.number, "the constant", limit);
    case StatedGradient::Kind::scale: return bad(g.number, "the scale", scale_limit);
    case StatedGradient::Kind::values:
      if (g.values.empty()) return what + ": the list of values is empty";
      if (static_cast<std::int64_t>(g.values.size()) > topologies::kMaxStatedValues)
        return what + ": " + std::to_string(g.values.size()) + " values, at most " +
               std::to_string(topologies::kMaxStatedValues) + " (state a constant or a scale for big params)";
      for (std::size_t i = 0; i < g.values.size(); ++i)
        if (auto error = bad(g.values[i], "value " + std::to_string(i), limit)) return error;
      return std::nullopt;
  }
  return std::nullopt;
}

double max_stated_magnitude(kernels::Dtype dtype) {
  // fp16's largest finite value; elsewhere squares of 2^50 summed over a million elements stay
  // finite even in fp32 accumulation.
  return dtype == kernels::Dtype::fp16 ? 65504.0 : 0x1p50;
}

double largest_generated(kernels::GradientMode mode) {
  using kernels::GradientMode;
  switch (mode) {
    case GradientMode::normal:
    case GradientMode::sparse: return 8.58;
    case GradientMode::rank_encoded: return 8.0;
    case GradientMode::zeros: return 0.0;
    case GradientMode::ones:
    case GradientMode::dyadic:
    case GradientMode::uniform: return 1.0;
  }
  return 8.58;
}

double largest_stated(const StatedGradient& g, double generated) {
  switch (g.kind) {
    case StatedGradient::Kind::constant: return std::abs(g.number);
    case StatedGradient::Kind::scale: return std::abs(g.number) * generated;
    case StatedGradient::Kind::values: {
      double largest = 0.0;
      for (double v : g.values) largest = std::max(largest, std::abs(v));
      return largest;
    }
  }
  return 0.0;
}

double largest_gradient(const GradientSpec& gradients) {
  const double generated = largest_generated(gradients.generator.mode);
  double largest = generated;
  for (const StatedFor& s : gradients.stated) largest = std::max(largest, largest_stated(s.gradient, generated));
  return largest;
}

namespace {

// The sum of squares of every element at the largest stated magnitude must stay finite in a
// float32 local sum: N * m^2 <= 2^126, so m <= 2^63 / sqrt(N) (a scale: a ninth of it, a
// generated value being at most 8.58).
std::optional<std::string> check_stated_sum(const StatedGradient& g, const std::string& what,
                                            std::int64_t elements) {
  const double limit = std::ldexp(1.0, 63) / std::sqrt(static_cast<double>(std::max<std::int64_t>(1, elements)));
  const double largest = largest_stated(g, 9.0);
  if (largest <= limit) return std::nullopt;
  return what + ": magnitude " + record::all_digits(largest) + " over the model's " +
         std::to_string(elements) + " elements could overflow a float32 sum of squares (at most " +
         record::all_digits(limit) + " for a model of this size)";
}

}  // namespace

std::optional<std::string> check_stated(const GradientSpec& gradients, const topologies::LogicalModel& model) {
  std::unordered_map<std::string_view, const topologies::LogicalParam*> by_name;
  for (const topologies::LogicalParam& p : model.params()) by_name.emplace(p.name, &p);
  auto check_length = [](const StatedGradient& g, const topologies::LogicalParam& p,
                         const std::string& what) -> std::optional<std::string> {
    if (g.kind == StatedGradient::Kind::values && static_cast<std::int64_t>(g.values.size()) != p.numel)
      return what + ": " + std::to_string(g.values.size()) + " values for " + p.name + ", which has " +
             std::to_string(p.numel) + " elements " + topologies::shape_string(p.shape) +
             " (list one per element, row-major, or state a constant)";
    return std::nullopt;
  };
  for (const StatedFor& s : gradients.stated) {
    // Before selector_text, which reads the class of a selector without a param name.
    if (s.param.empty() == !s.param_class.has_value())
      return "stated gradient: name either a param or a class (it names " +
             std::string(s.param.empty() ? "neither" : "both") + ")";
    const std::string what = "stated gradient for " + selector_text(s);
    if (auto error = check_stated_gradient(s.gradient, what, gradients.generator.dtype)) return error;
    if (auto error = check_stated_sum(s.gradient, what, model.total_elements())) return error;
    if (!s.param.empty()) {
      const auto it = by_name.find(s.param);
      if (it == by_name.end())
        return what + ": the model has no param of that name (`tally layout` lists them)";
      if (auto error = check_length(s.gradient, *it->second, what)) return error;
      continue;
    }
    bool any = false;
    for (const topologies::LogicalParam& p : model.params()) {
      if (p.param_class != *s.param_class) continue;
      any = true;
      if (auto error = check_length(s.gradient, p, what)) return error;
    }
    if (!any) return what + ": the model has no param of that class";
  }
  for (const topologies::CustomParam& c : model.spec().params) {
    if (!c.gradient) continue;
    const std::string what = "gradient of custom param '" + c.name + "'";
    if (auto error = check_stated_gradient(*c.gradient, what, gradients.generator.dtype)) return error;
    if (auto error = check_stated_sum(*c.gradient, what, model.total_elements())) return error;
    if (auto it = by_name.find(c.name); it != by_name.end())
      if (auto error = check_length(*c.gradient, *it->second, what)) return error;
  }
  return std::nullopt;
}

std::string describe_stated(const GradientSpec& gradients, const topologies::ModelSpec& model) {
  std::string out;
  auto add = [&](const std::string& text) { out += (out.empty() ? "" : ", ") + text; };
  for (const topologies::CustomParam& c : model.params)
    if (c.gradient) add(c.name + " " + gradient_text(*c.gradient));
  for (const StatedFor& s : gradients.stated)
    add((s.param.empty() ? std::string(topologies::class_name(*s.param_class)) : s.param) + " " +
        gradient_text(s.gradient));
  return out;
}

}  // namespace tally::vocab
