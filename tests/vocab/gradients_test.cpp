// Each logical param's gradients, resolved once for the path, the oracle and the manifests: the
// case's generator, zeros outside the selected classes, a custom layout's own gradient, then the
// case's stated gradients in order; and the rules a stated gradient obeys.
#include "vocab/gradients.h"

#include <gtest/gtest.h>

#include "tests/support/fault_cases.h"

namespace tally::vocab {
namespace {

using topologies::ParamClass;
using topologies::StatedGradient;

topologies::StatedGradient constant(double value) { return {StatedGradient::Kind::constant, value, {}}; }

topologies::LogicalModel three_params(std::optional<StatedGradient> layout_gradient = std::nullopt) {
  std::vector<topologies::CustomParam> params = {
      testing::custom_param("a", ParamClass::replicated, {4}),
      testing::custom_param("b", ParamClass::column, {2, 2}),
      testing::custom_param("c", ParamClass::row, {1, 3})};
  params[0].gradient = layout_gradient;
  return topologies::LogicalModel(testing::custom_model(params));
}

TEST(ParamGenerators, LayoutGradientsThenStatedInOrderALaterOneWins) {
  GradientSpec g;
  g.generator.mode = kernels::GradientMode::normal;
  g.class_mask = class_bit(ParamClass::replicated) | class_bit(ParamClass::column);
  g.stated.push_back({"", ParamClass::column, constant(2.0)});
  g.stated.push_back({"b", std::nullopt, {StatedGradient::Kind::scale, 3.0, {}}});
  const std::vector<kernels::GeneratorSpec> specs = param_generators(g, three_params(constant(0.1)));
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[0].stated.kind, kernels::StatedValues::Kind::constant);  // the layout's
  EXPECT_EQ(specs[0].stated.number, 0.1);
  EXPECT_EQ(specs[1].stated.kind, kernels::StatedValues::Kind::scaled);  // the later entry
  EXPECT_EQ(specs[1].stated.number, 3.0);
  EXPECT_EQ(specs[1].mode, kernels::GradientMode::normal);
  EXPECT_FALSE(kernels::states_values(specs[2]));  // outside the mask: zeros
  EXPECT_EQ(specs[2].mode, kernels::GradientMode::zeros);
}

// A scale multiplies the generated values: zeros for a class the mask leaves out. A constant
// states values outright, mask or not.
TEST(ParamGenerators, AScaleOnAMaskedOutClassLeavesZeros) {
  const topologies::LogicalModel model = three_params();
  GradientSpec g;
  g.class_mask = class_bit(ParamClass::column);  // "a" (replicated) is masked out
  g.stated.push_back({"a", std::nullopt, {StatedGradient::Kind::scale, 3.0, {}}});
  EXPECT_EQ(param_generators(g, model)[0].mode, kernels::GradientMode::zeros);
  EXPECT_EQ(param_generators(g, model)[0].stated.kind, kernels::StatedValues::Kind::none);
  g.stated[0].gradient = constant(2.0);
  EXPECT_EQ(param_generators(g, model)[0].stated.kind, kernels::StatedValues::Kind::constant);
}

TEST(ParamGenerators, StatedValuesAreRoundedOnceToTheDtype) {
  GradientSpec g;
  g.generator.dtype = kernels::Dtype::bf16;
  StatedGradient listed{StatedGradient::Kind::values, 0.0, {0.1, -2.5, 0.0, 1e-3}};
  g.stated.push_back({"a", std::nullopt, listed});
  const kernels::GeneratorSpec spec = param_generators(g, three_params())[0];
  for (std::uint64_t i = 0; i < 4; ++i)
    EXPECT_EQ(kernels::gradient_value(spec, 0, i), kernels::round_to(listed.values[i], kernels::Dtype::bf16));
  g.stated[0].gradient = {StatedGradient::Kind::scale, -0.5, {}};
  g.generator.mode = kernels::GradientMode::dyadic;
  const kernels::GeneratorSpec scaled = param_generators(g, three_params())[0];
  kernels::GeneratorSpec generated = g.generator;
  for (std::uint64_t i = 0; i < 4; ++i)
    EXPECT_EQ(kernels::gradient_value(scaled, 0, i), -0.5f * kernels::gradient_value(generated, 0, i));
}

TEST(CheckStated, NamesTheStatedGradientAndTheRule) {
  const topologies::LogicalModel model = three_params();
  auto error = [&](StatedFor s) {
    GradientSpec g;
    g.stated.push_back(std::move(s));
    return check_stated(g, model).value_or("");
  };
  EXPECT_EQ(error({"a", std::nullopt, constant(1.0)}), "");
  EXPECT_EQ(error({"z", std::nullopt, constant(1.0)}),
            "stated gradient for param 'z': the model has no param of that name (`tally layout` lists them)");
  EXPECT_EQ(error({"", ParamClass::vocab, constant(1.0)}),
            "stated gradient for class vocab: the model has no param of that class");
  EXPECT_EQ(error({"b", std::nullopt, {StatedGradient::Kind::values, 0.0, {1, 2, 3}}}),
            "stated gradient for param 'b': 3 values for b, which has 4 elements [2, 2] (list one per "
            "element, row-major, or state a constant)");
  EXPECT_EQ(error({"a", std::nullopt, constant(std::nan(""))}),
            "stated gradient for param 'a': the constant must be a finite number");
  EXPECT_EQ(error({"a", ParamClass::row, constant(1.0)}),
            "stated gradient: name either a param or a class (it names both)");
  EXPECT_EQ(error({"", std::nullopt, constant(1.0)}),
            "stated gradient: name either a param or a class (it names neither)");
  GradientSpec layout_only;
  {  // 2^40 elements at 2^50 would overflow a float32 sum of squares: at most 2^63 / 2^20
    topologies::ModelSpec big;
    big.kind = topologies::ModelKind::custom;
    topologies::CustomParam w;
    w.name = "w";
    w.param_class = ParamClass::replicated;
    w.shape = {std::int64_t{1} << 20, std::int64_t{1} << 20};
    big.params = {w};
    GradientSpec g;
    g.stated.push_back({"w", std::nullopt, constant(0x1p44)});
    EXPECT_EQ(check_stated(g, topologies::LogicalModel(big)).value_or(""),
              "stated gradient for param 'w': magnitude 17592186044416 over the model's 1099511627776 "
              "elements could overflow a float32 sum of squares (at most 8796093022208 for a model "
              "of this size)");
    g.stated[0].gradient = constant(0x1p43);
    EXPECT_EQ(check_stated(g, topologies::LogicalModel(big)), std::nullopt);
  }
  EXPECT_EQ(check_stated(layout_only, three_params(StatedGradient{StatedGradient::Kind::values, 0.0, {1}})).value_or(""),
            "gradient of custom param 'a': 1 values for a, which has 4 elements [4] (list one per "
            "element, row-major, or state a constant)");
}

}  // namespace
}  // namespace tally::vocab
