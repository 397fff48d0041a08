// The known matcher measured in both directions (fuzz/known_measure.h, issue 64): for each
// megatron-core release tally models and each world, generated cases run on a stand-in as the
// release itself (its failures must all be known), as the release with one more catalog fault that
// no finding is the cause of (a failure it changes must be new), and as a framework with that fault
// alone (new where the case passes without it, but for exact coincidences with the release).
// Prints one table per release and world, each fault's failures and misses; exit 1 on any miss.
//
// Usage: known_matcher_bench [cases per world] [seed] [findings folder]   (from the repository root)
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz/known.h"
#include "fuzz/known_measure.h"
#include "gradnorm/releases.h"
#include "vocab/faults.h"

int main(int argc, char** argv) {
  using namespace tally;
  const std::int64_t cases = argc > 1 ? std::atoll(argv[1]) : 200;
  const std::uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
  const std::string folder = argc > 3 ? argv[3] : "seeds/real";
  std::int64_t all_misses = 0;
  for (const gradnorm::ReleaseInfo& info : gradnorm::megatron_releases()) {
    const std::vector<fuzz::KnownFinding> known = fuzz::load_known(folder, "megatron-core", info.name);
    for (int world : {2, 4, 8}) {
      const fuzz::MatcherMeasure m = fuzz::measure_known_matcher(known, std::string(info.name), world, cases, seed);
      std::int64_t in_release = 0, alone = 0, misses = m.release_new, coincidences = 0;
      std::printf("\nmegatron-core %s, world %d: %lld cases in %.1f s; the release failed %lld, called new %lld\n",
                  std::string(info.name).c_str(), world, static_cast<long long>(m.cases), m.seconds,
                  static_cast<long long>(m.release_failures), static_cast<long long>(m.release_new));
      std::printf("  %-36s %18s %8s %18s %8s %12s\n", "fault", "in the release", "known", "alone", "known", "coincident");
      for (const vocab::FaultInfo& f : vocab::fault_catalog()) {
        const auto r = m.in_release.find(f.fault);
        const auto a = m.alone.find(f.fault);
        if (r == m.in_release.end() && a == m.alone.end()) continue;
        const fuzz::PlantedCounts rc = r == m.in_release.end() ? fuzz::PlantedCounts{} : r->second;
        const fuzz::PlantedCounts ac = a == m.alone.end() ? fuzz::PlantedCounts{} : a->second;
        std::printf("  %-36s %18lld %8lld %18lld %8lld %12lld\n", std::string(f.name).c_str(),
                    static_cast<long long>(rc.failures), static_cast<long long>(rc.known),
                    static_cast<long long>(ac.failures), static_cast<long long>(ac.known),
                    static_cast<long long>(ac.coincidences));
        in_release += rc.failures, alone += ac.failures, misses += rc.known + ac.known, coincidences += ac.coincidences;
      }
      std::printf("  %-36s %18lld %8s %18lld %8s %12lld\n", "all", static_cast<long long>(in_release), "",
                  static_cast<long long>(alone), "", static_cast<long long>(coincidences));
      std::printf("  misses: %lld\n", static_cast<long long>(misses));
      for (const std::string& line : m.misses) std::printf("    %s\n", line.c_str());
      all_misses += misses;
    }
  }
  return all_misses == 0 ? 0 : 1;
}
