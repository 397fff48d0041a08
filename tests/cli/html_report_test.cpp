// The HTML report: a well-formed, self-contained page (every tag closed, no script, nothing
// fetched), the ledger matrix marking the ranks that dropped a param, user text escaped, and the
// caps that keep a large run's page small. tests/cli/render_html.sh renders one in headless
// Chromium where it is installed (`apt-get install chromium`; CI's packages leave it out).
#include "cli/html_report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "run/run_case.h"
#include "tests/support/fault_cases.h"

namespace tally::cli {
namespace {

// Checks that `html` is well formed: every '<' opens a tag, every non-void tag is closed in
// order, attribute values are quoted or plain words, no script and no external reference.
// Returns "" or the first problem.
std::string well_formed(const std::string& html) {
  static const std::set<std::string> kVoid = {"meta", "br", "hr", "img", "input", "link"};
  static const std::set<std::string> kAllowed = {"html", "head", "meta", "title", "style", "body", "h1", "h2",
                                                 "pre", "p", "span", "table", "tr", "th", "td", "div",
                                                 "b", "details", "summary", "ul", "li"};
  std::vector<std::string> open;
  std::size_t at = 0;
  while ((at = html.find('<', at)) != std::string::npos) {
    const std::size_t end = html.find('>', at);
    if (end == std::string::npos) return "a '<' at " + std::to_string(at) + " never closes";
    const std::string tag = html.substr(at + 1, end - at - 1);
    at = end + 1;
    if (tag.rfind("!DOCTYPE", 0) == 0) continue;
    if (tag.find('<') != std::string::npos) return "a '<' inside tag <" + tag + ">";
    const bool closing = !tag.empty() && tag[0] == '/';
    const std::string name = tag.substr(closing ? 1 : 0, tag.find_first_of(" >", closing ? 1 : 0) - (closing ? 1 : 0));
    if (!kAllowed.count(name)) return "tag <" + name + "> is not one the report uses";
    if (tag.find("http") != std::string::npos || tag.find("src=") != std::string::npos)
      return "an external reference in <" + tag + ">";
    if (closing) {
      if (open.empty() || open.back() != name)
        return "</" + name + "> closes " + (open.empty() ? std::string("nothing") : "<" + open.back() + ">");
      open.pop_back();
      // The style block's CSS is text: skip to its end.
    } else if (!kVoid.count(name)) {
      open.push_back(name);
      if (name == "style") {
        const std::size_t close = html.find("</style>", at);
        if (close == std::string::npos) return "<style> never closes";
        at = close;
      }
    }
  }
  if (!open.empty()) return "<" + open.back() + "> is never closed";
  return "";
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string read(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

casefile::Case founding_fail(int world) {
  casefile::Case c;
  c.topology = testing::config_of(world, 2, 1, 2, 1);
  c.model = testing::founding_model();
  c.path = testing::ones(vocab::OptimizerModel::layerwise);
  c.path.gradients.class_mask = vocab::class_bit(topologies::ParamClass::expert_row_bias);
  c.path.faults = vocab::FaultSet::of({vocab::Fault::expert_dedup_on_dense_tp});
  return c;
}

TEST(HtmlReport, AFailingRunIsWellFormedAndMarksEveryRankThatDropped) {
  const casefile::Case c = founding_fail(8);
  const oracle::Verdict verdict = run::run_case(c);
  ASSERT_EQ(verdict.kind, oracle::Verdict::Kind::fail);
  const std::filesystem::path file = std::filesystem::temp_directory_path() /
                                     ("tally-html-" + std::to_string(::getpid()) + ".html");
  write_case_html(file.string(), "tally run", c, verdict, {"tally run --world 8 ..."});
  const std::string html = read(file);
  std::filesystem::remove(file);
  EXPECT_EQ(well_formed(html), "");
  // One expert's FC2 bias is dropped on all 8 ranks: 8 dropped cells, 8 dropped ranks.
  EXPECT_EQ(count(html, "<td class=dropped>0</td>"), 8u);
  EXPECT_EQ(count(html, "<span class=\"rank dropped\""), 8u);
  EXPECT_NE(html.find("<b>stage 0</b>"), std::string::npos);
  EXPECT_NE(html.find("tally run --world 8 ..."), std::string::npos);
  EXPECT_EQ(count(html, "<script"), 0u);
}

TEST(HtmlReport, TextFromTheUserIsEscaped) {
  casefile::Case c = founding_fail(2);
  c.description = "<script>alert('x')</script> & \"quoted\"";
  const oracle::Verdict verdict = run::run_case(c);
  HtmlReport page;
  page.title = "tally run <b>";
  page.summary = c.description;
  page.verdict = &verdict;
  page.params = {"p"};
  page.classes = {"row"};
  page.world = 2;
  const std::string html = html_report(page);
  EXPECT_EQ(well_formed(html), "");
  EXPECT_EQ(count(html, "<script"), 0u);
  EXPECT_NE(html.find("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;quoted&quot;"), std::string::npos);
  EXPECT_EQ(html_escape("a<b>&'\""), "a&lt;b&gt;&amp;&#39;&quot;");
}

TEST(HtmlReport, ABigModelsMatrixIsCappedAndSaysSo) {
  std::vector<topologies::CustomParam> params;
  for (int i = 0; i < 400; ++i)
    params.push_back(testing::custom_param("p" + std::to_string(i), topologies::ParamClass::replicated, {1}));
  casefile::Case c;
  c.topology = testing::config_of(1, 1, 1, 1, 1);
  c.model = testing::custom_model(params);
  c.path = testing::ones(vocab::OptimizerModel::plain);
  const oracle::Verdict verdict = run::run_case(c);
  const topologies::LogicalModel model(c.model, c.topology);
  HtmlReport page;
  page.title = "tally run";
  page.verdict = &verdict;
  for (const topologies::LogicalParam& p : model.params()) {
    page.params.push_back(p.name);
    page.classes.push_back("replicated");
  }
  page.world = 1;
  const std::string html = html_report(page);
  EXPECT_EQ(well_formed(html), "");
  EXPECT_EQ(count(html, "<td class=ok>1</td>"), kHtmlMaxParamRows);
  EXPECT_NE(html.find("Showing 300 of 400 params"), std::string::npos);
}

// A rank whose total is right but counts half a param twice and half never is marked both;
// wrong ranks past the grid's 1,024 still show.
TEST(HtmlReport, ARightTotalOfWrongElementsAndRanksPastTheGridAreMarked) {
  const casefile::Case c = founding_fail(2);
  oracle::Verdict verdict = run::run_case(c);
  oracle::Miscount m;
  m.name = "w";
  m.expected = 8;
  m.counted = 8;
  m.wrong_ranks = {1, 5000};
  m.wrong_counted = {8, 0};
  verdict.miscounted = {m};
  HtmlReport page;
  page.title = "tally check";
  page.verdict = &verdict;
  page.params = {"w"};
  page.classes = {"replicated"};
  page.world = 6000;
  const std::string html = html_report(page);
  EXPECT_EQ(well_formed(html), "");
  EXPECT_EQ(count(html, "<span class=\"rank both\""), 1u);  // rank 1
  EXPECT_NE(html.find("wrong ranks past them"), std::string::npos);
  EXPECT_EQ(count(html, "<span class=\"rank dropped\""), 1u);  // rank 5000
}

TEST(HtmlReport, TheCheckerRejectsWhatAPageMustNotHold) {
  EXPECT_NE(well_formed("<html><body><p>x</body></html>"), "");
  EXPECT_NE(well_formed("<html><script>x</script></html>"), "");
  EXPECT_NE(well_formed("<html><p>a < b</p></html>"), "");
  EXPECT_EQ(well_formed("<!DOCTYPE html>\n<html><p>a &lt; b</p></html>"), "");
}

}  // namespace
}  // namespace tally::cli
