// Time and memory to build a full RankLayout (every group of every family) for large worlds.
// Usage: rank_layout_bench [repetitions]. Prints one line per world: the best wall time over
// the repetitions and the growth of the process's peak resident memory while building it.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "topologies/rank_layout.h"

namespace {

long peak_rss_kib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

struct Case {
  int world, tp, pp, ep, etp;
};

}  // namespace

int main(int argc, char** argv) {
  const int repetitions = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  const Case cases[] = {
      {4096, 8, 4, 16, 1},    {16384, 8, 8, 64, 1},   {65536, 8, 16, 64, 1},
      {262144, 8, 16, 64, 1}, {1048576, 8, 16, 64, 1}};
  std::printf("%-9s %-26s %12s %14s %14s\n", "world", "tp/pp/ep/etp (default order)",
              "best ms", "peak RSS MiB", "groups held");
  for (const Case& c : cases) {
    tally::topologies::ParallelConfig config;
    config.world = c.world;
    config.tp = c.tp;
    config.pp = c.pp;
    config.ep = c.ep;
    config.etp = c.etp;
    double best_ms = 1e300;
    long groups = 0;
    const long rss_before = peak_rss_kib();
    for (int i = 0; i < repetitions; ++i) {
      const auto start = std::chrono::steady_clock::now();
      const tally::topologies::RankLayout layout(config);
      const auto stop = std::chrono::steady_clock::now();
      best_ms = std::min(best_ms, std::chrono::duration<double, std::milli>(stop - start).count());
      groups = 0;
      for (auto family : tally::topologies::kAllFamilies) groups += layout.group_count(family);
    }
    char shape[64];
    std::snprintf(shape, sizeof shape, "%d/%d/%d/%d", c.tp, c.pp, c.ep, c.etp);
    std::printf("%-9d %-26s %12.1f %14.1f %14ld\n", c.world, shape, best_ms,
                (peak_rss_kib() - rss_before) / 1024.0, groups);
  }
  return 0;
}
