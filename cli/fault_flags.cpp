#include "cli/fault_flags.h"

#include <algorithm>
#include <sstream>

#include "cli/usage_error.h"

namespace tally::cli {

std::vector<vocab::Fault> parse_fault_list(const std::vector<std::string>& lists,
                                              const std::string& flag) {
  const std::string choices = "(none, all, or names from tally run --list-faults)";
  std::vector<vocab::Fault> faults;
  bool none = false;
  auto add = [&](vocab::Fault fault) {
    if (std::find(faults.begin(), faults.end(), fault) == faults.end()) faults.push_back(fault);
  };
  for (const std::string& list : lists) {
    if (list.empty()) throw UsageError(flag + " is empty " + choices);
    std::stringstream items(list);
    std::string name;
    while (std::getline(items, name, ',')) {
      if (name.empty()) throw UsageError(flag + " '" + list + "' holds an empty name " + choices);
      if (name == "none") {
        none = true;
      } else if (name == "all") {
        for (const vocab::FaultInfo& info : vocab::fault_catalog()) add(info.fault);
      } else if (const std::optional<vocab::Fault> fault = vocab::fault_from_name(name)) {
        add(*fault);
      } else {
        throw UsageError(flag + " '" + name + "' is not in the catalog " + choices);
      }
    }
    if (list.back() == ',') throw UsageError(flag + " '" + list + "' holds an empty name " + choices);
  }
  if (none && !faults.empty()) throw UsageError(flag + ": none cannot be combined with faults");
  return faults;
}

}  // namespace tally::cli
