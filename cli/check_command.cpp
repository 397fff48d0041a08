// tally check: the per-rank manifests of a real framework run (docs/manifest.md) judged with the
// same ledger, ground truth and diagnosis as `tally run`.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <ostream>
#include <sstream>
#include <tuple>

#include "cli/commands.h"
#include "cli/html_report.h"
#include "cli/number_flags.h"
#include "cli/path_flags.h"
#include "cli/usage_error.h"
#include "cli/verdict_report.h"
#include "fuzz/junit.h"
#include "manifest/manifest_json.h"
#include "manifest/to_record.h"
#include "oracle/ground_truth.h"
#include "oracle/judge.h"
#include "oracle/ledger.h"

namespace tally::cli {

namespace {

struct CheckCommandOptions {
  std::string dir;
  bool json = false;
  std::string junit;
  std::string html;
  double rtol = oracle::kFrameworkRtol;
  unsigned jobs = 0;  // 0: one per core
};

std::string optional_number(const std::optional<double>& value) {
  return value ? record::all_digits(*value) : "not reported";
}

// What tally check found: the run, its truth, and the verdict.
struct CheckReport {
  std::string producer;
  int world = 0;
  int version = manifest::kManifestVersion;  // of the files read
  manifest::ParallelSizes parallel;
  std::int64_t logical_params = 0;
  std::int64_t logical_elements = 0;
  std::vector<std::string> optimizers;  // "NAME: stats group [..]" of rank 0
  std::vector<std::string> params, classes;  // the logical params' names and kinds, by id
  oracle::GroundTruth truth;
  std::vector<record::Reported> reported;  // by rank
  oracle::Verdict verdict;
};

// Takes the manifests: they are freed once the record holds what the judge needs.
CheckReport check_run(manifest::RunManifests manifests, double rtol) {
  const record::RunRecord run = manifest::to_record(manifests);
  CheckReport r;
  r.producer = run.producer;
  r.world = run.world;
  r.version = manifests.version;
  r.parallel = manifests.ranks.front().parallel;
  manifests = {};
  r.logical_params = static_cast<std::int64_t>(run.tensors.size());
  for (const record::Tensor& t : run.tensors) {
    r.logical_elements += t.shape.numel();
    r.params.push_back(t.name);
    r.classes.push_back(t.kind);
  }
  const record::RankRecord& first = run.ranks.front();
  for (std::size_t c = 0; c < run.children.size(); ++c)
    r.optimizers.push_back(run.children[c] + ": stats group " +
                           record::rank_list_text(run.groups[static_cast<std::size_t>(first.children[c].stats_group)],
                                                  static_cast<std::int64_t>(run.groups[static_cast<std::size_t>(first.children[c].stats_group)].size())));
  for (const record::RankRecord& rank : run.ranks) r.reported.push_back(rank.reported);
  r.truth = oracle::truth_from_box_statistics(run);
  oracle::Bounds bounds;
  bounds.rtol = rtol;
  r.verdict = oracle::judge(run, r.truth, bounds);
  return r;
}

// What the run was: its files, producer, sizes, model and optimizers.
std::string report_header(const std::string& dir, const CheckReport& r) {
  std::ostringstream out;
  const manifest::ParallelSizes& p = r.parallel;
  out << "manifests: " << r.world << " rank" << (r.world == 1 ? "" : "s") << " in " << dir << " (version "
      << r.version << ")";
  if (!r.producer.empty()) out << ", written by " << r.producer;
  out << "\nworld " << r.world << " (dense tp " << p.tp << ", cp " << p.cp << ", pp " << p.pp
      << ", dp " << p.dp << "; expert etp " << p.etp << ", ep " << p.ep << ", edp "
      << r.world / (p.etp * p.ep * p.pp) << ")\nlogical model: " << r.logical_params
      << " params, " << r.logical_elements << " elements\noptimizers:\n";
  for (const std::string& o : r.optimizers) out << "  " << o << '\n';
  return out.str();
}

void print_report(std::ostream& out, const std::string& dir, const CheckReport& r) {
  out << report_header(dir, r) << '\n';
  print_verdict_body(out, r.verdict);
  out << "\nreported by rank (truth: norm " << record::all_digits(r.truth.main.norm) << ", zeros "
      << r.truth.zeros << "):\n";
  // Ranks that reported the same values and whose ledgers imply the same, on one line.
  using Values = std::tuple<std::optional<double>, double, std::optional<std::int64_t>, std::int64_t,
                            std::optional<double>>;
  std::vector<std::pair<Values, std::vector<int>>> lines;
  for (const oracle::Verdict::Implied& v : r.verdict.implied) {
    const record::Reported& reported = r.reported[static_cast<std::size_t>(v.rank)];
    const Values values{reported.norm, v.norm, reported.zeros, v.zeros, reported.inf_norm};
    auto it = std::find_if(lines.begin(), lines.end(), [&](const auto& l) { return l.first == values; });
    if (it == lines.end()) lines.push_back({values, {v.rank}});
    else it->second.push_back(v.rank);
  }
  for (const auto& [values, ranks] : lines) {
    const auto& [norm, implied_norm, zeros, implied_zeros, inf_norm] = values;
    out << "  " << (ranks.size() == 1 ? "rank " + std::to_string(ranks.front()) : "ranks " + record::rank_list_text(ranks, static_cast<std::int64_t>(ranks.size())))
        << ": norm " << optional_number(norm) << " (ledger implies " << record::all_digits(implied_norm)
        << "), zeros " << (zeros ? std::to_string(*zeros) : "not reported") << " (ledger implies "
        << implied_zeros << ")";
    if (inf_norm) out << ", inf norm " << record::all_digits(*inf_norm);
    out << '\n';
  }
}

nlohmann::ordered_json report_json(const std::string& dir, const CheckReport& r) {
  nlohmann::ordered_json j = verdict_json(r.verdict);
  j["dir"] = dir;
  j["producer"] = r.producer;
  j["world"] = r.world;
  j["manifest_version"] = r.version;
  j["parallel"] = {{"tp", r.parallel.tp}, {"cp", r.parallel.cp}, {"pp", r.parallel.pp},
                   {"dp", r.parallel.dp}, {"ep", r.parallel.ep}, {"etp", r.parallel.etp}};
  j["logical_params"] = r.logical_params;
  j["logical_elements"] = r.logical_elements;
  j["truth"] = {{"norm", r.truth.main.norm}, {"inf_norm", r.truth.main.abs_max}, {"zeros", r.truth.zeros}};
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (const oracle::Verdict::Implied& v : r.verdict.implied) {
    const record::Reported& reported = r.reported[static_cast<std::size_t>(v.rank)];
    auto value = [](const auto& x) { return x ? nlohmann::ordered_json(*x) : nlohmann::ordered_json(nullptr); };
    ranks.push_back({{"rank", v.rank},
                     {"norm", value(reported.norm)},
                     {"inf_norm", value(reported.inf_norm)},
                     {"zeros", value(reported.zeros)},
                     {"implied_norm", v.norm},
                     {"implied_zeros", v.zeros}});
  }
  j["ranks"] = std::move(ranks);
  return j;
}

// The first line of the failure: the failing statistics and miscounted params.
std::string failure_summary(const oracle::Verdict& v) {
  std::string text;
  for (const oracle::StatisticCheck& s : v.stats)
    if (!s.ok) text += (text.empty() ? "" : ", ") + s.name + " " + record::all_digits(s.got) + " (expected " + record::all_digits(s.expected) + ")";
  if (!v.ranks_agree) text += (text.empty() ? "" : ", ") + std::string("ranks disagree: ") + v.disagreement;
  if (v.miscounted_total > 0)
    text += (text.empty() ? "" : ", ") + std::to_string(v.miscounted_total) + " logical params miscounted";
  for (const oracle::Miscount& m : v.miscounted) text += "\n" + m.name;
  return text;
}

}  // namespace

void add_check_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<CheckCommandOptions>();
  CLI::App* command = app.add_subcommand(
      "check",
      "Check the per-rank manifests a real framework run wrote (rank-<R>.json, and groups.json in "
      "format version 2; version 1 folders still read; docs/manifest.md; "
      "tally_adapters.megatron writes them for Megatron-core): rebuild the logical model from the "
      "slices, compute the truth (each logical element once), the ledger the framework's own "
      "kept flags and stats groups imply, and print the verdict and diagnosis as `tally run` "
      "does. Exit 0 pass, 1 fail, 2 bad or inconsistent manifests.");
  command->add_option("dir", options->dir, "The folder of the run's manifests")->required();
  command->add_flag("--json", options->json, "Machine-readable verdict, truth and per-rank values");
  command->add_option("--html", options->html,
                      "Also write the verdict as a self-contained HTML page to this file: the "
                      "ledger as a matrix of params against ranks, the ranks that dropped or "
                      "double-counted")
      ->check(output_file());
  command->add_option("--junit", options->junit, "Also write a JUnit XML report to this file")
      ->check(output_file());
  command->add_option("--rtol", options->rtol,
                      "Relative tolerance of reported values against the truth and against "
                      "each rank's own ledger (frameworks reduce in fp32; the ledger itself is "
                      "exact)")
      ->check(real_number(0.0, 1.0))
      ->capture_default_str();
  command->add_option("--jobs", options->jobs,
                      "Threads that read and parse the rank files (0: one per core)")
      ->check(whole_number(0, 1024))
      ->capture_default_str();
  command->callback([options, &context] {
    const auto start = std::chrono::steady_clock::now();
    CheckReport report;
    manifest::RunManifests run;
    try {
      run = manifest::load_run(options->dir, options->jobs);  // its messages name each file with its folder
    } catch (const manifest::ManifestError& error) {
      throw UsageError(error.what());
    }
    const std::string folder = std::filesystem::path(options->dir).string();
    try {
      report = check_run(std::move(run), options->rtol);
    } catch (const manifest::ManifestError& error) {
      // to_record names a rank's file ("rank-3.json: ...") or the run as a whole.
      const std::string what = error.what();
      throw UsageError(what.rfind("rank-", 0) == 0 ? (std::filesystem::path(folder) / what).string()
                                                 : folder + ": " + what);
    } catch (const oracle::RecordTooLarge& error) {
      throw UsageError(folder + ": " + error.what());
    } catch (const oracle::TruthUnknown& error) {
      throw UsageError(folder + ": " + error.what());
    }
    if (options->json)
      context.out << report_json(options->dir, report).dump(2) << '\n';
    else
      print_report(context.out, options->dir, report);
    if (!options->html.empty()) {
      HtmlReport page;
      page.title = "tally check " + options->dir;
      page.summary = report_header(options->dir, report);
      page.verdict = &report.verdict;
      page.params = report.params;
      page.classes = report.classes;
      page.world = report.world;
      page.commands = {"tally check " + shell_quote(options->dir)};
      // Checked writable before the check; should writing still fail, the verdict stands.
      try {
        write_html_report(options->html, page);
      } catch (const std::runtime_error& error) {
        context.err << "tally: error: " << error.what() << " (the verdict stands)\n";
      }
    }
    const bool passed = report.verdict.kind == oracle::Verdict::Kind::pass;
    if (!options->junit.empty()) {
      fuzz::JunitCase c;
      c.name = options->dir;
      c.classname = "tally.check";
      c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!passed) c.failure = failure_summary(report.verdict);
      try {
        fuzz::write_junit(options->junit, "tally.check", {c});
      } catch (const std::runtime_error& error) {
        throw UsageError(error.what());
      }
    }
    context.exit_code = passed ? kExitPass : kExitFail;
  });
}

}  // namespace tally::cli
