#include "run/automodel/section.h"

#include "casefile/case_file.h"
#include "io/json_read.h"

namespace tally::run {

using nlohmann::json;

AutomodelConfig read_automodel_config(const json& value, const std::string& path) {
  AutomodelConfig d;
  io::read_object(
      value, path,
      {{"dp_replicate",
        [&](const json& v, const std::string& p) { d.dp_replicate = static_cast<int>(io::read_integer(v, p, 1, 1 << 20)); }},
       {"sequence_parallel", [&](const json& v, const std::string& p) { d.sequence_parallel = io::read_bool(v, p); }},
       {"gradients_enter",
        [&](const json& v, const std::string& p) {
          d.before_reduction = casefile::read_before_reduction(v, p);
        }}},
      "the NeMo-Automodel configuration");
  return d;
}

nlohmann::ordered_json automodel_config_json(const AutomodelConfig& d) {
  nlohmann::ordered_json j = {{"dp_replicate", d.dp_replicate}, {"sequence_parallel", d.sequence_parallel}};
  // absent: after the reduction, as in earlier case files (whose digests stay theirs)
  if (d.before_reduction) j["gradients_enter"] = casefile::kBeforeReduction;
  return j;
}

}  // namespace tally::run
