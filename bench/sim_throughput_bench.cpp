// Cases per second of the in-process backend (`sim`): each case builds the rank layout, the
// model and every rank's shards, runs the grad-norm path on every rank with the ledger, computes
// the Eigen ground truth and judges every statistic. Then one large world, timed alone.
//
// Usage: sim_throughput_bench [cases] [seed] [modes: mixed | exact | random]
// mixed: dyadic, ones, rank-encoded, uniform and normal gradients in equal parts.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>

#include "casefile/case.h"
#include "run/run_case.h"
#include "topologies/enumerate.h"

namespace {

using tally::casefile::Case;
using tally::topologies::ParallelConfig;

// CPU seconds of this process: what "cases per second on one core" means on a shared machine.
double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

long peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024;
}

// A mix: worlds 1..64, small GPT/MoE models (2-4 layers, hidden 16-64), every optimizer model,
// exact and random gradient modes.
Case sample_case(std::mt19937_64& rng, std::map<int, std::vector<ParallelConfig>>& configs,
                 const std::vector<tally::kernels::GradientMode>& modes) {
  const int worlds[] = {1, 2, 4, 8, 16, 32, 64};
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  while (true) {
    const int world = worlds[pick(7)];
    std::vector<ParallelConfig>& list = configs[world];
    if (list.empty()) {
      tally::topologies::EnumerateFilter filter;
      filter.max_tp = 8;
      filter.max_pp = 4;
      tally::topologies::for_each_config(world, filter, [&](const ParallelConfig& c) {
        if (c.order == "tp-cp-ep-dp-pp" || c.order == "tp-cp-ep-pp-dp") list.push_back(c);
      });
    }
    Case c;
    c.topology = list[static_cast<std::size_t>(pick(static_cast<int>(list.size())))];
    const ParallelConfig& t = c.topology;
    tally::topologies::ModelSpec& m = c.model;
    m.num_attention_heads = t.tp * (1 + pick(2));
    m.hidden_size = 16 * (1 + pick(4));
    if (m.hidden_size % m.num_attention_heads != 0) continue;
    m.ffn_hidden_size = 4 * m.hidden_size;
    m.vocab_size = 32 * t.tp;
    m.num_layers = t.pp * std::max(1, (2 + pick(3)) / t.pp);
    const bool moe = t.ep > 1 || t.etp != t.tp || pick(2) == 0;
    if (moe) {
      m.num_experts = t.ep * (1 + pick(2));
      m.moe_ffn_hidden_size = 16 * t.etp;
    }
    m.add_bias_linear = !(moe && t.etp != 1);
    c.path.optimizer = static_cast<tally::vocab::OptimizerModel>(pick(4));
    c.path.gradients.generator.mode = modes[static_cast<std::size_t>(pick(static_cast<int>(modes.size())))];
    c.path.gradients.generator.seed = rng();
    c.path.max_norm = 1.0;
    if (tally::casefile::check_case(c)) continue;
    return c;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int cases = argc > 1 ? std::max(1, std::atoi(argv[1])) : 2000;
  const std::uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
  const std::string mix = argc > 3 ? argv[3] : "mixed";
  using tally::kernels::GradientMode;
  std::vector<GradientMode> modes;
  if (mix != "random")
    modes.insert(modes.end(), {GradientMode::dyadic, GradientMode::ones, GradientMode::rank_encoded});
  if (mix != "exact") modes.insert(modes.end(), {GradientMode::uniform, GradientMode::normal});
  std::mt19937_64 rng(seed);
  std::map<int, std::vector<ParallelConfig>> configs;
  std::vector<Case> cases_to_run;
  for (int i = 0; i < cases; ++i) cases_to_run.push_back(sample_case(rng, configs, modes));

  long ranks = 0, failures = 0;
  const double cpu_start = cpu_seconds();
  const auto start = std::chrono::steady_clock::now();
  for (const Case& c : cases_to_run) {
    ranks += c.topology.world;
    if (tally::run::run_case(c).kind != tally::oracle::Verdict::Kind::pass) ++failures;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double cpu = cpu_seconds() - cpu_start;
  std::printf("%s modes: %d cases (worlds 1-64, mean world %.1f): %.0f cases per CPU second "
              "(%.2f CPU s; wall %.2f s, %.0f cases/s), %ld not passing\n",
              mix.c_str(), cases, static_cast<double>(ranks) / cases, cases / cpu, cpu, seconds,
              cases / seconds, failures);

  // One large world: tp 8, pp 8, ep 64, a 16-layer MoE model, exact mode, ledger and clipping.
  Case large;
  large.topology.world = 16384;
  large.topology.tp = 8;
  large.topology.pp = 8;
  large.topology.ep = 64;
  large.topology.etp = 1;
  large.model.num_layers = 16;
  large.model.hidden_size = 64;
  large.model.num_attention_heads = 8;
  large.model.vocab_size = 256;
  large.model.num_experts = 64;
  large.model.moe_ffn_hidden_size = 64;
  large.path.gradients.generator.mode = tally::kernels::GradientMode::dyadic;
  large.path.max_norm = 1.0;
  for (tally::vocab::OptimizerModel model :
       {tally::vocab::OptimizerModel::plain, tally::vocab::OptimizerModel::distributed,
        tally::vocab::OptimizerModel::layerwise}) {
    large.path.optimizer = model;
    const auto t0 = std::chrono::steady_clock::now();
    const tally::oracle::Verdict verdict = tally::run::run_case(large);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("world 16384 (tp 8, pp 8, ep 64), 16-layer MoE, 64 experts, %s: %s in %.2f s, peak RSS %ld MiB\n",
                std::string(tally::vocab::optimizer_model_name(model)).c_str(),
                std::string(tally::oracle::kind_name(verdict.kind)).c_str(), s, peak_rss_mib());
  }
  return 0;
}
