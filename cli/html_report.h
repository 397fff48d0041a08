// A failing run as one self-contained HTML page (inline CSS, no script, nothing fetched at view
// time), for nightly jobs to keep next to JUnit: the verdict table; the ledger as a matrix of
// logical params against ranks, each cell how many times that rank's norm counts the param, the
// wrong cells marked; the rank grid of the topology with the ranks that dropped or
// double-counted highlighted; and the commands that replay it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "casefile/case.h"
#include "oracle/verdict.h"
#include "topologies/rank_layout.h"

namespace tally::cli {

struct HtmlReport {
  std::string title;    // "tally run", "tally check runs/step-100"
  std::string summary;  // the case or run, as the text report heads it (several lines)
  const oracle::Verdict* verdict = nullptr;
  std::vector<std::string> params;  // logical param names, by id
  std::vector<std::string> classes;  // their classes, by id
  int world = 0;
  // The topology, for the rank grid by pipeline stage with each rank's coordinates; absent
  // (tally check) the grid lists the ranks alone.
  const topologies::RankLayout* layout = nullptr;
  std::vector<std::string> commands;  // how to replay it, one shell command each
};

// Caps that keep a page for a world of 10^6 ranks readable and small.
inline constexpr std::size_t kHtmlMaxParamRows = 300;
inline constexpr std::size_t kHtmlMaxRankColumns = 64;

std::string html_report(const HtmlReport& report);

// Writes the page atomically; throws std::runtime_error naming the file.
void write_html_report(const std::string& file, const HtmlReport& report);

// The page of one case run by tally run or tally replay (its model's params, its topology's
// grid); throws UsageError naming the file when it cannot be written.
void write_case_html(const std::string& file, const std::string& title, const casefile::Case& c,
                     const oracle::Verdict& verdict, const std::vector<std::string>& commands);

// The one stylesheet of every page tally writes: a case's page and a sweep's index.
std::string_view html_stylesheet();

// `text` with & < > " ' escaped for HTML text and attribute values.
std::string html_escape(std::string_view text);

}  // namespace tally::cli
