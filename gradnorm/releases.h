// Released megatron-core rules: where a release's grad-norm path differs from the rules tally
// checks (Megatron-LM main with its counting fixes, docs/megatron-reference.md §2 to §5), each
// difference is a fault of the catalog. Running a case with a release's faults asks "what would
// that release report here?"; the truth is unchanged, so the verdict is whether it miscounts.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "vocab/faults.h"
#include "gradnorm/optimizer_model.h"
#include "topologies/parallel_config.h"

namespace tally::gradnorm {

enum class MegatronRelease : std::uint8_t { v0_16_1, v0_19_2 };
inline constexpr int kReleaseCount = 2;

struct ReleaseInfo {
  MegatronRelease release;
  std::string_view name;      // "0.16.1"
  std::string_view evidence;  // what shows these are its rules
};
const std::array<ReleaseInfo, kReleaseCount>& megatron_releases();
std::optional<MegatronRelease> release_from_name(std::string_view name);

// The faults that are `release`'s own rules for `optimizer`'s path.
vocab::FaultSet release_faults(MegatronRelease release, vocab::OptimizerModel optimizer);

// The first size of `config` the release has no axis for, as one line; nullopt when it has all.
std::optional<std::string> check_release_config(MegatronRelease release,
                                                const topologies::ParallelConfig& config);

}  // namespace tally::gradnorm
