// Time to shard a large model over every rank of a large world: topologies::local_params for each
// rank of a 16-layer MoE (64 experts). Usage: sharding_bench [repetitions]. One line per world:
// the best wall time and the local params held over all ranks.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "topologies/logical_model.h"
#include "topologies/rank_layout.h"
#include "topologies/sharding.h"

int main(int argc, char** argv) {
  using namespace tally::topologies;
  const int repetitions = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  ModelSpec spec;
  spec.num_layers = 16;
  spec.hidden_size = 1024;
  spec.num_attention_heads = 16;
  spec.vocab_size = 32768;
  spec.num_experts = 64;
  spec.moe_ffn_hidden_size = 512;
  std::printf("%-9s %-24s %10s %16s\n", "world", "tp/cp/pp/ep/etp", "best s", "params held");
  for (int world : {16384, 65536}) {
    ParallelConfig config;
    config.world = world;
    config.tp = 4;
    config.cp = 2;
    config.pp = 4;
    config.ep = 8;
    config.etp = 1;
    const LogicalModel model(spec, config);
    const RankLayout layout(config);
    double best = 1e300;
    std::int64_t held = 0;
    std::vector<LocalParam> locals;
    for (int i = 0; i < repetitions; ++i) {
      held = 0;
      const auto start = std::chrono::steady_clock::now();
      for (int rank = 0; rank < world; ++rank) {
        local_params(model, layout, rank, locals);
        held += static_cast<std::int64_t>(locals.size());
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::printf("%-9d %-24s %10.3f %16lld\n", world, "4/2/4/8/1", best, static_cast<long long>(held));
  }
  return 0;
}
