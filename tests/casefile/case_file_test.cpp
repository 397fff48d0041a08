#include "casefile/case_file.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <sys/stat.h>

#include "casefile/model_json.h"
#include "io/json_read.h"
#include "tests/support/fault_cases.h"
#include "tests/support/model_gen.h"
#include "topologies/logical_model.h"

namespace tally::casefile {
namespace {

namespace fs = std::filesystem;

// A stand-in for run/'s table of targets (run::case_frameworks() is the real one, tested with each
// framework's section in tests/run/): a framework with a section of one setting whose worker builds
// models of its own, and one without a section.
nlohmann::ordered_json read_stand_in_section(const nlohmann::json& value, const std::string& path) {
  int level = 1;
  io::read_object(value, path,
                  {{"level", [&](const nlohmann::json& v, const std::string& p) { level = static_cast<int>(io::read_integer(v, p, 0, 3)); }}},
                  "the stand-in configuration");
  return {{"level", level}};
}
constexpr FrameworkSchema kFrameworks[] = {
    {.name = "stand-in", .section = "stand_in", .read_section = read_stand_in_section, .own_models = true},
    {.name = "megatron-core"},
};

// Any valid case: a valid (config, model) pair, every option, faults, an expectation that
// names real params.
rc::Gen<Case> any_case() {
  return rc::gen::exec([] {
    const auto [config, spec] = *testing::valid_case(3);
    Case c;
    c.topology = config;
    c.model = spec;
    c.description = *rc::gen::container<std::string>(rc::gen::inRange<char>(' ', '~'));
    if (*rc::gen::arbitrary<bool>()) c.description += "\xC3\xA9t\xC3\xA9 \xE2\x9C\x93";  // UTF-8
    vocab::PathOptions& o = c.path;
    o.optimizer = *rc::gen::element(vocab::OptimizerModel::plain, vocab::OptimizerModel::distributed,
                                    vocab::OptimizerModel::layerwise, vocab::OptimizerModel::muon);
    o.gradients.generator.mode = *rc::gen::elementOf(kernels::kAllGradientModes);
    o.gradients.generator.dtype = *rc::gen::elementOf(kernels::kAllDtypes);
    o.gradients.generator.seed = *rc::gen::arbitrary<std::uint64_t>();
    if (*rc::gen::arbitrary<bool>())
      o.gradients.class_mask = *rc::gen::inRange<std::uint32_t>(0, 1u << topologies::kParamClassCount);
    if (*rc::gen::inRange(0, 3) == 0) {
      // Stated gradients that fit the model: named params and a class it has.
      const topologies::LogicalModel model(c.model, c.topology);
      for (const topologies::LogicalParam& p : model.params()) {
        if (*rc::gen::inRange(0, 6) != 0) continue;
        vocab::StatedFor s;
        s.param = p.name;
        s.gradient.kind = *rc::gen::element(topologies::StatedGradient::Kind::constant,
                                            topologies::StatedGradient::Kind::scale,
                                            topologies::StatedGradient::Kind::values);
        if (s.gradient.kind == topologies::StatedGradient::Kind::values && p.numel > 64)
          s.gradient.kind = topologies::StatedGradient::Kind::constant;
        if (s.gradient.kind == topologies::StatedGradient::Kind::values)
          for (std::int64_t i = 0; i < p.numel; ++i) s.gradient.values.push_back(*rc::gen::inRange(-40, 40) * 0.1);
        else
          s.gradient.number = *rc::gen::inRange(-1000, 1000) * 0.01;
        o.gradients.stated.push_back(std::move(s));
      }
      if (model.size() > 0 && *rc::gen::arbitrary<bool>()) {
        vocab::StatedFor s;
        s.param_class = model.param(*rc::gen::inRange(0, model.size())).param_class;
        s.gradient.number = 3.0;
        o.gradients.stated.push_back(std::move(s));
      }
    }
    o.accumulation = *rc::gen::element(kernels::Accumulation::fp32, kernels::Accumulation::fp64);
    const int p_count = *rc::gen::inRange(0, 4);
    for (int i = 0; i < p_count; ++i)
      o.p_values.push_back(*rc::gen::oneOf(rc::gen::element(0.5, 1.0, 3.0, 1e-300, 1e300),
                                           rc::gen::map(rc::gen::inRange(1, 1 << 30),
                                                        [](int k) { return k / 1024.0; })));
    o.max_norm = *rc::gen::oneOf(rc::gen::just(0.0), rc::gen::just(1.0),
                                 rc::gen::map(rc::gen::inRange(0, 1 << 30),
                                              [](int k) { return k * 0.1; }));
    o.bucket_elements = *rc::gen::inRange<std::int64_t>(0, 1 << 20);
    for (const vocab::FaultInfo& info : vocab::fault_catalog())
      if (*rc::gen::inRange(0, 8) == 0) o.faults = o.faults.with(info.fault);
    switch (*rc::gen::inRange(0, 4)) {
      case 0: break;
      case 1: c.expect = Expectation{}; break;
      case 2: c.expect = Expectation{Expectation::Outcome::infra_error, {}, {}}; break;
      default: {
        Expectation e{Expectation::Outcome::fail, {}, {}};
        for (const char* name : {"l2", "zeros", "ledger", "clipped"})
          if (*rc::gen::arbitrary<bool>()) e.statistics.push_back(name);
        const topologies::LogicalModel model(c.model, c.topology);
        for (const topologies::LogicalParam& p : model.params())
          if (*rc::gen::inRange(0, 5) == 0) e.miscounted.push_back(p.name);
        c.expect = e;
      }
    }
    return c;
  });
}

RC_GTEST_PROP(CaseFile, RoundTrips, ()) {
  const Case c = *any_case();
  RC_ASSERT(check_case(c) == std::nullopt);
  RC_ASSERT(case_from_json(nlohmann::json::parse(case_to_json(c).dump()), kFrameworks) == c);
  const std::string text = case_to_text(c);
  const Case read = case_from_text(text, "case.json", kFrameworks);
  RC_ASSERT(read == c);
  RC_ASSERT(case_to_text(read) == text);  // text -> case -> text: the same bytes
}

std::string read_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The founding case of Megatron-LM #6099, as docs/case-files.md shows it.
Case founding_case(int world) {
  Case c;
  c.description = "Megatron-LM #6099";
  c.topology = testing::config_of(world, 2, 1, 2, 1);
  c.model = testing::founding_model();
  c.path = testing::ones(vocab::OptimizerModel::layerwise);
  c.path.gradients.class_mask = vocab::class_bit(topologies::ParamClass::expert_row_bias);
  c.path.max_norm = 1.0;
  return c;
}

TEST(CaseFile, DocumentedExampleReads) {
  const std::string doc = read_file(fs::path(TALLY_SOURCE_DIR) / "docs" / "case-files.md");
  const std::size_t start = doc.find("```json\n");
  ASSERT_NE(start, std::string::npos);
  const std::size_t end = doc.find("```", start + 8);
  const std::string example = doc.substr(start + 8, end - start - 8);
  // The annotated example is canonical apart from its comments, which JSON does not have:
  // the docs strip them to one in a "description" instead.
  const Case c = case_from_text(example, "docs/case-files.md", kFrameworks);
  EXPECT_EQ(case_to_text(c), example);
  EXPECT_EQ(c.topology, founding_case(8).topology);
}

TEST(CaseFile, MinimalFileTakesTheDocumentedDefaults) {
  const Case c = case_from_text(
      R"({"tally_case": 1, "topology": {"world": 4, "tp": 2}, "model": {}})", "min.json", kFrameworks);
  EXPECT_EQ(c.topology.world, 4);
  EXPECT_EQ(c.topology.etp, 2);  // Megatron-LM's default: etp = tp
  EXPECT_EQ(c.topology.order, "tp-cp-ep-dp-pp");
  EXPECT_EQ(c.model, topologies::ModelSpec{});
  EXPECT_EQ(c.path.optimizer, vocab::OptimizerModel::plain);
  EXPECT_EQ(c.path.gradients.generator.mode, kernels::GradientMode::dyadic);
  EXPECT_EQ(c.path.gradients.generator.dtype, kernels::Dtype::fp32);
  EXPECT_EQ(c.path.gradients.generator.seed, 1u);
  EXPECT_EQ(c.path.gradients.class_mask, ~std::uint32_t{0});
  EXPECT_EQ(c.path.accumulation, kernels::Accumulation::fp64);
  EXPECT_EQ(c.path.max_norm, 1.0);
  EXPECT_TRUE(c.path.faults.empty());
  EXPECT_FALSE(c.expect.has_value());
  EXPECT_EQ(c.description, "");
}

TEST(CaseFile, ReadsEveryField) {
  const Case c = case_from_text(R"({
    "tally_case": 1, "description": "d",
    "topology": {"world": 8, "tp": 2, "cp": 1, "pp": 2, "ep": 2, "etp": 1, "vpp": 1,
                 "order": "tp-cp-ep-dp-pp", "dist_opt_instances": 1},
    "model": {"num_layers": 2, "num_experts": 2},
    "optimizer": {"model": "distributed", "bucket_elements": 64},
    "gradients": {"mode": "rank-encoded", "dtype": "bf16", "seed": 18446744073709551615,
                  "classes": ["row", "column"]},
    "statistics": {"accumulation": "fp32", "p_norms": [1, 0.5], "max_norm": 2.5},
    "faults": ["no-dedup-filter", "expert-dedup-on-dense-tp"],
    "expect": {"outcome": "fail", "statistics": ["p0.5", "ledger"],
               "miscounted": ["decoder.final_layernorm.weight"]},
    "tool": {"name": "tally", "version": "9.9.9", "eigen": "3.4.0"}})",
                                "all.json", kFrameworks);
  EXPECT_EQ(c.topology.pp, 2);
  EXPECT_EQ(c.topology.etp, 1);
  EXPECT_EQ(c.path.optimizer, vocab::OptimizerModel::distributed);
  EXPECT_EQ(c.path.bucket_elements, 64);
  EXPECT_EQ(c.path.gradients.generator.mode, kernels::GradientMode::rank_encoded);
  EXPECT_EQ(c.path.gradients.generator.dtype, kernels::Dtype::bf16);
  EXPECT_EQ(c.path.gradients.generator.seed, ~std::uint64_t{0});
  EXPECT_EQ(c.path.gradients.class_mask, vocab::class_bit(topologies::ParamClass::row) |
                                             vocab::class_bit(topologies::ParamClass::column));
  EXPECT_EQ(c.path.accumulation, kernels::Accumulation::fp32);
  EXPECT_EQ(c.path.p_values, (std::vector<double>{1.0, 0.5}));
  EXPECT_EQ(c.path.max_norm, 2.5);
  EXPECT_EQ(c.path.faults, vocab::FaultSet::of({vocab::Fault::no_dedup_filter,
                                                   vocab::Fault::expert_dedup_on_dense_tp}));
  ASSERT_TRUE(c.expect.has_value());
  EXPECT_EQ(c.expect->statistics, (std::vector<std::string>{"p0.5", "ledger"}));
  // Written back in canonical form: faults in catalog order, classes in class order.
  const std::string text = case_to_text(c);
  EXPECT_LT(text.find("expert-dedup-on-dense-tp"), text.find("no-dedup-filter"));
  EXPECT_LT(text.find("\"column\""), text.find("\"row\""));
  EXPECT_NE(text.find("\"version\": \"0.1.0\""), std::string::npos);
}

// The message `text` gives, or "" when it reads.
std::string error_of(const std::string& text) {
  try {
    case_from_text(text, "bad.json", kFrameworks);
  } catch (const CaseFileError& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }
  return "";
}

// A valid file with one field of the topology replaced.
std::string with(const std::string& field) {
  return R"({"tally_case": 1, "topology": {"world": 2, "tp": 2)" + field +
         R"(}, "model": {"num_layers": 1}})";
}
std::string with_section(const std::string& section) {
  return R"({"tally_case": 1, "topology": {"world": 2}, "model": {"num_layers": 1}, )" + section + "}";
}

TEST(CaseFile, FieldErrorsNameThePathAndTheRule) {
  struct Example {
    std::string text;
    std::string message;
  };
  const std::vector<Example> examples = {
      {"[1]", "bad.json: case: expected an object (a tally case), got an array"},
      {"{}", "bad.json: case: missing key 'tally_case' (the case file format version; this tally reads version 1)"},
      {R"({"tally_case": 2, "bogus": 1})",
       "bad.json: case.tally_case: version 2 is not supported: tally 0.1.0 reads version 1"},
      {R"({"tally_case": "1"})", "bad.json: case.tally_case: expected a positive integer, got \"1\""},
      {R"({"tally_case": 1, "topology": {"world": 1}})", "bad.json: case: missing key 'model' for a case"},
      {R"({"tally_case": 1, "model": {}})", "bad.json: case: missing key 'topology' for a case"},
      {with_section(R"("bogus": 1)"), "bad.json: case.bogus: unknown key for a case"},
      {with(R"(, "tp": 3)"), "bad.json: key 'tp' appears twice in one object"},
      {with(R"(, "cp": 0)"), "bad.json: case.topology.cp: expected a positive integer, got 0"},
      {with(R"(, "cp": -3)"), "bad.json: case.topology.cp: expected a positive integer, got -3"},
      {with(R"(, "cp": 1.5)"), "bad.json: case.topology.cp: expected a positive integer, got 1.5"},
      {with(R"(, "cp": "1")"), "bad.json: case.topology.cp: expected a positive integer, got \"1\""},
      {with(R"(, "pp": 4611686018427387904)"),
       "bad.json: case.topology.pp: expected a positive integer at most 1048576, got 4611686018427387904"},
      {with(R"(, "order": 5)"), "bad.json: case.topology.order: expected a string, got 5"},
      {with(R"(, "bogus": 5)"), "bad.json: case.topology.bogus: unknown key for a topology"},
      {R"({"tally_case": 1, "topology": {"tp": 2}, "model": {}})",
       "bad.json: case.topology: missing key 'world' for a topology"},
      {with_section(R"("model": {"num_layers": -3})"),
       "bad.json: key 'model' appears twice in one object"},
      {R"({"tally_case": 1, "topology": {"world": 1}, "model": {"num_layers": -3}})",
       "bad.json: case.model.num_layers: expected a positive integer, got -3"},
      {with_section(R"("optimizer": {"model": "adam"})"),
       "bad.json: case.optimizer.model: expected one of plain, distributed, layerwise, muon, got \"adam\""},
      {with_section(R"("optimizer": {"bucket_elements": -1})"),
       "bad.json: case.optimizer.bucket_elements: expected an integer >= 0, got -1"},
      {with_section(R"("gradients": {"seed": -1})"),
       "bad.json: case.gradients.seed: expected an integer from 0 to 18446744073709551615, got -1"},
      {with_section(R"("gradients": {"seed": 1.0})"),
       "bad.json: case.gradients.seed: expected an integer from 0 to 18446744073709551615, got 1.0"},
      {with_section(R"("gradients": {"seed": 18446744073709551616})"),
       "bad.json: case.gradients.seed: expected an integer from 0 to 18446744073709551615, got 1.8446744073709552e+19"},
      {with_section(R"("gradients": {"mode": "gaussian"})"),
       "bad.json: case.gradients.mode: expected one of ones, zeros, dyadic, uniform, normal, sparse, rank-encoded, got \"gaussian\""},
      {with_section(R"("gradients": {"classes": ["row", "row"]})"),
       "bad.json: case.gradients.classes[1]: \"row\" is listed twice"},
      {with_section(R"("gradients": {"classes": "row"})"),
       "bad.json: case.gradients.classes: expected an array, got a string"},
      {with_section(R"("gradients": {"stated": [{"gradient": 1}]})"),
       "bad.json: case.gradients.stated[0]: name either \"param\" (a logical param) or \"class\", not neither"},
      {with_section(R"("gradients": {"stated": [{"param": "x", "class": "row", "gradient": 1}]})"),
       "bad.json: case.gradients.stated[0]: name either \"param\" (a logical param) or \"class\", not both"},
      {with_section(R"("gradients": {"stated": [{"param": "x"}]})"),
       "bad.json: case.gradients.stated[0]: missing key 'gradient' for a stated gradient"},
      {with_section(R"("gradients": {"stated": [{"param": "x", "gradient": "0.1"}]})"),
       "bad.json: case.gradients.stated[0].gradient: expected a number (every element), {\"scale\": x} or an array of one number per element, got \"0.1\""},
      {with_section(R"("gradients": {"stated": [{"param": "x", "gradient": []}]})"),
       "bad.json: case.gradients.stated[0].gradient: expected one number per element, got an empty array"},
      {with_section(R"("gradients": {"stated": [{"param": "x", "gradient": {"factor": 2}}]})"),
       "bad.json: case.gradients.stated[0].gradient.factor: unknown key for a stated gradient"},
      {with_section(R"("gradients": {"stated": [{"class": "weight", "gradient": 1}]})"),
       "bad.json: case.gradients.stated[0].class: expected one of column, column-bias, row, replicated, vocab, head-sharded, expert-column, expert-column-bias, expert-row, expert-row-bias, got \"weight\""},
      {with_section(R"("gradients": {"stated": [{"param": "nope", "gradient": 1}]})"),
       "bad.json: stated gradient for param 'nope': the model has no param of that name (`tally layout` lists them)"},
      {with_section(R"("gradients": {"stated": [{"param": "embedding.word_embeddings.weight", "gradient": [1, 2]}]})"),
       "bad.json: stated gradient for param 'embedding.word_embeddings.weight': 2 values for embedding.word_embeddings.weight, which has 1024 elements [64, 16] (list one per element, row-major, or state a constant)"},
      {with_section(R"("gradients": {"dtype": "fp16", "stated": [{"class": "row", "gradient": 70000}]})"),
       "bad.json: stated gradient for class row: the constant 70000 is larger in magnitude than 65504, the largest tally accepts for fp16 gradients"},
      {with_section(R"("gradients": {"stated": [{"class": "expert-row", "gradient": 1}]})"),
       "bad.json: stated gradient for class expert-row: the model has no param of that class"},
      {with_section(R"("statistics": {"p_norms": [2, 0]})"),
       "bad.json: case.statistics.p_norms[1]: expected a number > 0, got 0"},
      {with_section(R"("statistics": {"p_norms": [1,2,3,4,5,6,7,8,9]})"),
       "bad.json: case.statistics.p_norms: has 9 elements; at most 8 are allowed"},
      {with_section(R"("statistics": {"max_norm": -1})"),
       "bad.json: case.statistics.max_norm: expected a number >= 0 (0: no clipping), got -1"},
      {with_section(R"("statistics": {"max_norm": null})"),
       "bad.json: case.statistics.max_norm: expected a number, got null"},
      {with_section(R"("faults": ["no-such-fault"])"),
       "bad.json: case.faults[0]: \"no-such-fault\" is not a fault of the catalog (tally run --list-faults)"},
      {with_section(R"("faults": [1])"), "bad.json: case.faults[0]: expected a string, got 1"},
      {with_section(R"("expect": {})"), "bad.json: case.expect: missing key 'outcome' for the expectation"},
      {with_section(R"("expect": {"outcome": "pass", "statistics": ["l2"]})"),
       "bad.json: case.expect: statistics and miscounted are only for \"outcome\": \"fail\""},
      {with_section(R"("expect": {"outcome": "fail", "statistics": ["norm"]})"),
       "bad.json: case.expect.statistics[0]: expected a statistic (l2, l2-ledger, inf, zeros, zeros-ledger, mtp-l2, p<p>, clip, ledger, agreement, clipped), got \"norm\""},
      {with_section(R"("expect": {"outcome": "fail", "statistics": ["p3"]})"),
       "bad.json: case.expect.statistics[0]: \"p3\" is not a p-norm of this case (statistics.p_norms)"},
      {with_section(R"("expect": {"outcome": "fail", "miscounted": ["decoder.layers.9.bias"]})"),
       "bad.json: case.expect.miscounted[0]: \"decoder.layers.9.bias\" is not a param of the model (tally layout lists them)"},
      {with_section(R"("target": {"framework": "paddle", "version": "0.2.0"})"),
       "bad.json: case.target.framework: expected a framework tally has a worker for (stand-in, megatron-core), got \"paddle\""},
      {with_section(R"("stand_in": {"level": 4})"),
       "bad.json: case.stand_in.level: expected an integer >= 0 at most 3, got 4"},
      {with_section(R"("stand_in": {"depth": 1})"),
       "bad.json: case.stand_in.depth: unknown key for the stand-in configuration"},
      {with_section(R"("deepspeed": {"zero_stage": 1})"), "bad.json: case.deepspeed: unknown key for a case"},
      {with_section(R"("target": {"framework": "megatron-core"})"),
       "bad.json: case.target: missing key 'version' for the target"},
      {with_section(R"("target": {"framework": "megatron-core", "version": ""})"),
       "bad.json: case.target.version: expected the framework's version, got an empty string"},
      {with_section(R"("tool": {"version": 1})"), "bad.json: case.tool.version: expected a string, got 1"},
      {with_section(R"("description": "two\nlines")"),
       "bad.json: case.description: expected one line of text without control characters"},
      // Semantic rules: check_case's line, after the file name.
      {R"({"tally_case": 1, "topology": {"world": 12, "tp": 2, "pp": 4}, "model": {}})",
       "bad.json: world 12 is not divisible by tp*cp*pp = 8"},
      {R"({"tally_case": 1, "topology": {"world": 1}, "model": {"num_experts": 3}, "topology": {"world": 1}})",
       "bad.json: key 'topology' appears twice in one object"},
  };
  for (const Example& e : examples) EXPECT_EQ(error_of(e.text), e.message) << e.text;
}

TEST(CaseFile, ARealTargetsCaseRoundTripsWithItsSavedManifests) {
  casefile::Case c = casefile::load_case_file(TALLY_SOURCE_DIR "/seeds/founding-6099-world2.pass.json", kFrameworks);
  c.target = casefile::RealTarget{"megatron-core", "0.19.2", "found.manifests"};
  const std::string text = casefile::case_to_json(c).dump(2);
  EXPECT_NE(text.find(R"("target": {
    "framework": "megatron-core",
    "version": "0.19.2",
    "manifests": "found.manifests"
  },
  "expect")"), std::string::npos) << "after the faults, before the expectation: " << text;
  EXPECT_EQ(casefile::case_from_json(casefile::case_to_json(c), kFrameworks, "case"), c);
  c.target->manifests.clear();
  EXPECT_EQ(casefile::case_to_json(c)["target"].size(), 2u) << "no saved manifests: no key";
  EXPECT_EQ(casefile::case_from_json(casefile::case_to_json(c), kFrameworks, "case"), c);
}

TEST(CaseFile, AFrameworksSectionIsReadByItsReaderAndWrittenAsItsCanonicalJson) {
  casefile::Case c = casefile::case_from_text(with_section(R"("stand_in": {})"), "fw.json", kFrameworks);
  ASSERT_TRUE(section_settings(c, "stand_in"));
  EXPECT_EQ(*section_settings(c, "stand_in"), nlohmann::ordered_json({{"level", 1}})) << "the reader's defaults";
  EXPECT_TRUE(c.sections.at("stand_in").own_models);
  EXPECT_EQ(section_settings(c, "megatron_fsdp"), nullptr);
  c.target = casefile::RealTarget{"stand-in", "1.0", ""};
  const std::string text = casefile::case_to_json(c).dump(2);
  EXPECT_NE(text.find(R"("stand_in": {
    "level": 1
  },
  "target")"), std::string::npos) << "after the faults, before the target: " << text;
  EXPECT_EQ(casefile::case_from_json(casefile::case_to_json(c), kFrameworks, "case"), c);
  keep_only_section(c, "stand_in");
  EXPECT_TRUE(section_settings(c, "stand_in")) << "its own section stays";
  keep_only_section(c, "");
  EXPECT_FALSE(casefile::case_to_json(c).contains("stand_in")) << "dropped: no section";
}

TEST(CaseFile, ASectionOfAFrameworkWithItsOwnModelsLiftsMegatronsModelRules) {
  // Expert biases with expert TP: Megatron-LM refuses them; a framework building its own models may not.
  const std::string biased_experts =
      R"({"tally_case": 1, "topology": {"world": 4, "tp": 2, "ep": 2, "etp": 2},
          "model": {"num_layers": 1, "num_experts": 4, "add_bias_linear": true})";
  EXPECT_NE(error_of(biased_experts + "}").find("need etp 1"), std::string::npos);
  EXPECT_EQ(error_of(biased_experts + R"(, "stand_in": {}})"), "");
}

TEST(CaseFile, InvalidJsonIsOneLine) {
  EXPECT_EQ(error_of("{").rfind("bad.json: invalid JSON: ", 0), 0u);
  EXPECT_EQ(error_of("{\"tally_case\": 1,}").rfind("bad.json: invalid JSON: ", 0), 0u);
  EXPECT_EQ(error_of("// comment\n{}").rfind("bad.json: invalid JSON: ", 0), 0u);
  EXPECT_EQ(error_of("{\"a\": \"\x01\n\xff\"}").rfind("bad.json: invalid JSON: ", 0), 0u);
  EXPECT_EQ(error_of("").rfind("bad.json: invalid JSON: ", 0), 0u);
  // A number beyond double is nlohmann's out_of_range, not a parse_error: still one line.
  EXPECT_EQ(error_of(with_section(R"("statistics": {"max_norm": 1e400})")).rfind("bad.json: invalid JSON: ", 0), 0u);
}

TEST(CaseFile, HostileInputsAreErrorsNotCrashes) {
  // 10,000-deep nesting, in every position.
  const std::string deep_array = std::string(10000, '[') + std::string(10000, ']');
  EXPECT_EQ(error_of(deep_array), "bad.json: nested deeper than 64 levels");
  std::string deep_object;
  for (int i = 0; i < 10000; ++i) deep_object += "{\"a\":";
  deep_object += "1" + std::string(10000, '}');
  EXPECT_EQ(error_of(deep_object), "bad.json: nested deeper than 64 levels");
  EXPECT_EQ(error_of(with_section("\"description\": " + deep_array)), "bad.json: nested deeper than 64 levels");
  // Unterminated deep nesting: no recursion either.
  EXPECT_EQ(error_of(std::string(1'000'000, '[')), "bad.json: nested deeper than 64 levels");
  // An array longer than anything a case holds.
  std::string long_array = "[0";
  for (int i = 0; i < 1'000'000; ++i) long_array += ",0";
  long_array += "]";
  EXPECT_EQ(error_of(with_section("\"faults\": " + long_array)),
            "bad.json: an array has more than 1000000 elements");
  // Huge and negative numbers.
  EXPECT_EQ(error_of(R"({"tally_case": 1, "topology": {"world": 4611686018427387904}, "model": {}})"),
            "bad.json: case.topology.world: expected a positive integer at most 1048576, got 4611686018427387904");
  EXPECT_EQ(error_of(R"({"tally_case": 1, "topology": {"world": 1e300}, "model": {}})"),
            "bad.json: case.topology.world: expected a positive integer, got 1e+300");
  EXPECT_EQ(error_of(R"({"tally_case": 1, "topology": {"world": -9223372036854775808}, "model": {}})"),
            "bad.json: case.topology.world: expected a positive integer, got -9223372036854775808");
  EXPECT_EQ(error_of(R"({"tally_case": 1, "topology": {"world": 99999999999999999999999}, "model": {}})"),
            "bad.json: case.topology.world: expected a positive integer, got 9.999999999999999e+22");
  EXPECT_EQ(error_of(R"({"tally_case": 18446744073709551615})"),
            "bad.json: case.tally_case: expected a positive integer at most 9223372036854775807, got 18446744073709551615");
  EXPECT_EQ(error_of(R"({"tally_case": 1, "topology": {"world": 1}, "model": {"hidden_size": 1073741825}})"),
            "bad.json: case.model.hidden_size: expected a positive integer at most 1073741824, got 1073741825");
  // Wrong types everywhere.
  for (const char* section : {"\"topology\": []", "\"model\": \"gpt\"", "\"optimizer\": 1",
                              "\"gradients\": null", "\"statistics\": true", "\"faults\": {}",
                              "\"expect\": \"pass\"", "\"tool\": []", "\"description\": 1"}) {
    const std::string text = R"({"tally_case": 1, "topology": {"world": 1}, "model": {}, )" +
                             std::string(section) + "}";
    const std::string message = error_of(text);
    EXPECT_NE(message, "") << text;
  }
  // A 2^62 world in the topology and a model of 2^40 elements: read (the model is only
  // described, never materialised), or rejected by a rule, quickly and without allocating.
  const std::string big_model =
      R"({"tally_case": 1, "topology": {"world": 1}, "model": {"kind": "custom", "params": [
          {"name": "w", "class": "replicated", "shape": [1048576, 1048576]}]}})";
  const Case big = case_from_text(big_model, "big.json", kFrameworks);
  EXPECT_EQ(topologies::LogicalModel(big.model, big.topology).total_elements(), std::int64_t{1} << 40);
  EXPECT_EQ(error_of(R"({"tally_case": 1, "topology": {"world": 1}, "model": {"kind": "custom", "params": [
          {"name": "w", "class": "replicated", "shape": [1048576, 1048576]},
          {"name": "b", "class": "replicated", "shape": [1]}]}})"),
            "bad.json: the model has 1099511627777 elements; tally supports at most 1099511627776");
  EXPECT_EQ(error_of(R"({"tally_case": 1, "topology": {"world": 1}, "model": {"kind": "custom", "params": [
          {"name": "w", "class": "replicated", "shape": [1099511627777]}]}})"),
            "bad.json: case.model.params[0].shape[0]: expected a positive integer at most 1099511627776, got 1099511627777");
  EXPECT_NE(error_of(R"({"tally_case": 1, "topology": {"world": 1}, "model": {"num_layers": 1073741824, "hidden_size": 1073741824}})"), "");
  // Found by libFuzzer (case_reader_crashes/unknown-key-with-line-break): an unknown key with a
  // line break in it broke the message over two lines.
  EXPECT_EQ(error_of(with_section(R"("to\nol": 1)")), "bad.json: case[\"to\\nol\"]: unknown key for a case");
  EXPECT_EQ(error_of(with_section(R"("": 1)")), "bad.json: case[\"\"]: unknown key for a case");
  // Rules of the whole case quote names and orders as they are: control characters escaped.
  EXPECT_EQ(error_of(R"({"tally_case": 1, "topology": {"world": 1, "order": "tp-\nx"}, "model": {}})"),
            "bad.json: order 'tp-\\nx' has unknown token '\\nx' (tokens: tp, cp, ep, dp, pp; the gtp_remat "
            "axis is placed by Megatron-LM, after tp in the dense grid and after ep in the expert grid)");
  EXPECT_EQ(error_of(R"({"tally_case": 1, "topology": {"world": 1}, "model": {"kind": "custom", "params": [
          {"name": "a\u0001b", "class": "replicated", "shape": [1]}]}})"),
            "bad.json: params[0] 'a\\x01b': name may use letters, digits and . _ - / : only");
  // A name with a line break is shown JSON-quoted: the message stays one line.
  EXPECT_EQ(error_of(with_section(R"("faults": ["two\nlines"])")),
            "bad.json: case.faults[0]: \"two\\nlines\" is not a fault of the catalog (tally run --list-faults)");
  // A long string is reported without copying it into the message.
  const std::string long_name(1 << 20, 'x');
  const std::string message = error_of(with_section(R"("faults": [")" + long_name + "\"]"));
  EXPECT_LT(message.size(), 300u) << message.substr(0, 300);
}

TEST(CaseFile, WritesAtomicallyAndReadsBack) {
  const fs::path folder = fs::path(::testing::TempDir()) / "tally_case_file_test";
  fs::remove_all(folder);
  fs::create_directories(folder);
  const std::string file = (folder / "founding.json").string();
  Case c = founding_case(2);
  c.path.faults = vocab::FaultSet::of({vocab::Fault::expert_dedup_on_dense_tp});
  c.expect = Expectation{Expectation::Outcome::fail, {"l2"}, {}};
  write_case_file(file, c, kFrameworks);
  EXPECT_EQ(load_case_file(file, kFrameworks), c);
  c.description = "overwritten";
  write_case_file(file, c, kFrameworks);
  EXPECT_EQ(load_case_file(file, kFrameworks), c);
  EXPECT_EQ(read_file(file), case_to_text(c));
  // Nothing but the file is left behind.
  int entries = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(folder)) ++entries;
  EXPECT_EQ(entries, 1);
  const fs::perms perms = fs::status(file).permissions();
  EXPECT_NE(perms & fs::perms::others_read, fs::perms::none);
  // A folder that does not exist: an error naming the file.
  try {
    write_case_file((folder / "missing" / "x.json").string(), c, kFrameworks);
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("missing/x.json: cannot write the case file"), std::string::npos)
        << error.what();
  }
  fs::remove_all(folder);
}

TEST(CaseFile, LoadErrorsNameTheFile) {
  try {
    load_case_file("/nonexistent/case.json", kFrameworks);
    ADD_FAILURE() << "no error";
  } catch (const CaseFileError& error) {
    EXPECT_STREQ(error.what(), "/nonexistent/case.json: cannot open the case file");
  }
  const fs::path folder = fs::path(::testing::TempDir());
  try {
    load_case_file(folder.string(), kFrameworks);
    ADD_FAILURE() << "no error";
  } catch (const CaseFileError& error) {
    EXPECT_EQ(std::string(error.what()), folder.string() + ": is a folder, not a case file");
  }
}

// A FIFO, a terminal or a socket as a case file once blocked the reader forever.
TEST(CaseFile, ReadingAFifoIsRefusedWithoutBlocking) {
  const fs::path fifo = fs::path(::testing::TempDir()) / "case-fifo.json";
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    load_case_file(fifo.string(), kFrameworks);
    ADD_FAILURE() << "no error";
  } catch (const CaseFileError& error) {
    EXPECT_EQ(std::string(error.what()),
              fifo.string() + ": is a FIFO, not a case file (only regular files are read)");
  }
  try {
    load_model_spec(fifo.string());
    ADD_FAILURE() << "no error";
  } catch (const std::exception& error) {
    EXPECT_NE(std::string(error.what()).find("is a FIFO, not a model file"), std::string::npos) << error.what();
  }
  fs::remove(fifo);
}

TEST(CaseFile, DescriptionRuleIsTheReadersLimit) {
  EXPECT_FALSE(description_error(std::string(kMaxDescriptionBytes, 'x')));
  EXPECT_EQ(description_error(std::string(kMaxDescriptionBytes + 1, 'x')),
            "a description is at most 4096 bytes, got 4097");
  EXPECT_EQ(description_error("two\nlines"), "expected one line of text without control characters");
}

// A fuzz campaign with a corpus path of about 4,000 characters once wrote a shrunk case whose
// description (built from the path) the reader rejected: a finding that could not be replayed.
TEST(CaseFile, FittedDescriptionsAlwaysReadBack) {
  const std::string path(5000, 'p');
  const std::string fitted = fit_description("shrunk from " + path + "\t(tab)");
  EXPECT_FALSE(description_error(fitted));
  EXPECT_EQ(fitted.size(), kMaxDescriptionBytes);
  EXPECT_EQ(fitted.substr(fitted.size() - 3), "...");
  EXPECT_EQ(fit_description("a\tb"), "a?b");
  // Cut between UTF-8 characters, never inside one.
  std::string accents;
  while (accents.size() < kMaxDescriptionBytes + 10) accents += "\xc3\xa9";
  const std::string cut = fit_description(accents);
  EXPECT_FALSE(description_error(cut));
  EXPECT_EQ((cut.size() - 3) % 2, 0u);
  Case c = founding_case(2);
  c.description = cut;
  EXPECT_EQ(case_from_text(case_to_text(c), "fitted", kFrameworks).description, cut);
}

TEST(CaseFile, WriterRefusesWhatTheReaderWouldReject) {
  const fs::path file = fs::path(::testing::TempDir()) / "too-long-description.json";
  fs::remove(file);
  Case c = founding_case(2);
  c.description = std::string(kMaxDescriptionBytes + 1, 'x');
  EXPECT_THROW(write_case_file(file.string(), c, kFrameworks), std::invalid_argument);
  EXPECT_FALSE(fs::exists(file));
}

TEST(CaseFile, StrayClassMaskBitsAreAProgrammingError) {
  Case c = founding_case(2);
  c.path.gradients.class_mask = 1u << 31;
  EXPECT_THROW(case_to_json(c), std::invalid_argument);
  c.path.gradients.class_mask = 0;  // no class: every gradient zero, written as []
  EXPECT_EQ(case_from_text(case_to_text(c), "x.json", kFrameworks), c);
}

}  // namespace
}  // namespace tally::casefile
