// Throughput of local_stats_cpu (kernels/local_stats.h): generated gradient elements visited per
// second on one core, for each gradient mode, storage dtype and accumulation precision.
// Usage: local_stats_bench [seconds per case, default 0.3]. Each case is a rank's shard list of a
// realistic shape (a column-parallel box, a row-parallel box, a distributed-optimizer range, a
// bias); it runs the whole call repeatedly for at least the given time and reports the best run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/local_stats.h"

namespace {

using namespace tally::kernels;

ShardDesc box2(std::uint64_t param, std::int64_t rows, std::int64_t cols, std::int64_t row0,
               std::int64_t nrows, std::int64_t col0, std::int64_t ncols) {
  ShardDesc s;
  s.param_id = param;
  s.ndim = 2;
  s.shape = {rows, cols, 0, 0};
  s.offset = {row0, col0, 0, 0};
  s.extent = {nrows, ncols, 0, 0};
  return s;
}

std::vector<ShardDesc> shards(std::int64_t scale) {
  std::vector<ShardDesc> list;
  list.push_back(box2(0, 4 * scale, 1024, scale, 2 * scale, 0, 1024));  // column-parallel rows
  list.push_back(box2(1, 1024, 4 * scale, 0, 1024, scale, scale));    // row-parallel columns
  ShardDesc dist = box2(2, 2 * scale, 1024, 0, 2 * scale, 0, 1024);   // a dist-opt range
  dist.range = ElementRange{12345, 12345 + scale * 1024};
  list.push_back(dist);
  list.push_back(box2(3, 1, 4096, 0, 1, 0, 4096));  // a bias
  return list;
}

std::int64_t visited(const std::vector<ShardDesc>& list) {
  std::int64_t n = 0;
  for (const ShardDesc& s : list) n += visited_numel(s);
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::max(0.01, std::atof(argv[1])) : 0.3;
  std::printf("%-13s %-5s %-5s %12s %14s\n", "mode", "dtype", "accum", "elements", "elements/s");
  double sink = 0;
  for (GradientMode mode : {GradientMode::ones, GradientMode::dyadic, GradientMode::rank_encoded,
                            GradientMode::uniform, GradientMode::normal}) {
    // Normal values cost far more per element; a smaller list keeps each run short.
    const std::vector<ShardDesc> list = shards(mode == GradientMode::normal ? 256 : 2048);
    const std::int64_t n = visited(list);
    for (Dtype dtype : {Dtype::fp32, Dtype::bf16}) {
      for (Accumulation acc : {Accumulation::fp64, Accumulation::fp32}) {
        StatsOptions options;
        options.accumulation = acc;
        const GeneratorSpec gen{2024, mode, dtype};
        double best = 1e300, total = 0;
        do {
          const auto start = std::chrono::steady_clock::now();
          const LocalStats result = local_stats_cpu(list, gen, options);
          const auto stop = std::chrono::steady_clock::now();
          const double t = std::chrono::duration<double>(stop - start).count();
          best = std::min(best, t);
          total += t;
          sink += result.total.sum_squares;
        } while (total < seconds);
        std::printf("%-13s %-5s %-5s %12lld %14.3e\n", std::string(mode_name(mode)).c_str(),
                    std::string(dtype_name(dtype)).c_str(),
                    std::string(accumulation_name(acc)).c_str(), static_cast<long long>(n),
                    static_cast<double>(n) / best);
      }
    }
  }
  std::printf("(checksum %g)\n", sink);
  return 0;
}
