#include "cli/sweep_reports.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>
#include <vector>

#include "cli/campaign_output.h"
#include "cli/html_report.h"
#include "cli/target_flags.h"
#include "fuzz/junit.h"
#include "io/atomic_file.h"

namespace tally::cli {

namespace {

namespace fs = std::filesystem;
using fuzz::SweepResult;

std::string minutes_text(double seconds) {
  const long s = static_cast<long>(seconds + 0.5);
  return s >= 60 ? std::to_string(s / 60) + "m" + (s % 60 < 10 ? "0" : "") + std::to_string(s % 60) + "s"
                 : std::to_string(s) + "s";
}

// Each reason with its count, most first, at most eight lines.
void print_reasons(std::ostream& out, const std::map<std::string, std::int64_t>& by_reason, const std::string& head) {
  std::vector<std::pair<std::int64_t, std::string>> reasons;
  for (const auto& [reason, n] : by_reason) reasons.emplace_back(n, reason);
  std::sort(reasons.rbegin(), reasons.rend());
  for (std::size_t i = 0; i < reasons.size() && i < 8; ++i)
    out << "  " << head << " " << reasons[i].first << "x: " << reasons[i].second << '\n';
  if (reasons.size() > 8) out << "  " << head << " for " << reasons.size() - 8 << " more reasons (the JSON report lists each)\n";
}

bool is_news(const SweepResult& r) {
  return (r.outcome == SweepResult::Outcome::fail && r.known.empty()) || r.outcome == SweepResult::Outcome::infra_error;
}

std::vector<fuzz::JunitCase> junit_cases(const fuzz::SweepReport& report) {
  std::vector<fuzz::JunitCase> out;
  for (const SweepResult& r : report.results) {
    fuzz::JunitCase j;
    j.name = r.id;
    j.classname = "tally.sweep." + report.target + ".world" + std::to_string(report.world);
    j.seconds = r.seconds;
    switch (r.outcome) {
      case SweepResult::Outcome::pass: break;
      case SweepResult::Outcome::refused:
        j.skipped = (r.by_framework ? "refused by the framework: " : "refused: ") + r.detail;
        break;
      case SweepResult::Outcome::fail:
        if (!r.known.empty()) {
          j.name += " (known finding " + r.known + ")";
          break;
        }
        j.failure = r.detail + (r.case_file.empty() ? "" : "\nreplay: tally replay " + r.case_file);
        break;
      case SweepResult::Outcome::infra_error:
        j.failure = r.detail;
        j.error = true;
        break;
    }
    out.push_back(std::move(j));
  }
  return out;
}

// index.html: the sweep's summary and every case's outcome, each failure linked to its page.
void write_html_index(const std::string& dir, const fuzz::SweepReport& report) {
  std::ostringstream summary;
  print_sweep_summary(summary, report, 0.0);
  const std::string title = "tally sweep: world " + std::to_string(report.world) + ", " + report.target + " " + report.version;
  std::ostringstream page;
  page << "<!doctype html><html><head><meta charset=\"utf-8\"><title>" << html_escape(title) << "</title><style>"
       << html_stylesheet() << "</style></head><body><h1>" << html_escape(title) << "</h1><pre>" << html_escape(summary.str())
       << "</pre><table class=\"cases\"><tr><th>case</th><th>outcome</th><th>detail</th><th>s</th></tr>";
  for (const SweepResult& r : report.results) {
    const std::string css =
        r.outcome == SweepResult::Outcome::fail && !r.known.empty() ? "known" : std::string(fuzz::sweep_outcome_name(r.outcome));
    const bool has_page = fs::exists(fs::path(dir) / (r.id + ".html"));
    std::string detail = r.known.empty() ? r.detail : r.detail + " (known: " + r.known + ")";
    if (!r.model_disagrees.empty()) detail += (detail.empty() ? "" : "; ") + std::string("model disagrees: ") + r.model_disagrees;
    page << "<tr class=\"" << css << (r.model_disagrees.empty() ? "" : " model") << "\"><td>"
         << (has_page ? "<a href=\"" + html_escape(r.id) + ".html\">" + html_escape(r.id) + "</a>" : html_escape(r.id))
         << "</td><td>" << html_escape(css) << "</td><td>" << html_escape(detail) << "</td><td>"
         << static_cast<long>(r.seconds * 100 + 0.5) / 100.0 << "</td></tr>";
  }
  page << "</table></body></html>\n";
  io::write_file_atomically((fs::path(dir) / "index.html").string(), page.str(), "HTML index");
}

}  // namespace

void print_sweep_summary(std::ostream& out, const fuzz::SweepReport& report, double seconds) {
  const fuzz::SweepCounts c = fuzz::count_sweep(report.results);
  out << "summary: world " << report.world << ", " << report.target << " " << report.version << ": "
      << report.configurations << " configurations, " << report.layouts << " layouts, " << report.results.size() << " cases";
  if (report.shards > 1) out << " (shard " << report.shard << "/" << report.shards << " of " << report.total_cases << ")";
  if (seconds > 0) out << " in " << minutes_text(seconds);
  out << "\n  passed " << c.pass << ", failed " << c.fail_new + c.fail_known << " (new " << c.fail_new << ", known "
      << c.fail_known << "), refused " << c.refused << ", infrastructure errors " << c.infra << '\n';
  if (c.refused_by_framework > 0)
    out << "  refused by tally's rules " << c.refused - c.refused_by_framework << ", by the framework itself "
        << c.refused_by_framework << '\n';
  for (const auto& [name, n] : c.known_by_name) out << "  known " << name << ": " << n << '\n';
  // The framework's own refusals first: each hides what its cases would show until a rule says it.
  print_reasons(out, c.framework_refused_by_reason, "refused by the framework");
  print_reasons(out, c.refused_by_reason, "refused");
  if (const std::optional<std::string> why = fuzz::nothing_checked(c.refused_by_framework, c.sent())) out << "  " << *why << '\n';
  for (const SweepResult& r : report.results)
    if (is_news(r))
      out << "  " << (r.outcome == SweepResult::Outcome::fail ? "NEW " : "INFRA ") << r.id << ": " << r.detail
          << (r.case_file.empty() ? "" : "; tally replay " + shell_quote(r.case_file)) << '\n';
  if (c.model_checked == 0) return;
  out << "  tally's model of " << report.target << " " << report.version << " (gradnorm/releases.h): held against "
      << c.model_checked << " cases, "
      << (c.model_disagrees == 0 ? "agrees on every one" : "disagrees on " + std::to_string(c.model_disagrees)) << '\n';
  int listed = 0;
  for (const SweepResult& r : report.results)
    if (!r.model_disagrees.empty() && listed++ < 20) out << "  MODEL " << r.id << ": " << r.model_disagrees << '\n';
  if (listed > 20) out << "  and " << listed - 20 << " more disagreements (the JSON report lists each)\n";
}

void SweepPrinter::end_live_line() {
  if (live_) out_ << '\n';
  live_ = false;
}

void SweepPrinter::case_done(const fuzz::SweepCase& sc, const SweepResult& r, const fuzz::SweepProgress& progress) {
  if (json_) return;
  // New failures, infrastructure errors and the framework's refusals as they come; known ones in
  // the summary.
  if (is_news(r) || r.by_framework) {
    end_live_line();
    out_ << (r.outcome == SweepResult::Outcome::infra_error ? "INFRA " : r.by_framework ? "REFUSED " : "NEW   ") << sc.id
         << ": " << r.detail << '\n' << std::flush;
  }
  if (!r.model_disagrees.empty()) {
    end_live_line();
    out_ << "MODEL " << sc.id << ": " << r.model_disagrees << '\n' << std::flush;
  }
  if (progress.seconds - last_progress_ < (terminal_ ? 0.2 : 10.0)) return;
  last_progress_ = progress.seconds;
  const double eta = progress.seconds / static_cast<double>(progress.ran) * static_cast<double>(progress.to_run - progress.ran);
  const std::string line = "case " + std::to_string(progress.done) + "/" + std::to_string(progress.planned) + " (" + sc.id +
                           ")  elapsed " + minutes_text(progress.seconds) + "  " +
                           std::to_string(static_cast<long>(60.0 * static_cast<double>(progress.ran) /
                                                            std::max(progress.seconds, 1e-9))) +
                           "/min  ETA " + minutes_text(eta);
  if (terminal_) {
    out_ << '\r' << line << "   " << std::flush;
    live_ = true;
  } else {
    out_ << "progress: " << line << '\n' << std::flush;
  }
}

void SweepPrinter::machinery_stops(const std::string& why, std::size_t lane, std::size_t lanes) {
  if (json_) return;
  end_live_line();
  out_ << "\n" << why << (lanes > 1 ? " (lane " + std::to_string(lane) + ")" : std::string())
       << ": the sweep stops (it resumes from " << state_file_ << ")\n";
}

void SweepPrinter::finished(const fuzz::SweepEnd& end) {
  end_live_line();
  if (end.error) return;  // the command says what stopped it
  if (json_) {
    out_ << fuzz::sweep_report_json(end.report).dump() << '\n';
    return;
  }
  print_sweep_summary(out_, end.report, end.seconds);
  if (end.stopped) out_ << "  stopped before the end: " << end.not_run << " cases not run (run again to resume)\n";
}

void SweepReportFiles::failure_saved(const fuzz::SweepCase& sc, const casefile::Case& saved, const oracle::Verdict& verdict,
                                     const std::string& case_file) {
  if (html_.empty()) return;
  write_case_html((fs::path(html_) / (sc.id + ".html")).string(), "tally sweep: " + sc.id, saved, verdict,
                  case_file.empty() ? std::vector<std::string>{} : std::vector<std::string>{"tally replay " + shell_quote(case_file)});
}

void SweepReportFiles::write(const fuzz::SweepReport& report) const {
  if (!junit_.empty()) fuzz::write_junit(junit_, "tally sweep", junit_cases(report));
  if (!html_.empty()) write_html_index(html_, report);
}

void SweepReportFiles::print_where(std::ostream& out) const {
  if (!junit_.empty()) out << "junit: " << junit_ << '\n';
  if (!html_.empty()) out << "html: " << (fs::path(html_) / "index.html").string() << '\n';
}

}  // namespace tally::cli
