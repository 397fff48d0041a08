#include "fuzz/junit.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace tally::fuzz {
namespace {

TEST(Junit, CountsAndStructure) {
  const std::string xml = junit_xml(
      "tally.replay", {{"seeds/a.json", "tally.replay.seeds", 0.25, "", false, ""},
                       {"seeds/b.json", "tally.replay.seeds", 1.5, "expected pass, got fail\nreplay: tally run seeds/b.json", false, ""},
                       {"seeds/c.json", "tally.replay.seeds", 0.0, "seeds/c.json: invalid JSON", true, ""},
                       {"seeds/d.json", "tally.replay.seeds", 0.0, "", false, "megatron-core 0.19.2 refused it: rank 0: ValueError: no"}});
  EXPECT_EQ(xml.rfind("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n", 0), 0u);
  EXPECT_NE(xml.find("<testsuite name=\"tally.replay\" tests=\"4\" failures=\"1\" errors=\"1\" skipped=\"1\" time=\"1.750\">"),
            std::string::npos) << xml;
  EXPECT_NE(xml.find("<testcase name=\"seeds/a.json\" classname=\"tally.replay.seeds\" time=\"0.250\"/>"),
            std::string::npos) << xml;
  EXPECT_NE(xml.find("<failure message=\"expected pass, got fail\">expected pass, got fail\nreplay: tally run seeds/b.json</failure>"),
            std::string::npos) << xml;
  EXPECT_NE(xml.find("<error message=\"seeds/c.json: invalid JSON\">"), std::string::npos) << xml;
  EXPECT_NE(xml.find("<skipped message=\"megatron-core 0.19.2 refused it: rank 0: ValueError: no\">"), std::string::npos) << xml;
  EXPECT_NE(xml.find("</testsuites>\n"), std::string::npos);
}

TEST(Junit, EscapesEverythingXmlCannotCarry) {
  const std::string xml = junit_xml(
      "s<&>\"'", {{"a&b<c>\"d'e", "k", 0.0, std::string("bad \x01 byte \xff and \xE2\x9C\x93\ttab"), false}});
  EXPECT_NE(xml.find("name=\"s&lt;&amp;&gt;&quot;&apos;\""), std::string::npos) << xml;
  EXPECT_NE(xml.find("name=\"a&amp;b&lt;c&gt;&quot;d&apos;e\""), std::string::npos) << xml;
  // A control character and an invalid byte become U+FFFD; valid UTF-8 stays; a tab stays
  // (as a reference inside an attribute).
  EXPECT_NE(xml.find("message=\"bad \xEF\xBF\xBD byte \xEF\xBF\xBD and \xE2\x9C\x93&#9;tab\""),
            std::string::npos) << xml;
  EXPECT_NE(xml.find(">bad \xEF\xBF\xBD byte \xEF\xBF\xBD and \xE2\x9C\x93\ttab</failure>"),
            std::string::npos) << xml;
  // Surrogates and overlong forms are not UTF-8.
  const std::string odd = junit_xml("s", {{"\xED\xA0\x80|\xC0\xAF|\xF4\x90\x80\x80", "k", 0, "", false}});
  EXPECT_NE(odd.find("name=\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD|\xEF\xBF\xBD\xEF\xBF\xBD|"), std::string::npos) << odd;
}

TEST(Junit, EmptySuite) {
  EXPECT_NE(junit_xml("empty", {}).find("tests=\"0\" failures=\"0\" errors=\"0\" skipped=\"0\" time=\"0.000\""),
            std::string::npos);
}

TEST(Junit, WritesAtomically) {
  const std::filesystem::path file = std::filesystem::path(::testing::TempDir()) / "tally_junit_test.xml";
  write_junit(file.string(), "s", {{"a", "k", 0.5, "", false}});
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), junit_xml("s", {{"a", "k", 0.5, "", false}}));
  std::filesystem::remove(file);
  EXPECT_THROW(write_junit("/nonexistent/folder/r.xml", "s", {}), std::runtime_error);
}

}  // namespace
}  // namespace tally::fuzz
