#include "cli/html_report.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "io/atomic_file.h"
#include "cli/usage_error.h"
#include "cli/verdict_report.h"
#include "topologies/logical_model.h"
#include "record/text.h"

namespace tally::cli {

namespace {

constexpr const char* kStyle = R"(
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #1b1b1b; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; }
pre { background: #f4f4f4; padding: .6em; overflow-x: auto; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
th { background: #eee; position: sticky; top: 0; }
td.name, th.name { text-align: left; font-family: monospace; white-space: nowrap; }
span.pass { color: #11651f; font-weight: bold; } span.fail { color: #b00020; font-weight: bold; }
td.ok { background: #f3fbf3; color: #8a8a8a; }
td.dropped { background: #ffd6d6; font-weight: bold; }
td.double { background: #ffe2b3; font-weight: bold; }
td.wrong { background: #ffd6d6; }
.rank { display: inline-block; border: 1px solid #aaa; border-radius: 4px; margin: 2px; padding: 2px 5px;
        font-family: monospace; font-size: 12px; background: #f3fbf3; }
.rank.dropped { background: #ffd6d6; border-color: #b00020; }
.rank.double { background: #ffe2b3; border-color: #b36b00; }
.rank.both { background: linear-gradient(90deg, #ffd6d6 50%, #ffe2b3 50%); border-color: #b00020; }
.stage { margin: .3em 0; } .note { color: #666; }
tr.fail { background: #fdd; } tr.known { background: #ffd; } tr.infra-error { background: #fcf; }
tr.refused { color: #777; } tr.model { outline: 2px solid #c60; } table.cases td { text-align: left; }
)";

std::string number(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

// How many times a rank counts a param, as a cell: "0", "2", "1.5".
std::string times(std::int64_t counted, std::int64_t numel) {
  if (numel <= 0) return std::to_string(counted);
  if (counted % numel == 0) return std::to_string(counted / numel);
  return number(static_cast<double>(counted) / static_cast<double>(numel));
}

// Whether a rank counts a miscounted param too few (dropped) or too many (double) times.
enum Status : unsigned { kDropped = 1, kDouble = 2 };
unsigned status_of(std::int64_t counted, std::int64_t expected) {
  return counted < expected ? kDropped : counted > expected ? kDouble : 0;
}

void verdict_table(std::ostringstream& out, const oracle::Verdict& v) {
  out << "<table><tr><th class=name>statistic</th><th>got</th><th>expected</th><th>error</th>"
         "<th>bound</th><th>rank shown</th><th class=name>result</th></tr>\n";
  for (const oracle::StatisticCheck& s : v.stats) {
    out << "<tr><td class=name>" << html_escape(s.name) << "</td><td>" << html_escape(record::all_digits(s.got))
        << "</td><td>" << html_escape(record::all_digits(s.expected)) << "</td><td>" << number(s.error)
        << "</td><td>" << (s.bound == 0.0 ? std::string("exact") : number(s.bound)) << "</td><td>" << s.rank
        << "</td><td class=name><span class=" << (s.ok ? "pass>ok" : "fail>FAIL") << "</span>"
        << (s.diagnosis.empty() ? "" : " " + html_escape(s.diagnosis)) << "</td></tr>\n";
  }
  out << "</table>\n<p>ranks agree: "
      << (v.ranks_agree ? "yes" : "<span class=fail>no</span>: " + html_escape(v.disagreement)) << "</p>\n";
  for (const oracle::ClippedMismatch& m : v.clipped)
    out << "<p>clipped: rank " << m.rank << ", " << html_escape(m.name) << " element " << m.element << ": got "
        << html_escape(record::all_digits(m.got)) << ", expected " << html_escape(record::all_digits(m.expected))
        << " (coefficient " << html_escape(record::all_digits(m.applied_coefficient)) << " applied, "
        << html_escape(record::all_digits(m.expected_coefficient)) << " expected)</p>\n";
  for (const oracle::GradientMismatch& m : v.gradients)
    out << "<p>" << (m.after_clip ? "clipped" : "held") << " gradient: " << html_escape(m.name) << ", "
        << html_escape(m.where) << ": " << m.statistic << " " << html_escape(record::all_digits(m.got))
        << ", expected [" << html_escape(record::all_digits(m.low)) << ", "
        << html_escape(record::all_digits(m.high)) << "] on ranks "
        << html_escape(record::rank_list_text(m.ranks, m.rank_count)) << "</p>\n";
}

// Per rank, whether it dropped or double-counted any param. A wrong rank whose total is right
// counts some elements twice and others never: both.
std::map<int, unsigned> rank_statuses(const oracle::Verdict& v) {
  std::map<int, unsigned> out;
  for (const oracle::Miscount& m : v.miscounted)
    for (std::size_t i = 0; i < m.wrong_ranks.size(); ++i) {
      const std::int64_t counted = i < m.wrong_counted.size() ? m.wrong_counted[i] : m.counted;
      const unsigned status = status_of(counted, m.expected);
      out[m.wrong_ranks[i]] |= status == 0 ? kDropped | kDouble : status;
    }
  return out;
}

void ledger_matrix(std::ostringstream& out, const HtmlReport& r) {
  const oracle::Verdict& v = *r.verdict;
  // Columns: the ranks any miscount names, then the lowest ranks, up to the cap.
  std::set<int> shown;
  for (const oracle::Miscount& m : v.miscounted)
    for (int rank : m.wrong_ranks)
      if (shown.size() < kHtmlMaxRankColumns) shown.insert(rank);
  for (int rank = 0; rank < r.world && shown.size() < kHtmlMaxRankColumns; ++rank) shown.insert(rank);
  // Rows: every miscounted param, then the others, up to the cap.
  std::map<int, const oracle::Miscount*> miscounted;
  for (const oracle::Miscount& m : v.miscounted) miscounted.emplace(m.param, &m);
  std::vector<int> rows;
  for (const auto& [param, m] : miscounted)
    if (rows.size() < kHtmlMaxParamRows) rows.push_back(param);
  for (int param = 0; param < static_cast<int>(r.params.size()) && rows.size() < kHtmlMaxParamRows; ++param)
    if (!miscounted.count(param)) rows.push_back(param);

  out << "<p class=note>Each cell: how many times that rank's norm (the first wrong ledger for a "
         "miscounted param) counts every element of the param; 1 is right. Red: dropped; orange: "
         "counted more than once; \"&ne;\" wrong on that rank, count not listed.";
  if (rows.size() < r.params.size())
    out << " Showing " << rows.size() << " of " << r.params.size() << " params (the miscounted first).";
  if (static_cast<int>(shown.size()) < r.world)
    out << " Showing " << shown.size() << " of " << r.world << " ranks (the wrong ones first).";
  out << "</p>\n<table><tr><th class=name>param</th><th class=name>class</th>";
  for (int rank : shown) out << "<th>" << rank << "</th>";
  out << "</tr>\n";
  for (int param : rows) {
    const auto found = miscounted.find(param);
    const oracle::Miscount* m = found == miscounted.end() ? nullptr : found->second;
    out << "<tr><td class=name>" << html_escape(m ? m->name : r.params[static_cast<std::size_t>(param)])
        << "</td><td class=name>" << html_escape(m ? m->param_class : r.classes[static_cast<std::size_t>(param)])
        << "</td>";
    for (int rank : shown) {
      if (!m) {
        out << "<td class=ok>1</td>";
        continue;
      }
      const auto at = std::find(m->wrong_ranks.begin(), m->wrong_ranks.end(), rank);
      if (at == m->wrong_ranks.end()) {
        const bool beyond_list = m->wrong_rank_count > static_cast<std::int64_t>(m->wrong_ranks.size());
        out << (beyond_list ? "<td class=wrong title=\"not listed\">?</td>" : "<td class=ok>1</td>");
        continue;
      }
      const std::size_t i = static_cast<std::size_t>(at - m->wrong_ranks.begin());
      if (i >= m->wrong_counted.size()) {
        out << "<td class=wrong>&ne;</td>";
        continue;
      }
      const std::int64_t counted = m->wrong_counted[i];
      const unsigned status = status_of(counted, m->expected);
      out << "<td class=" << (status == kDropped ? "dropped" : status == kDouble ? "double" : "wrong") << ">"
          << times(counted, m->numel ? m->numel : m->expected) << "</td>";
    }
    out << "</tr>\n";
  }
  out << "</table>\n";
}

std::string rank_box(int rank, unsigned status, const std::string& label) {
  const char* cls = status == (kDropped | kDouble) ? "rank both"
                    : status == kDropped           ? "rank dropped"
                    : status == kDouble            ? "rank double"
                                                   : "rank";
  std::string title = status == (kDropped | kDouble) ? "drops and double-counts"
                      : status == kDropped           ? "drops"
                      : status == kDouble            ? "double-counts"
                                                     : "counts right";
  return std::string("<span class=\"") + cls + "\" title=\"" + title + "\">r" + std::to_string(rank) +
         (label.empty() ? "" : " " + html_escape(label)) + "</span>";
}

void rank_grid(std::ostringstream& out, const HtmlReport& r) {
  const std::map<int, unsigned> statuses = rank_statuses(*r.verdict);
  auto status = [&](int rank) {
    const auto it = statuses.find(rank);
    return it == statuses.end() ? 0u : it->second;
  };
  constexpr int kMaxGridRanks = 1024;
  const int shown = std::min(r.world, kMaxGridRanks);
  if (r.world > kMaxGridRanks) {
    // The wrong ranks past the grid still show, each once (the verdict lists a capped number).
    out << "<p class=note>Showing the first " << kMaxGridRanks << " of " << r.world << " ranks";
    std::string beyond;
    for (const auto& [rank, rank_status] : statuses)
      if (rank >= shown) beyond += rank_box(rank, rank_status, "");
    out << (beyond.empty() ? ".</p>\n" : "; wrong ranks past them:</p>\n<div class=stage>" + beyond + "</div>\n");
  }
  if (!r.layout) {
    out << "<div class=stage>";
    for (int rank = 0; rank < shown; ++rank) out << rank_box(rank, status(rank), "");
    out << "</div>\n";
    return;
  }
  std::map<int, std::vector<int>> by_stage;
  for (int rank = 0; rank < shown; ++rank) by_stage[r.layout->coordinates(rank).pp].push_back(rank);
  for (const auto& [stage, ranks] : by_stage) {
    out << "<div class=stage><b>stage " << stage << "</b> ";
    for (int rank : ranks) {
      const topologies::Coordinates c = r.layout->coordinates(rank);
      const std::string label = "tp" + std::to_string(c.tp) + " cp" + std::to_string(c.cp) + " dp" +
                                std::to_string(c.dp) + " | etp" + std::to_string(c.etp) + " ep" +
                                std::to_string(c.ep) + " edp" + std::to_string(c.edp);
      out << rank_box(rank, status(rank), label);
    }
    out << "</div>\n";
  }
}

}  // namespace

std::string_view html_stylesheet() { return kStyle; }

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += ch;
    }
  }
  return out;
}

std::string html_report(const HtmlReport& r) {
  const oracle::Verdict& v = *r.verdict;
  const std::string verdict = std::string(oracle::kind_name(v.kind));
  std::ostringstream out;
  out << "<!DOCTYPE html>\n<html lang=en>\n<head>\n<meta charset=utf-8>\n<title>"
      << html_escape(r.title) << ": " << verdict << "</title>\n<style>" << kStyle << "</style>\n</head>\n<body>\n";
  out << "<h1>" << html_escape(r.title) << ": <span class=" << (v.kind == oracle::Verdict::Kind::pass ? "pass" : "fail")
      << ">" << verdict << "</span></h1>\n<pre>" << html_escape(r.summary) << "</pre>\n";
  if (v.kind == oracle::Verdict::Kind::infra_error) {
    out << "<h2>Infrastructure failure</h2>\n<p>" << html_escape(v.infra_call) << ": "
        << html_escape(v.infra_message) << "</p>\n";
  } else {
    out << "<h2>Verdict</h2>\n";
    verdict_table(out, v);
    out << "<h2>Ledger</h2>\n<p>" << v.miscounted_total << " logical param"
        << (v.miscounted_total == 1 ? "" : "s") << " miscounted.</p>\n";
    for (const oracle::Miscount& m : v.miscounted) {
      if (m.contributions.empty()) continue;
      out << "<details><summary>" << html_escape(m.name) << ": counted " << times(m.counted, m.numel ? m.numel : m.expected)
          << " times on rank " << m.observed_on << " (" << html_escape(m.stats_group) << ")</summary><ul>\n";
      for (const oracle::Contribution& k : m.contributions)
        out << "<li>rank " << k.rank << (k.shared_copy ? " (shared copy)" : "") << ": holds " << k.held
            << ", owns " << k.owned << ", counts " << k.counted << " &ndash; " << html_escape(k.rule) << "</li>\n";
      out << "</ul></details>\n";
    }
    ledger_matrix(out, r);
    out << "<h2>Ranks</h2>\n";
    rank_grid(out, r);
  }
  if (!r.commands.empty()) {
    out << "<h2>Replay</h2>\n<pre>";
    for (const std::string& command : r.commands) out << html_escape(command) << '\n';
    out << "</pre>\n";
  }
  out << "</body>\n</html>\n";
  return out.str();
}

void write_html_report(const std::string& file, const HtmlReport& report) {
  io::write_file_atomically(file, html_report(report), "HTML report");
}

void write_case_html(const std::string& file, const std::string& title, const casefile::Case& c,
                     const oracle::Verdict& verdict, const std::vector<std::string>& commands) {
  const topologies::RankLayout layout(c.topology);
  const topologies::LogicalModel model(c.model, c.topology);
  HtmlReport page;
  page.title = title;
  page.summary = (c.description.empty() ? "" : c.description + "\n") + case_summary(c);
  page.verdict = &verdict;
  for (const topologies::LogicalParam& p : model.params()) {
    page.params.push_back(p.name);
    page.classes.push_back(std::string(topologies::class_name(p.param_class)));
  }
  page.world = layout.world();
  page.layout = &layout;
  page.commands = commands;
  try {
    write_html_report(file, page);
  } catch (const std::runtime_error& error) {
    throw UsageError(error.what());
  }
}

}  // namespace tally::cli
