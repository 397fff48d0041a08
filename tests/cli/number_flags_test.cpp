#include "cli/number_flags.h"

#include <gtest/gtest.h>

#include "cli/path_flags.h"

namespace tally::cli {
namespace {

TEST(NumberFlags, WholeNumbersAreDecimalOnly) {
  EXPECT_FALSE(whole_number_error("42", 1, kIntMax));
  EXPECT_FALSE(whole_number_error("-3", -5, 5));
  for (const char* text : {"", "0x2", "+2", " 2", "2 ", "2.0", "1e3", "--2", "-", "two"})
    EXPECT_EQ(whole_number_error(text, 0, kIntMax),
              "expected a whole number in decimal, got '" + std::string(text) + "'")
        << text;
}

TEST(NumberFlags, WholeNumbersNameTheBoundTheyBreak) {
  EXPECT_EQ(whole_number_error("0", 1, kIntMax), "must be at least 1, got 0");
  EXPECT_EQ(whole_number_error("0", 1, 8), "must be between 1 and 8, got 0");
  EXPECT_EQ(whole_number_error("9", 1, 8), "must be at most 8, got 9");
  EXPECT_EQ(whole_number_error("99999999999", 1, kIntMax), "must be at most 2147483647, got 99999999999");
  // Beyond int64 is out of range, not saturated.
  EXPECT_EQ(whole_number_error("9223372036854775808", 1, kNoUpperBound),
            "must be at most 9223372036854775807, got 9223372036854775808");
  EXPECT_EQ(whole_number_error("-9223372036854775809", 1, kNoUpperBound),
            "must be at least 1, got -9223372036854775809");
}

TEST(NumberFlags, SeedsSpanUnsigned64BitsAndNoMore) {
  EXPECT_FALSE(seed_error("0"));
  EXPECT_FALSE(seed_error("18446744073709551615"));
  EXPECT_EQ(seed_error("18446744073709551616"), "a seed is at most 18446744073709551615, got 18446744073709551616");
  EXPECT_TRUE(seed_error("-1"));  // once 2^64-1
  EXPECT_TRUE(seed_error(""));
  EXPECT_TRUE(seed_error("0x10"));
}

TEST(NumberFlags, RealsAreFiniteDecimals) {
  for (const char* text : {"1", "0.5", ".5", "5.", "1e-6", "2.5E+3", "-0"})
    EXPECT_FALSE(real_number_error(text, -10, 1e6)) << text;
  for (const char* text : {"nan", "NaN", "inf", "-inf", "infinity", "0x1p3", "", ".", "e5", "1e", " 1", "1,5"})
    EXPECT_EQ(real_number_error(text, -10, 1e6), "expected a finite number in decimal, got '" + std::string(text) + "'")
        << text;
  EXPECT_EQ(real_number_error("1e400", 0, 1e300), "must be between 0 and 1.0000000000000001e+300, got 1e400");
  EXPECT_EQ(real_number_error("0", 1, 1e6), "must be between 1 and 1000000, got 0");
}

TEST(NumberFlags, DurationsNeedUnitsBetweenAmounts) {
  EXPECT_EQ(duration_seconds("90"), 90.0);
  EXPECT_EQ(duration_seconds("1h30m"), 5400.0);
  EXPECT_EQ(duration_seconds("0.5m"), 30.0);
  EXPECT_EQ(duration_seconds("10m5s"), 605.0);
  // "1h30": a lone amount is seconds only when it is the whole duration.
  for (const char* text : {"", "0", "0s", "nan", "inf", "1e3s", "0x10", "1h30", "-5s", "5x", "s", "1.2.3s"})
    EXPECT_FALSE(duration_seconds(text)) << text;
  EXPECT_FALSE(duration_seconds("2000000000"));  // beyond kMostDurationSeconds
}

TEST(PathFlags, OutputFilesAndFoldersAreCheckedBeforeWork) {
  const std::string temp = ::testing::TempDir();
  EXPECT_FALSE(output_file_error(temp + "/report.xml"));
  EXPECT_EQ(output_file_error(temp), temp + " is a folder, not a file");
  EXPECT_EQ(output_file_error("/nonexistent/report.xml"),
            "the folder /nonexistent of /nonexistent/report.xml does not exist");
  EXPECT_FALSE(output_folder_error(temp));
  EXPECT_FALSE(output_folder_error(temp + "/not/yet/there"));  // created when first needed
  EXPECT_EQ(output_folder_error("/etc/hostname"), "/etc/hostname exists and is not a folder");
  EXPECT_EQ(output_folder_error("/etc/hostname/corpus"),
            "cannot create /etc/hostname/corpus: /etc/hostname is not a folder");
}

}  // namespace
}  // namespace tally::cli
