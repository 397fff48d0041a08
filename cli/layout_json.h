// A configuration as JSON, the one form `tally topo --json` and `tally layout --json` share: world,
// tp, cp, pp, dp, ep, etp, edp and order, then vpp and dist_opt_instances when they are not 1;
// and a rank's coordinates.
#pragma once

#include <nlohmann/json.hpp>

#include "topologies/rank_layout.h"

namespace tally::cli {

nlohmann::ordered_json config_json(const topologies::RankLayout& layout);
// {"tp":..,"cp":..,"dp":..,"pp":..,"etp":..,"ep":..,"edp":..}
nlohmann::ordered_json coordinates_json(const topologies::RankLayout& layout, int rank);

}  // namespace tally::cli
