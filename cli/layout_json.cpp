#include "cli/layout_json.h"

namespace tally::cli {

nlohmann::ordered_json config_json(const topologies::RankLayout& layout) {
  const topologies::ParallelConfig& c = layout.config();
  nlohmann::ordered_json j;
  j["world"] = c.world;
  j["tp"] = c.tp;
  j["cp"] = c.cp;
  j["pp"] = c.pp;
  j["dp"] = layout.dp();
  j["ep"] = c.ep;
  j["etp"] = c.etp;
  j["edp"] = layout.edp();
  if (topologies::uses_gtp(c)) {
    j["gtp"] = c.gtp;
    j["egtp"] = c.egtp;
  }
  j["order"] = c.order;
  if (c.vpp != 1) j["vpp"] = c.vpp;
  if (c.dist_opt_instances != 1) j["dist_opt_instances"] = c.dist_opt_instances;
  return j;
}

nlohmann::ordered_json coordinates_json(const topologies::RankLayout& layout, int rank) {
  const topologies::Coordinates c = layout.coordinates(rank);
  nlohmann::ordered_json j = {{"tp", c.tp},   {"cp", c.cp}, {"dp", c.dp},  {"pp", c.pp},
                              {"etp", c.etp}, {"ep", c.ep}, {"edp", c.edp}};
  if (topologies::uses_gtp(layout.config())) {
    j["gtp"] = c.gtp;
    j["egtp"] = c.egtp;
  }
  return j;
}

}  // namespace tally::cli
