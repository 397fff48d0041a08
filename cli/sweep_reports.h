// What `tally sweep` tells, as observers of the sweep (fuzz/sweep_driver.h): the console (progress,
// each new failure, infrastructure error, refusal by the framework and disagreement with tally's
// model as it comes, then the summary, or the JSON report), and the report files (JUnit, the HTML
// index with a page per failure). A merged sweep is told by the same summary and files.
#pragma once

#include <ostream>
#include <string>

#include "fuzz/sweep.h"
#include "fuzz/sweep_driver.h"

namespace tally::cli {

// The summary of a sweep's report (`seconds` 0: not said).
void print_sweep_summary(std::ostream& out, const fuzz::SweepReport& report, double seconds);

// The console. `json`: nothing as it goes, the report as one JSON line at the end.
class SweepPrinter final : public fuzz::SweepObserver {
 public:
  SweepPrinter(std::ostream& out, bool terminal, bool json, std::string state_file)
      : out_(out), terminal_(terminal), json_(json), state_file_(std::move(state_file)) {}
  void case_done(const fuzz::SweepCase& sc, const fuzz::SweepResult& r, const fuzz::SweepProgress& progress) override;
  void machinery_stops(const std::string& why, std::size_t lane, std::size_t lanes) override;
  void finished(const fuzz::SweepEnd& end) override;

 private:
  void end_live_line();
  std::ostream& out_;
  bool terminal_, json_;
  std::string state_file_;
  bool live_ = false;
  double last_progress_ = -10.0;
};

// The JUnit file and the HTML folder (each "" for none), written at the end and, for a failure's
// page, as it is saved.
class SweepReportFiles final : public fuzz::SweepObserver {
 public:
  SweepReportFiles(std::string junit, std::string html) : junit_(std::move(junit)), html_(std::move(html)) {}
  void failure_saved(const fuzz::SweepCase& sc, const casefile::Case& saved, const oracle::Verdict& verdict,
                     const std::string& case_file) override;
  void finished(const fuzz::SweepEnd& end) override { write(end.report); }
  void write(const fuzz::SweepReport& report) const;
  // What the console's last lines say of them.
  void print_where(std::ostream& out) const;

 private:
  std::string junit_, html_;
};

}  // namespace tally::cli
