// JUnit XML reports (the dialect Jenkins, GitLab and GitHub test reporters read): one
// <testsuite> of <testcase>s, each passed, skipped (with why) or with a <failure>. Used by `tally replay --junit`
// and the fuzz campaign.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tally::fuzz {

struct JunitCase {
  std::string name;       // e.g. the case file
  std::string classname;  // e.g. the folder, or "tally.replay"
  double seconds = 0.0;
  std::string failure;    // empty: passed; else the failure message (first line is the summary)
  bool error = false;     // with a failure: an <error> (could not run) instead of a <failure>
  std::string skipped;    // without a failure: why it was not checked (a <skipped>); empty: it was
};

// The XML document: testsuite `suite` with tests, failures, errors, skipped and time counts. Text is
// escaped (& < > " '), control characters other than tab and newline, which XML 1.0 cannot
// carry, become U+FFFD, and invalid UTF-8 bytes become U+FFFD.
std::string junit_xml(std::string_view suite, const std::vector<JunitCase>& cases);

// Writes junit_xml atomically (a temporary file in the same folder, then renamed). Throws
// std::runtime_error naming the file on an I/O error.
void write_junit(const std::string& file, std::string_view suite,
                 const std::vector<JunitCase>& cases);

}  // namespace tally::fuzz
