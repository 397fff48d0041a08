#include "run/target_run.h"

#include <algorithm>
#include <map>
#include <stdexcept>

#include "vocab/gradients.h"
#include "manifest/manifest_json.h"
#include "manifest/to_record.h"
#include "oracle/ground_truth.h"
#include "oracle/judge.h"
#include "run/framework_worker.h"
#include "run/run_case.h"
#include "topologies/rank_layout.h"

namespace tally::run {

namespace {

std::string shape_text(const std::vector<std::int64_t>& sizes) {
  std::string out = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

std::vector<std::int64_t> sizes_of(const topologies::Shape& shape) {
  return {shape.dims.begin(), shape.dims.begin() + shape.rank};
}

std::string ranks_text(std::span<const int> ranks) {
  std::string out = "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out + "]";
}

// Whether rank `rank`'s group `name` in `m` holds exactly the ranks of `expected` (a manifest's
// groups are sorted rank lists), else why not.
std::optional<std::string> group_differs(const manifest::RunManifests& manifests, const manifest::RankManifest& m,
                                         const char* name, std::span<const int> expected) {
  const auto it = m.groups.find(name);
  if (it == m.groups.end()) return std::nullopt;  // the reader requires tp and expt_tp
  std::vector<int> want(expected.begin(), expected.end());
  std::sort(want.begin(), want.end());
  const std::vector<int>& got = manifests.group(it->second);
  if (got == want) return std::nullopt;
  return "rank " + std::to_string(m.rank) + "'s " + name + " group is " + ranks_text(got) + ", the case's " +
         ranks_text(want);
}

}  // namespace

std::optional<std::string> manifests_not_of_case(const casefile::Case& c, const topologies::LogicalModel& model,
                                                 const manifest::RunManifests& manifests) {
  const topologies::ParallelConfig& t = c.topology;
  const std::string of_case = " (the manifests are not a run of this case)";
  if (manifests.ranks.empty()) return "no rank's manifest";
  for (const manifest::RankManifest& m : manifests.ranks)
    if (m.world != t.world)
      return "rank " + std::to_string(m.rank) + "'s manifest is of world " + std::to_string(m.world) +
             ", the case's world is " + std::to_string(t.world) + of_case;
  if (static_cast<int>(manifests.ranks.size()) != t.world)
    return "the manifests hold " + std::to_string(manifests.ranks.size()) + " ranks, the case's world is " +
           std::to_string(t.world) + of_case;
  const manifest::ParallelSizes want{t.tp, t.cp, t.pp, topologies::dp(t), t.ep, t.etp};
  for (const manifest::RankManifest& m : manifests.ranks) {
    const manifest::ParallelSizes& got = m.parallel;
    if (got == want) continue;
    auto text = [](const manifest::ParallelSizes& p) {
      return "tp " + std::to_string(p.tp) + ", cp " + std::to_string(p.cp) + ", pp " + std::to_string(p.pp) +
             ", dp " + std::to_string(p.dp) + ", ep " + std::to_string(p.ep) + ", etp " + std::to_string(p.etp);
    };
    return "rank " + std::to_string(m.rank) + "'s manifest is of " + text(got) + ", the case's topology is " +
           text(want) + of_case;
  }
  const topologies::RankLayout layout(t);
  const bool experts = std::any_of(model.params().begin(), model.params().end(),
                                   [](const topologies::LogicalParam& p) { return p.expert >= 0; });
  for (const manifest::RankManifest& m : manifests.ranks) {
    if (auto d = group_differs(manifests, m, "tp", layout.group_ranks(topologies::Family::tp, m.rank)))
      return *d + of_case;
    // A model without experts has no use for the expert TP group, and a framework may not make one.
    if (!experts) continue;
    if (auto d = group_differs(manifests, m, "expt_tp", layout.group_ranks(topologies::Family::expt_tp, m.rank)))
      return *d + of_case;
  }
  std::map<std::string, const topologies::LogicalParam*> by_name;
  for (const topologies::LogicalParam& p : model.params()) by_name.emplace(p.name, &p);
  std::map<std::string, bool> held;
  for (const manifest::RankManifest& m : manifests.ranks)
    for (const manifest::ModelParam& p : m.params) {
      const auto it = by_name.find(p.logical_name);
      if (it == by_name.end())
        return "rank " + std::to_string(m.rank) + " holds param " + p.logical_name +
               ", which the case's model does not have" + of_case;
      if (p.logical_shape != sizes_of(it->second->shape))
        return "rank " + std::to_string(m.rank) + " holds param " + p.logical_name + " of shape " +
               shape_text(p.logical_shape) + ", the case's is " + shape_text(sizes_of(it->second->shape)) + of_case;
      held[p.logical_name] = true;
    }
  for (const topologies::LogicalParam& p : model.params())
    if (!held.count(p.name))
      return "no rank holds param " + p.name + " of the case's model" + of_case;
  return std::nullopt;
}

record::RunRecord record_in_model_order(const manifest::RunManifests& manifests,
                                        const topologies::LogicalModel& model) {
  record::RunRecord run = manifest::to_record_of_case(manifests);
  std::map<std::string, int> id_of;
  for (const topologies::LogicalParam& p : model.params()) id_of.emplace(p.name, p.id);
  std::vector<int> new_id(run.tensors.size());
  std::vector<record::Tensor> tensors(static_cast<std::size_t>(model.size()));
  for (std::size_t t = 0; t < run.tensors.size(); ++t) {
    const auto it = id_of.find(run.tensors[t].name);
    if (it == id_of.end()) throw std::invalid_argument("record_in_model_order: " + run.tensors[t].name);
    new_id[t] = it->second;
    tensors[static_cast<std::size_t>(it->second)] = run.tensors[t];
  }
  if (run.tensors.size() != tensors.size())
    throw std::invalid_argument("record_in_model_order: the manifests hold " + std::to_string(run.tensors.size()) +
                                " of the model's " + std::to_string(tensors.size()) + " params");
  run.tensors = std::move(tensors);
  // Ranks that share a local record (or a params list) keep sharing it.
  record::LocalRecordPool pool;
  std::map<const record::LocalRecord*, std::shared_ptr<const record::LocalRecord>> renumbered;
  for (record::RankRecord& rank : run.ranks) {
    auto [it, fresh] = renumbered.try_emplace(rank.local.get());
    if (fresh) {
      record::LocalRecord local = *rank.local;
      for (record::LocalParam& p : local.params.edit()) p.tensor = new_id[static_cast<std::size_t>(p.tensor)];
      it->second = pool.intern(local);
    }
    rank.local = it->second;
  }
  return run;
}

oracle::Verdict judge_target_manifests(const casefile::Case& c, const manifest::RunManifests& manifests,
                                       double rtol) {
  const topologies::LogicalModel model(c.model, c.topology);
  if (std::optional<std::string> difference = manifests_not_of_case(c, model, manifests))
    return oracle::infra_error_verdict("the manifests of the case", *difference);
  const record::RunRecord run = record_in_model_order(manifests, model);
  oracle::Bounds bounds;
  bounds.rtol = rtol;
  const std::vector<kernels::GeneratorSpec> generators = vocab::param_generators(c.path.gradients, model);
  const oracle::GradientSource gradients{&model, generators};
  return oracle::judge(run, truth_of(model, c.path), bounds, &gradients);
}

std::optional<std::string> manifests_not_of_request(const manifest::RunManifests& manifests,
                                                    const SentRequest& request) {
  for (const manifest::RankManifest& m : manifests.ranks) {
    const std::string rank = "rank " + std::to_string(m.rank) + "'s manifest";
    if (!m.case_digest)
      return rank + " does not echo " + request.name + "'s case_digest " + request.digest + " (from " + request.name +
             ".gradients.json): a worker writes it into every manifest, so that tally knows they answer the case it "
             "sent (docs/real-targets.md)";
    if (*m.case_digest == request.digest) continue;
    const auto earlier = request.earlier.find(*m.case_digest);
    return rank + " is of another case: it echoes case_digest " + *m.case_digest +
           (earlier != request.earlier.end() ? " (" + earlier->second + "'s)" : " (of no case tally sent this worker)") +
           ", not " + request.name + "'s " + request.digest + ": the worker answered " + request.name +
           " with the manifests of " + (earlier != request.earlier.end() ? earlier->second : "another case");
  }
  return std::nullopt;
}

oracle::Verdict judge_target_run(const casefile::Case& c, const std::string& dir, double rtol,
                                 const SentRequest* request) {
  manifest::RunManifests manifests;
  try {
    manifests = manifest::load_run(dir, 1);
  } catch (const std::exception& e) {
    return oracle::infra_error_verdict("reading the manifests in " + dir, e.what());
  }
  if (request)
    if (std::optional<std::string> why = manifests_not_of_request(manifests, *request))
      return oracle::infra_error_verdict("the manifests in " + dir, *why);
  try {
    return judge_target_manifests(c, manifests, rtol);
  } catch (const manifest::ManifestError& e) {  // the run as a whole (manifest/to_record.h)
    return oracle::infra_error_verdict("reading the manifests in " + dir, e.what());
  }
}

oracle::Verdict judge_saved_run_of(const casefile::Case& c, const std::string& dir, double rtol) {
  manifest::RunManifests manifests;
  try {
    manifests = manifest::load_run(dir, 1);
  } catch (const std::exception& e) {
    return oracle::infra_error_verdict("reading the manifests in " + dir, e.what());
  }
  const bool echoed = std::any_of(manifests.ranks.begin(), manifests.ranks.end(),
                                  [](const manifest::RankManifest& m) { return m.case_digest.has_value(); });
  if (echoed) {
    const std::string digest = logical_gradients(c).case_digest;
    for (const manifest::RankManifest& m : manifests.ranks) {
      const std::string rank = "rank " + std::to_string(m.rank) + "'s manifest";
      if (!m.case_digest)
        return oracle::infra_error_verdict(
            "the manifests in " + dir,
            rank + " echoes no case_digest where other ranks' do: they are not one run of this case");
      if (*m.case_digest != digest)
        return oracle::infra_error_verdict(
            "the manifests in " + dir, rank + " echoes case_digest " + *m.case_digest + ", not this case's " + digest +
                                           ": they answer another case (a worker's answer to a case it was not sent, "
                                           "saved with its infrastructure error), so they are no run of this one");
    }
  }
  try {
    return judge_target_manifests(c, manifests, rtol);
  } catch (const manifest::ManifestError& e) {
    return oracle::infra_error_verdict("reading the manifests in " + dir, e.what());
  }
}

std::function<oracle::Verdict(const casefile::Case&, const std::string&, const SentRequest&)> judge_as_a_run_of_the_case(
    double rtol) {
  return [rtol](const casefile::Case& c, const std::string& dir, const SentRequest& sent) {
    return judge_target_run(c, dir, rtol, &sent);
  };
}

oracle::Verdict judge_manifests(const std::string& dir, double rtol) {
  const record::RunRecord run = manifest::to_record(manifest::load_run(dir, 1));
  oracle::Bounds bounds;
  bounds.rtol = rtol;
  return oracle::judge(run, oracle::truth_from_box_statistics(run), bounds);
}

}  // namespace tally::run
