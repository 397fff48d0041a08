#include "cli/verdict_report.h"

#include <cstdio>
#include <iomanip>
#include <sstream>

#include "vocab/faults.h"
#include "vocab/gradients.h"
#include "kernels/gradient_generator.h"

namespace tally::cli {

namespace {

std::string short_number(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.3g", value);
  return text;
}

std::string classes_text(std::uint32_t mask) {
  if (mask == ~std::uint32_t{0}) return "";
  std::string out;
  for (topologies::ParamClass c : topologies::kAllParamClasses)
    if (mask & vocab::class_bit(c)) out += (out.empty() ? "" : ",") + std::string(topologies::class_name(c));
  return " (" + (out.empty() ? std::string("no class") : out) + " only)";
}

// "counted 0 times", "counted 2 times", "counted 1.5 times (12 of 8 elements)".
std::string times_text(std::int64_t counted, std::int64_t expected) {
  if (expected == 0)  // a param outside the norm's group
    return "counted " + std::to_string(counted) + " element counts where none belong";
  if (expected > 0 && counted % expected == 0)
    return "counted " + std::to_string(counted / expected) + (counted / expected == 1 ? " time" : " times");
  return "counted " + short_number(static_cast<double>(counted) / static_cast<double>(expected)) +
         " times (" + std::to_string(counted) + " element counts for " + std::to_string(expected) +
         " elements)";
}

// " (stated: p0 = 0.1, expert-row-bias x 3)" or "".
std::string stated_text(const casefile::Case& c) {
  const std::string stated = vocab::describe_stated(c.path.gradients, c.model);
  return stated.empty() ? "" : " (stated: " + stated + ")";
}

}  // namespace

std::string case_summary(const casefile::Case& c) {
  const topologies::ParallelConfig& t = c.topology;
  std::ostringstream out;
  const bool gtp = topologies::uses_gtp(t);
  out << "world " << t.world << " (dense tp " << t.tp << ", cp " << t.cp << ", pp " << t.pp
      << ", dp " << topologies::dp(t);
  if (gtp) out << ", gtp " << t.gtp;
  out << "; expert etp " << t.etp << ", ep " << t.ep << ", edp " << topologies::edp(t);
  if (gtp) out << ", egtp " << t.egtp;
  out << "; order " << t.order;
  if (t.vpp != 1) out << ", vpp " << t.vpp;
  if (t.dist_opt_instances != 1) out << ", " << t.dist_opt_instances << " dist-opt instances";
  out << ")\nmodel: " << topologies::describe(c.model) << "\noptimizer "
      << vocab::optimizer_model_name(c.path.optimizer)
      << (c.path.layer_wise_param_layout ? " (megatron-core 0.19's parameter layout: chained with a DistributedOptimizer)" : "")
      << ", gradients "
      << kernels::mode_name(c.path.gradients.generator.mode) << " "
      << kernels::dtype_name(c.path.gradients.generator.dtype) << " seed "
      << c.path.gradients.generator.seed << classes_text(c.path.gradients.class_mask)
      << stated_text(c)
      << ", accumulation " << kernels::accumulation_name(c.path.accumulation);
  if (c.path.max_norm > 0) out << ", max_norm " << record::all_digits(c.path.max_norm);
  if (c.path.optimizer == vocab::OptimizerModel::distributed && c.path.bucket_elements > 0)
    out << ", buckets of " << c.path.bucket_elements;
  out << "\nfaults: " << vocab::fault_list(c.path.faults);
  return out.str();
}

void print_verdict(std::ostream& out, const casefile::Case& c, const oracle::Verdict& verdict,
                   const std::string& replay_command) {
  if (!c.description.empty()) out << c.description << '\n';
  out << case_summary(c) << "\n\n";
  if (verdict.kind == oracle::Verdict::Kind::infra_error) {
    out << "infrastructure failure: " << verdict.infra_message << "\n\nverdict: INFRA-ERROR\n";
    if (!replay_command.empty()) out << "replay: " << replay_command << '\n';
    return;
  }
  print_verdict_body(out, verdict);
  if (verdict.kind != oracle::Verdict::Kind::pass && !replay_command.empty())
    out << "replay: " << replay_command << '\n';
}

void print_verdict_body(std::ostream& out, const oracle::Verdict& verdict) {
  out << std::left << std::setw(14) << "stat" << std::setw(25) << "got" << std::setw(25)
      << "expected" << std::setw(11) << "error" << std::setw(11) << "bound"
      << "result\n";
  for (const oracle::StatisticCheck& s : verdict.stats) {
    const std::string bound = s.bound == 0.0 ? "exact" : short_number(s.bound);
    std::string result = s.ok ? "ok" : "FAIL";
    if (s.bound > 0.0) result += " (error/bound " + short_number(s.error / s.bound) + ")";
    if (!s.ok) result += " on rank " + std::to_string(s.rank);
    out << std::setw(14) << s.name << std::setw(25) << record::all_digits(s.got) << std::setw(25)
        << record::all_digits(s.expected) << std::setw(11) << short_number(s.error) << std::setw(11) << bound
        << result << '\n';
  }
  for (const oracle::StatisticCheck& s : verdict.stats)
    if (!s.diagnosis.empty()) out << std::right << "  " << s.name << ": " << s.diagnosis << '\n';
  out << std::right << "\nranks agree: "
      << (verdict.ranks_agree ? "yes" : "NO: " + verdict.disagreement) << '\n';
  if (verdict.miscounted_total == 0) {
    out << "ledger: every logical element counted exactly once on every rank\n";
  } else {
    out << "ledger: " << verdict.miscounted_total << " logical param"
        << (verdict.miscounted_total == 1 ? "" : "s") << " miscounted\n";
    std::size_t diagnosed = 0;
    for (const oracle::Miscount& m : verdict.miscounted) {
      if (m.contributions.empty() && m.stats_group.empty()) continue;
      ++diagnosed;
      out << "  " << m.name << " (" << m.param_class << ", " << (m.numel ? m.numel : m.expected)
          << " elements): "
          << times_text(m.counted, m.expected) << " in rank " << m.observed_on << "'s "
          << m.stats_group << "; wrong on ranks " << record::rank_list_text(m.wrong_ranks, m.wrong_rank_count)
          << '\n';
      for (const oracle::Contribution& k : m.contributions) {
        out << "    rank " << k.rank << (k.shared_copy ? " (shared copy)" : "") << ": holds "
            << k.held << ", owns " << k.owned << ", counts " << k.counted << " - " << k.rule
            << '\n';
      }
    }
    if (diagnosed < verdict.miscounted.size())
      out << "  ... and " << verdict.miscounted.size() - diagnosed << " more (--json lists them all)\n";
  }
  for (const oracle::ClippedMismatch& m : verdict.clipped)
    out << "clipped: rank " << m.rank << ", " << m.name << " element " << m.element << ": got "
        << record::all_digits(m.got) << ", expected " << record::all_digits(m.expected) << " (coefficient "
        << record::all_digits(m.applied_coefficient) << " applied, " << record::all_digits(m.expected_coefficient)
        << " expected)\n";
  if (verdict.gradient_mismatches > 0) {
    out << "gradients: " << verdict.gradient_mismatches << " statistic"
        << (verdict.gradient_mismatches == 1 ? " the run recorded is" : "s the run recorded are")
        << " not those of the gradients tally gave it\n";
    for (const oracle::GradientMismatch& m : verdict.gradients)
      out << "  " << (m.after_clip ? "clipped " : "") << m.name << ", " << m.where << ", ranks "
          << record::rank_list_text(m.ranks, m.rank_count) << ": " << m.statistic << " "
          << record::all_digits(m.got) << ", expected "
          << (m.low == m.high ? record::all_digits(m.low)
                              : "[" + record::all_digits(m.low) + ", " + record::all_digits(m.high) + "]")
          << '\n';
    if (verdict.gradient_mismatches > static_cast<std::int64_t>(verdict.gradients.size()))
      out << "  ... and " << verdict.gradient_mismatches - static_cast<std::int64_t>(verdict.gradients.size())
          << " more\n";
  }
  out << "\nverdict: " << (verdict.kind == oracle::Verdict::Kind::pass ? "PASS" : "FAIL") << '\n';
}

nlohmann::ordered_json verdict_json(const oracle::Verdict& verdict) {
  nlohmann::ordered_json j;
  j["verdict"] = oracle::kind_name(verdict.kind);
  if (verdict.kind == oracle::Verdict::Kind::infra_error) {
    j["infra_error"] = {{"call", verdict.infra_call}, {"message", verdict.infra_message}};
    return j;
  }
  nlohmann::ordered_json& stats = j["stats"];
  stats = nlohmann::ordered_json::object();
  for (const oracle::StatisticCheck& s : verdict.stats) {
    stats[s.name] = {{"got", s.got},     {"expected", s.expected}, {"error", s.error},
                     {"bound", s.bound}, {"ok", s.ok},             {"rank", s.rank}};
    if (!s.diagnosis.empty()) stats[s.name]["diagnosis"] = s.diagnosis;
  }
  nlohmann::ordered_json miscounted = nlohmann::ordered_json::array();
  for (const oracle::Miscount& m : verdict.miscounted) {
    nlohmann::ordered_json entry = {{"param", m.name},       {"class", m.param_class},
                                    {"counted", m.counted},  {"expected", m.expected},
                                    {"ranks", m.wrong_ranks}, {"observed_on", m.observed_on}};
    if (!m.stats_group.empty()) {
      entry["stats_group"] = m.stats_group;
      nlohmann::ordered_json contributions = nlohmann::ordered_json::array();
      for (const oracle::Contribution& k : m.contributions)
        contributions.push_back({{"rank", k.rank},       {"held", k.held},
                                 {"owned", k.owned},     {"counted", k.counted},
                                 {"rule", k.rule},       {"shared_copy", k.shared_copy}});
      entry["contributions"] = std::move(contributions);
    }
    miscounted.push_back(std::move(entry));
  }
  j["miscounted"] = std::move(miscounted);
  j["ranks_agree"] = verdict.ranks_agree;
  if (!verdict.ranks_agree) j["disagreement"] = verdict.disagreement;
  nlohmann::ordered_json clipped = nlohmann::ordered_json::array();
  for (const oracle::ClippedMismatch& m : verdict.clipped)
    clipped.push_back({{"rank", m.rank}, {"param", m.name}, {"element", m.element},
                       {"got", m.got}, {"expected", m.expected},
                       {"applied_coefficient", m.applied_coefficient},
                       {"expected_coefficient", m.expected_coefficient}});
  j["clipped"] = std::move(clipped);
  if (verdict.gradient_mismatches > 0) {
    nlohmann::ordered_json gradients = nlohmann::ordered_json::array();
    for (const oracle::GradientMismatch& m : verdict.gradients)
      gradients.push_back({{"param", m.name},
                           {"where", m.where},
                           {"after_clip", m.after_clip},
                           {"statistic", m.statistic},
                           {"got", m.got},
                           {"low", m.low},
                           {"high", m.high},
                           {"ranks", m.ranks},
                           {"rank_count", m.rank_count}});
    j["gradients"] = std::move(gradients);
    j["gradient_mismatches"] = verdict.gradient_mismatches;
  }
  return j;
}

}  // namespace tally::cli
