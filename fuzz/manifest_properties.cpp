#include "fuzz/manifest_properties.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <map>
#include <set>
#include <typeinfo>

#include "manifest/manifest_json.h"
#include "manifest/statistics.h"
#include "manifest/to_record.h"
#include "oracle/ground_truth.h"
#include "oracle/judge.h"
#include "oracle/ledger.h"

namespace tally::fuzz {

namespace {

constexpr std::string_view kHeader = "=== ";

// Every bit of a double, so that two verdicts compare exactly (NaN included).
std::string bits(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%a", x);
  return text;
}

// A verdict as text: equal texts, equal verdicts.
std::string verdict_text(const oracle::Verdict& v) {
  std::string out = std::string(oracle::kind_name(v.kind)) + "\n";
  for (const oracle::StatisticCheck& s : v.stats)
    out += s.name + " " + bits(s.got) + " " + bits(s.expected) + " " + bits(s.error) + " " + bits(s.bound) + " " +
           std::to_string(s.rank) + (s.ok ? " ok " : " FAIL ") + s.diagnosis + "\n";
  out += "miscounted " + std::to_string(v.miscounted_total) + "\n";
  for (const oracle::Miscount& m : v.miscounted) {
    out += m.name + " " + m.param_class + " " + std::to_string(m.counted) + "/" + std::to_string(m.expected) +
           " on " + std::to_string(m.observed_on) + " " + m.stats_group + "\n";
    for (const oracle::Contribution& k : m.contributions)
      out += "  " + std::to_string(k.rank) + " " + std::to_string(k.counted) + " " + k.rule + "\n";
  }
  out += (v.ranks_agree ? "agree " : "disagree ") + v.disagreement + "\n";
  for (const oracle::Verdict::Implied& i : v.implied)
    out += std::to_string(i.rank) + " " + bits(i.norm) + " " + std::to_string(i.zeros) + "\n";
  return out;
}

struct Judged {
  record::RunRecord run;
  oracle::GroundTruth truth;
  oracle::Verdict verdict;
};

// As cli/check_command.cpp's check_run: the record, its truth, the judge with the default --rtol.
Judged judge_as_check_does(const manifest::RunManifests& manifests) {
  Judged j;
  j.run = manifest::to_record(manifests);
  j.truth = oracle::truth_from_box_statistics(j.run);
  oracle::Bounds bounds;
  bounds.rtol = oracle::kFrameworkRtol;
  j.verdict = oracle::judge(j.run, j.truth, bounds);
  return j;
}

// A piece of the record with statistics: a local param (its whole box) or an owned range.
struct Holding {
  int rank = 0;
  std::string what;  // "rank 1 params[0]", "rank 1 pieces[3]"
  int tensor = 0;
  record::Box box;
  record::ElementRange range;
  record::GradStats stats;
};

bool same_elements(const Holding& a, const Holding& b) {
  return a.tensor == b.tensor && a.box == b.box && a.range == b.range;
}

std::string stats_text(const record::GradStats& s) {
  return "{" + bits(s.sum_squares) + ", " + bits(s.abs_max) + ", " + std::to_string(s.zeros) + "}";
}

// manifest/statistics.h's rules, rechecked on what the judge reads, piece against piece.
std::string inconsistent_record(const record::RunRecord& run) {
  std::vector<Holding> held;
  std::set<const record::LocalRecord*> seen;
  for (const record::RankRecord& rank : run.ranks) {
    if (!seen.insert(rank.local.get()).second) continue;  // the same pieces as an earlier rank
    const record::LocalRecord& local = *rank.local;
    const std::string at = "rank " + std::to_string(rank.rank) + " ";
    for (std::size_t i = 0; i < local.params.size(); ++i) {
      const record::LocalParam& p = local.params[i];
      if (!p.stats) return at + "params[" + std::to_string(i) + "] has no statistics";
      held.push_back({rank.rank, at + "params[" + std::to_string(i) + "]", p.tensor, p.box, {0, p.box.numel()}, *p.stats});
    }
    for (std::size_t k = 0; k < local.pieces.size(); ++k) {
      const record::Piece& piece = local.pieces[k];
      const record::LocalParam& p = local.params[static_cast<std::size_t>(piece.param)];
      if (!piece.stats) return at + "pieces[" + std::to_string(k) + "] has no statistics";
      const record::GradStats& s = *piece.stats;
      const record::GradStats& box = *p.stats;
      const std::string what = at + "pieces[" + std::to_string(k) + "]";
      held.push_back({rank.rank, what, p.tensor, p.box, piece.range, s});
      // A part of its box.
      if (s.zeros > box.zeros || s.zeros < box.zeros - (p.box.numel() - piece.range.size()) ||
          s.abs_max > box.abs_max || s.sum_squares > box.sum_squares * (1.0 + 2 * manifest::kRoundingRtol) + 1e-300)
        return what + " " + stats_text(s) + " of " + std::to_string(piece.range.size()) + " elements cannot be part of its box " +
               stats_text(box) + " of " + std::to_string(p.box.numel());
    }
  }
  for (const Holding& h : held) {
    const std::string rule = manifest::impossible_statistics(h.stats, h.range.size());
    if (!rule.empty()) return h.what + " holds impossible statistics: " + rule;
  }
  for (std::size_t a = 0; a < held.size(); ++a)
    for (std::size_t b = a + 1; b < held.size(); ++b) {
      const Holding& x = held[a];
      const Holding& y = held[b];
      if (!same_elements(x, y)) continue;
      const bool equal = x.stats.zeros == y.stats.zeros && x.stats.abs_max == y.stats.abs_max &&
                         std::abs(x.stats.sum_squares - y.stats.sum_squares) <=
                             2 * manifest::kRoundingRtol * std::max(x.stats.sum_squares, y.stats.sum_squares) + 1e-300;
      if (!equal)
        return x.what + " " + stats_text(x.stats) + " and " + y.what + " " + stats_text(y.stats) +
               " hold the same elements with other statistics";
    }
  return "";
}

// Where every ledger counts every element once, the pieces a rank counted tile the model, so
// their statistics sum to the truth's.
std::string ledger_disagrees_with_truth(const Judged& j) {
  if (j.verdict.miscounted_total != 0) return "";
  std::int64_t pieces = 0;
  for (const record::RankRecord& rank : j.run.ranks) pieces += static_cast<std::int64_t>(rank.local->pieces.size());
  const double truth = j.truth.main.sum_squares;
  for (const oracle::Verdict::Implied& i : j.verdict.implied) {
    if (i.zeros != j.truth.zeros)
      return "rank " + std::to_string(i.rank) + " counts every element once, but its ledger implies " +
             std::to_string(i.zeros) + " zeros and the truth is " + std::to_string(j.truth.zeros);
    const double implied = i.norm * i.norm;
    if (!std::isfinite(truth) || !std::isfinite(implied)) continue;
    // Each range of a box may be off by kRoundingRtol of the box's sum (manifest/statistics.h).
    const double bound = 4.0 * static_cast<double>(pieces + 2) * manifest::kRoundingRtol * truth + 1e-300;
    if (std::abs(implied - truth) > bound)
      return "rank " + std::to_string(i.rank) + " counts every element once, but its ledger implies a sum of squares " +
             bits(implied) + " and the truth is " + bits(truth);
  }
  return "";
}

std::string one_line(std::string_view kind, const std::string& message) {
  if (message.empty()) return std::string(kind) + " with an empty message";
  if (message.find('\n') != std::string::npos) return std::string(kind) + " of more than one line: " + message;
  return "";
}

}  // namespace

std::vector<FramedFile> unframe(std::string_view input) {
  std::vector<FramedFile> files;
  std::size_t at = input.rfind(kHeader, 0) == 0 ? 0 : input.find("\n" + std::string(kHeader));
  if (at != 0 && at != std::string_view::npos) ++at;  // past the newline
  while (at != std::string_view::npos && at < input.size()) {
    const std::size_t name_end = std::min(input.find('\n', at), input.size());
    FramedFile& file = files.emplace_back();
    file.name = std::string(input.substr(at + kHeader.size(), name_end - at - kHeader.size()));
    const std::size_t text_begin = std::min(name_end + 1, input.size());
    const std::size_t next = input.find("\n" + std::string(kHeader), name_end);
    const std::size_t text_end = next == std::string_view::npos ? input.size() : next;
    file.text = std::string(input.substr(text_begin, text_end > text_begin ? text_end - text_begin : 0));
    at = next == std::string_view::npos ? next : next + 1;
  }
  return files;
}

std::string frame(const std::vector<FramedFile>& files) {
  std::string out;
  for (std::size_t i = 0; i < files.size(); ++i)
    out += (i ? "\n" : "") + std::string(kHeader) + files[i].name + "\n" + files[i].text;
  return out;
}

std::string broken_property(std::string_view input) {
  const std::vector<FramedFile> files = unframe(input);
  std::vector<std::string> paths;
  std::map<std::string, const std::string*> bytes;
  for (const FramedFile& f : files) {
    paths.push_back("input/" + f.name);
    bytes.emplace(paths.back(), &f.text);  // a repeated name: its first file
  }
  manifest::RunManifests manifests;
  Judged first;
  try {
    // One thread: an input is small, and libFuzzer runs inputs back to back.
    manifests = manifest::read_run(paths, [&](const std::string& path) { return *bytes.at(path); }, "input", 1);
    first = judge_as_check_does(manifests);
  } catch (const manifest::ManifestError& error) {
    return one_line("a ManifestError", error.what());
  } catch (const oracle::RecordTooLarge& error) {
    return one_line("a RecordTooLarge", error.what());
  } catch (const oracle::TruthUnknown& error) {
    return one_line("a TruthUnknown", error.what());
  } catch (const std::exception& error) {
    return std::string("an exception tally check does not expect escaped: ") + typeid(error).name() + ": " + error.what();
  } catch (...) {
    return "an exception that is not a std::exception escaped";
  }
  try {
    const Judged again = judge_as_check_does(manifests);
    if (verdict_text(again.verdict) != verdict_text(first.verdict))
      return "the same manifests judged twice gave two verdicts:\n" + verdict_text(first.verdict) + "---\n" +
             verdict_text(again.verdict);
  } catch (const std::exception& error) {
    return std::string("judging accepted manifests again threw: ") + error.what();
  }
  if (std::string broken = inconsistent_record(first.run); !broken.empty())
    return "accepted, but " + broken;
  if (std::string broken = ledger_disagrees_with_truth(first); !broken.empty())
    return "accepted, but " + broken;
  return "";
}

}  // namespace tally::fuzz
