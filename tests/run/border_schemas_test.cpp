// The border between tally and its workers, held to its schemas (docs/schemas/): every document
// tally writes validates against its schema, and for the documents tally reads from a worker
// (hello.json, case-<K>.result.json) the schema and tally's reader (run/worker_files.h) name the
// same fields: a document with every field the schema lists is read, and one with a field more is
// refused naming it. A field added on one side only fails here.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <utility>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "casefile/case_file.h"
#include "kernels/gradient_generator.h"
#include "manifest/manifest_json.h"
#include "run/deepspeed/section.h"
#include "run/framework_worker.h"
#include "run/target_run.h"
#include "run/model_manifests.h"
#include "run/run_case.h"
#include "run/target.h"
#include "run/worker_files.h"
#include "tests/support/json_schema.h"
#include "topologies/model_spec.h"
#include "vocab/faults.h"
#include "vocab/optimizer_models.h"

namespace tally::run {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::full_instance;
using testing::load_json_file;
using testing::schema_errors;

// Every case setting some framework's worker may decline (each row's cannot_run).
std::vector<std::string_view> every_cannot_run_setting() {
  std::vector<std::string_view> settings;
  for (const FrameworkTarget* t : framework_targets()) settings.insert(settings.end(), t->cannot_run.begin(), t->cannot_run.end());
  return settings;
}

json schema(const std::string& name) {
  return load_json_file(TALLY_SOURCE_DIR "/docs/schemas/" + name + ".schema.json");
}

std::string joined(const std::vector<std::string>& errors) {
  std::string out;
  for (const std::string& e : errors) out += "\n  " + e;
  return out;
}

// Every case file of seeds/ (not seeds/real/: those are cases of a real target, run elsewhere).
std::vector<fs::path> seed_files() {
  std::vector<fs::path> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(TALLY_SOURCE_DIR "/seeds"))
    if (entry.is_regular_file() && entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

// Every property name of every object `value` holds, as "/a/b" paths without array indices, so a
// test can say which optional fields the documents it validated held.
void collect_properties(const json& value, const std::string& at, std::set<std::string>& out) {
  if (value.is_object()) {
    for (const auto& [key, item] : value.items()) {
      out.insert(at + "/" + key);
      collect_properties(item, at + "/" + key, out);
    }
  } else if (value.is_array()) {
    for (const json& item : value) collect_properties(item, at, out);
  }
}

// Calls visit(subschema, where) for every schema object inside `schema`.
template <class Visit>
void for_each_subschema(const json& schema, const std::string& at, Visit visit) {
  if (!schema.is_object()) return;
  visit(schema, at);
  for (const char* key : {"properties", "patternProperties", "$defs"})
    if (schema.contains(key))
      for (const auto& [name, sub] : schema[key].items()) for_each_subschema(sub, at + "/" + key + "/" + name, visit);
  if (schema.contains("items")) for_each_subschema(schema["items"], at + "/items", visit);
  if (schema.contains("anyOf"))
    for (std::size_t i = 0; i < schema["anyOf"].size(); ++i)
      for_each_subschema(schema["anyOf"][i], at + "/anyOf/" + std::to_string(i), visit);
  if (schema.contains("additionalProperties")) for_each_subschema(schema["additionalProperties"], at + "/additionalProperties", visit);
}

const std::vector<std::string> kSchemas = {"hello", "result", "gradient-index", "manifest", "groups", "case"};

TEST(BorderSchemas, EveryObjectRefusesPropertiesItDoesNotListAndEveryFieldIsDescribed) {
  for (const std::string& name : kSchemas) {
    const json s = schema(name);
    EXPECT_EQ(s.value("$schema", ""), "https://json-schema.org/draft/2020-12/schema") << name;
    for_each_subschema(s, name, [&](const json& sub, const std::string& at) {
      const json type = sub.value("type", json());
      const bool object = sub.contains("properties") || sub.contains("patternProperties") || type == "object" ||
                          (type.is_array() && std::find(type.begin(), type.end(), "object") != type.end());
      if (object) {
        EXPECT_EQ(sub.value("additionalProperties", json(true)), json(false)) << at;
      }
      if (sub.contains("properties")) {
        for (const auto& [key, property] : sub["properties"].items()) {
          // Described where it is, or where its $ref leads (the hello's fault tables' entries).
          const std::string ref = property.value("$ref", ""), prefix = "#/$defs/";
          const std::string def = ref.rfind(prefix, 0) == 0 ? ref.substr(prefix.size()) : "";
          EXPECT_TRUE(property.contains("description") || (!def.empty() && s["$defs"][def].contains("description")))
              << at << "/" << key << " has no description";
        }
      }
      if (sub.contains("required")) {
        for (const json& key : sub["required"])
          EXPECT_TRUE(sub.contains("properties") && sub["properties"].contains(key.get<std::string>()))
              << at << ": requires " << key << ", which it does not list";
      }
    });
  }
}

TEST(BorderSchemas, TheCheckerRefusesWhatTheSchemasRefuse) {
  const json hello = schema("hello");
  json ok = {{"framework", "megatron-core"}, {"version", "0.19.2"}, {"world", 2}, {"producer", "p"}};
  EXPECT_EQ(schema_errors(hello, ok), std::vector<std::string>{});
  json bad = ok;
  bad["world"] = 2.5;
  EXPECT_EQ(schema_errors(hello, bad), std::vector<std::string>{"/world: expected type \"integer\", got 2.5"});
  bad = ok;
  bad["gpu_name"] = "H200";
  EXPECT_EQ(schema_errors(hello, bad), std::vector<std::string>{": the property \"gpu_name\" is not allowed"});
  bad = ok;
  bad["plants"] = {{"no-such-fault", "x"}};
  EXPECT_EQ(schema_errors(hello, bad), std::vector<std::string>{"/plants: the property \"no-such-fault\" is not allowed"});
  bad = ok;
  bad["version"] = "0.19.2\n";  // a pattern's end is no "$", which matches before a final newline
  EXPECT_EQ(schema_errors(hello, bad).size(), 1u);
  EXPECT_THROW(read_hello(bad.dump(), every_cannot_run_setting()), std::invalid_argument);
  bad = ok;
  bad.erase("version");
  EXPECT_EQ(schema_errors(hello, bad), std::vector<std::string>{": the required property \"version\" is missing"});
  EXPECT_THROW(schema_errors(json{{"type", "object"}, {"if", json::object()}}, ok), std::invalid_argument)
      << "a keyword the checker does not know is never skipped";
}

// --- what tally writes --------------------------------------------------------------------------

TEST(BorderSchemas, TheGradientIndexOfEverySeedCaseValidates) {
  const json s = schema("gradient-index");
  std::set<std::string> seen;
  std::vector<fs::path> files = seed_files();
  for (const fs::directory_entry& entry : fs::directory_iterator(TALLY_SOURCE_DIR "/seeds/real"))
    if (entry.path().filename().string().starts_with("deepspeed-") && entry.path().extension() == ".json" &&
        !entry.path().string().ends_with(".finding.json"))
      files.push_back(entry.path());
  for (const fs::path& file : files) {
    const casefile::Case c = casefile::load_case_file(file.string(), run::case_frameworks());
    // As the case's target sends it: with its reduction groups' shares where the row states them.
    const FrameworkTarget* row = framework_of(c);
    std::optional<ReductionGroups> reduction;
    if (row && row->reduction_groups) reduction = row->reduction_groups(c);
    const json index = json::parse(logical_gradients(c, reduction).index_json);
    EXPECT_EQ(schema_errors(s, index), std::vector<std::string>{}) << file << joined(schema_errors(s, index));
    collect_properties(index, "", seen);
  }
  EXPECT_TRUE(seen.count("/params/last_stage_copy")) << "no seed has a tied copy on the last stage";
  EXPECT_TRUE(seen.count("/shares/given_whole")) << "no DeepSpeed fixture is sent with its reduction groups' shares";
}

TEST(BorderSchemas, TheGradientIndexNamesEveryParamClassTallyHas) {
  std::vector<std::string> classes;
  for (topologies::ParamClass c : topologies::kAllParamClasses) classes.emplace_back(topologies::class_name(c));
  EXPECT_EQ(schema("gradient-index")["properties"]["params"]["items"]["properties"]["class"]["enum"], json(classes));
}

// The model target's manifests of a case, written as `tally run --manifests` writes them.
fs::path write_model_manifests(const casefile::Case& c, const fs::path& dir) {
  const CaseRun run = run_case_with_record(c);
  if (!run.record) return {};
  manifest::write_run(dir.string(), model_manifests(c, *run.record));
  return dir;
}

void expect_manifest_folder_valid(const fs::path& dir, const json& manifest_schema, const json& groups_schema,
                                  std::set<std::string>& seen) {
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const json document = load_json_file(entry.path().string());
    const json& s = name == "groups.json" ? groups_schema : manifest_schema;
    EXPECT_EQ(schema_errors(s, document), std::vector<std::string>{}) << entry.path() << joined(schema_errors(s, document));
    collect_properties(document, name == "groups.json" ? "groups.json" : "", seen);
  }
}

TEST(BorderSchemas, TheModelTargetsManifestsOfEverySeedCaseValidate) {
  const json manifest_schema = schema("manifest"), groups_schema = schema("groups");
  const fs::path root = fs::temp_directory_path() / ("tally-border-manifests-" + std::to_string(::getpid()));
  std::set<std::string> seen;
  int folders = 0;
  std::vector<std::pair<std::string, casefile::Case>> cases;
  for (const fs::path& file : seed_files()) cases.emplace_back(file.stem().string(), casefile::load_case_file(file.string(), run::case_frameworks()));
  // No seed has MTP heads in a grad-norm group of their own, whose norm a manifest reports apart.
  casefile::Case mtp = casefile::load_case_file(TALLY_SOURCE_DIR "/seeds/founding-6099-world2.pass.json", run::case_frameworks());
  mtp.model.mtp_num_layers = 1;
  mtp.model.mtp_detach_heads = true;
  mtp.expect.reset();
  cases.emplace_back("mtp-detached-heads", mtp);
  for (const auto& [name, c] : cases) {
    if (kDeepSpeedSection.of(c)) continue;  // a case of the deepspeed target only: tally's model refuses it
    const fs::path dir = write_model_manifests(c, root / name);
    if (dir.empty()) continue;  // a run that hangs (empty-rank-skips-collective) writes none
    ++folders;
    expect_manifest_folder_valid(dir, manifest_schema, groups_schema, seen);
  }
  fs::remove_all(root);
  EXPECT_GT(folders, 40);
  // The optional fields were there to be checked.
  for (const char* field : {"groups.json/groups", "/optimizers/main_params/clipped_stats", "/reported/group_norms",
                            "/optimizers/clip/coefficient", "/params/attributes/is_gtp_weight_remat"})
    EXPECT_TRUE(seen.count(field)) << field << " is in no manifest of the seeds";
}

TEST(BorderSchemas, TheAdaptersManifestsOfTheRealSeedsValidate) {
  // Written by the Python adapters on real frameworks (seeds/real/*.manifests), version 2 ones.
  const json manifest_schema = schema("manifest"), groups_schema = schema("groups");
  std::set<std::string> seen;
  int folders = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(TALLY_SOURCE_DIR "/seeds/real"))
    if (entry.is_directory() && fs::exists(entry.path() / "groups.json")) {
      ++folders;
      expect_manifest_folder_valid(entry.path(), manifest_schema, groups_schema, seen);
    }
  EXPECT_GT(folders, 10);
}

TEST(BorderSchemas, EverySeedCaseFileAndTheRequestTallySendsValidate) {
  const json s = schema("case");
  std::set<std::string> seen;
  std::vector<fs::path> files = seed_files();
  // seeds/real's case files; its finding files (*.finding.json) have a schema of their own.
  for (const fs::directory_entry& entry : fs::directory_iterator(TALLY_SOURCE_DIR "/seeds/real"))
    if (entry.is_regular_file() && entry.path().extension() == ".json" &&
        !entry.path().filename().string().ends_with(".finding.json"))
      files.push_back(entry.path());
  for (const fs::path& file : files) {
    const json document = load_json_file(file.string());
    EXPECT_EQ(schema_errors(s, document), std::vector<std::string>{}) << file << joined(schema_errors(s, document));
    collect_properties(document, "", seen);
  }
  for (const char* field : {"/target/manifests", "/deepspeed/zero_stage", "/gradients/stated", "/model/params/gradient",
                            "/expect/miscounted"})
    EXPECT_TRUE(seen.count(field)) << field << " is in no seed case";
}

TEST(BorderSchemas, TheCatalogsFaultsAreTheHellosPlantableFaults) {
  const json s = schema("hello");
  std::vector<std::string> catalog, listed;
  for (const vocab::FaultInfo& f : vocab::fault_catalog()) catalog.emplace_back(f.name);
  for (const auto& [name, ignored] : s["$defs"]["faults"]["properties"].items()) listed.push_back(name);
  std::sort(catalog.begin(), catalog.end());
  std::sort(listed.begin(), listed.end());
  EXPECT_EQ(listed, catalog) << "a fault added to or renamed in vocab/faults.cpp is named in docs/schemas/hello.schema.json";
}

template <class Enum, std::size_t N, class NameOf>
json names_of(const std::array<Enum, N>& all, NameOf name_of) {
  json names = json::array();
  for (Enum value : all) names.push_back(std::string(name_of(value)));
  return names;
}

TEST(BorderSchemas, TheCaseSchemasNamesAreTallys) {
  const json s = schema("case");
  const json& p = s["properties"];
  json faults = json::array(), optimizers = json::array(), frameworks = json::array();
  for (const vocab::FaultInfo& f : vocab::fault_catalog()) faults.push_back(std::string(f.name));
  for (const vocab::OptimizerModelInfo& o : vocab::optimizer_models()) optimizers.push_back(std::string(o.name));
  for (const FrameworkTarget* t : framework_targets()) {
    frameworks.push_back(std::string(t->name));
    if (!t->section.empty()) EXPECT_TRUE(p.contains(std::string(t->section))) << "the schema lacks " << t->section;
  }
  const json classes = names_of(topologies::kAllParamClasses, topologies::class_name);
  EXPECT_EQ(p["faults"]["items"]["enum"], faults);
  EXPECT_EQ(p["faults"]["maxItems"], vocab::kFaultCount);
  EXPECT_EQ(p["optimizer"]["properties"]["model"]["enum"], optimizers);
  EXPECT_EQ(p["target"]["properties"]["framework"]["enum"], frameworks);
  EXPECT_EQ(p["gradients"]["properties"]["mode"]["enum"], names_of(kernels::kAllGradientModes, kernels::mode_name));
  EXPECT_EQ(p["gradients"]["properties"]["dtype"]["enum"], names_of(kernels::kAllDtypes, kernels::dtype_name));
  EXPECT_EQ(p["gradients"]["properties"]["classes"]["items"]["enum"], classes);
  EXPECT_EQ(s["$defs"]["custom_param"]["properties"]["class"]["enum"], classes);
  EXPECT_EQ(s["$defs"]["stated_for_class"]["properties"]["class"]["enum"], classes);
}

TEST(BorderSchemas, TheHellosDtypesAreTallysDtypes) {
  std::vector<std::string> dtypes;
  for (kernels::Dtype d : kernels::kAllDtypes) dtypes.emplace_back(kernels::dtype_name(d));
  EXPECT_EQ(schema("hello")["properties"]["dtypes"]["items"]["enum"], json(dtypes));
}

TEST(BorderSchemas, TheHellosCannotRunSettingsAreTheOnesTallyReads) {
  const json hello = schema("hello");
  std::vector<std::string> listed;
  for (const auto& [name, ignored] : hello["properties"]["cannot_run"]["properties"].items()) listed.push_back(name);
  std::vector<std::string> rows;
  for (std::string_view setting : every_cannot_run_setting()) rows.emplace_back(setting);
  std::sort(rows.begin(), rows.end());
  EXPECT_EQ(listed, rows) << "the schema lists what every row's cannot_run does";
  try {
    read_hello(R"({"framework": "deepspeed", "version": "0.19.8", "world": 2, "producer": "p",
                  "cannot_run": {"deepspeed.cpu_adam": "no"}})",
               framework_target("deepspeed")->cannot_run);
    ADD_FAILURE() << "a setting tally does not know must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("hello.cannot_run[\"deepspeed.cpu_adam\"]: not a case setting this framework's worker may decline (deepspeed.fused_adam, deepspeed.launcher)"),
              std::string::npos)
        << e.what();
  }
}

// --- what tally reads: the schema and the reader name the same fields ---------------------------

// `read` takes the full document of `schema`, refuses it with a property more naming that
// property, refuses it without each required property naming that, and takes it without each
// optional one.
template <class Read>
void expect_reader_matches_schema(const json& s, Read read, const std::string& root) {
  const json full = full_instance(s);
  ASSERT_EQ(schema_errors(s, full), std::vector<std::string>{}) << full.dump();
  try {
    read(full.dump());
  } catch (const std::exception& e) {
    // The rest would fail on the same field: one line says what differs.
    FAIL() << "every field the schema lists must be one tally reads: " << e.what();
  }

  json extra = full;
  extra["x_not_in_the_schema"] = 1;
  ASSERT_FALSE(schema_errors(s, extra).empty());
  try {
    read(extra.dump());
    ADD_FAILURE() << "a field the schema does not list must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(root + ".x_not_in_the_schema: unknown key"), std::string::npos) << e.what();
  }

  const std::vector<std::string> required = s["required"].get<std::vector<std::string>>();
  for (const auto& [key, ignored] : s["properties"].items()) {
    json without = full;
    without.erase(key);
    const bool is_required = std::find(required.begin(), required.end(), key) != required.end();
    if (!is_required) {
      EXPECT_NO_THROW(read(without.dump())) << "the schema says " << key << " is optional";
      continue;
    }
    try {
      read(without.dump());
      ADD_FAILURE() << "the schema requires " << key << ": tally must too";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("missing key '" + key + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(BorderSchemas, TallysHelloReaderTakesExactlyTheFieldsOfTheHelloSchema) {
  expect_reader_matches_schema(schema("hello"), [](const std::string& text) { return read_hello(text, every_cannot_run_setting()); }, "hello");
}

TEST(BorderSchemas, TallysResultReaderTakesExactlyTheFieldsOfTheResultSchema) {
  expect_reader_matches_schema(schema("result"), [](const std::string& text) { return read_result(text); }, "result");
}

TEST(BorderSchemas, TheFullHelloIsReadFieldByField) {
  const WorkerHello h = read_hello(full_instance(schema("hello")).dump(), every_cannot_run_setting());
  EXPECT_EQ(h.world, 1);
  EXPECT_EQ(h.backend, "nccl");
  EXPECT_EQ(h.devices, 0);
  EXPECT_EQ(h.dtypes, std::vector<std::string>{"fp32"});
  EXPECT_TRUE(h.megatron_model_rules);
  ASSERT_EQ(h.cannot_run.size(), 6u);
  EXPECT_EQ(h.cannot_run.begin()->first, "deepspeed.fused_adam");
  EXPECT_EQ(std::next(h.cannot_run.begin())->first, "deepspeed.launcher");
  EXPECT_EQ(std::next(h.cannot_run.begin(), 2)->first, "gradients.enter");
  EXPECT_EQ(std::next(h.cannot_run.begin(), 3)->first, "megatron_fsdp");
  EXPECT_EQ(std::next(h.cannot_run.begin(), 4)->first, "model.num_experts");
  EXPECT_EQ(std::next(h.cannot_run.begin(), 5)->first, "optimizer.layer_wise_param_layout");
  EXPECT_EQ(h.plants.planted.size(), vocab::fault_catalog().size());
  EXPECT_EQ(h.plants.not_planted.size(), vocab::fault_catalog().size());
}

TEST(BorderSchemas, TheStandInWorkersHelloAndResultsValidate) {
  // tests/run/model_worker.sh, as megatron-core and as DeepSpeed (dtypes, model_rules).
  for (const char* framework : {"megatron-core", "deepspeed"}) {
    ::setenv("TALLY_TEST_WORKER_FRAMEWORK", framework, 1);
    const fs::path dir = fs::temp_directory_path() / ("tally-border-worker-" + std::to_string(::getpid()));
    WorkerOptions o;
    o.command = "'" TALLY_SOURCE_DIR "/tests/run/model_worker.sh' '" TALLY_BINARY_DIR "/cli/tally' {world}";
    o.work_dir = dir.string();
    o.keep_passing = true;
    o.judge = judge_as_a_run_of_the_case(oracle::kFrameworkRtol);
    o.cannot_run_settings = every_cannot_run_setting();
    {
      WorkerPool pool(o);
      EXPECT_EQ(pool.hello(2).framework, framework);
      casefile::Case c = casefile::load_case_file(TALLY_SOURCE_DIR "/seeds/founding-6099-world2.pass.json", run::case_frameworks());
      c.expect.reset();
      pool.execute(c);
    }
    ::unsetenv("TALLY_TEST_WORKER_FRAMEWORK");
    const fs::path queue = dir / "world-2";
    for (const auto& [file, name] : std::vector<std::pair<std::string, std::string>>{
             {"hello.json", "hello"}, {"case-1.result.json", "result"}, {"case-1.json", "case"}}) {
      const json document = load_json_file((queue / file).string());
      EXPECT_EQ(schema_errors(schema(name), document), std::vector<std::string>{})
          << framework << " " << file << joined(schema_errors(schema(name), document));
    }
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace tally::run
