// check_config and RankLayout against Megatron-LM's own RankGenerator. The fixture comes from
// tests/topologies/megatron_rank_fixture.py, which runs megatron-core's parallel_state.py code
// (see its docstring for the format and how to regenerate it); this test needs neither Python
// nor torch.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <sstream>
#include <string>
#include <vector>

#include "topologies/parallel_config.h"
#include "topologies/rank_layout.h"
#include "tests/support/configs.h"

namespace tally::topologies {
namespace {

const std::string kDataDir = std::string(TALLY_SOURCE_DIR) + "/tests/topologies/data/";
constexpr int kMaxReported = 5;  // mismatches printed in full; the rest are only counted
constexpr std::string_view kDigits =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

std::uint64_t fnv1a64(std::string_view text) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char byte : text) h = (h ^ byte) * 0x100000001b3ULL;
  return h;
}

std::string hex16(std::uint64_t value) {
  std::ostringstream out;
  out << std::hex;
  out.width(16);
  out.fill('0');
  out << value;
  return out.str();
}

using Groups = std::vector<std::vector<int>>;

Groups groups_of(const RankLayout& layout, Family family) {
  Groups out;
  for (int g = 0; g < layout.group_count(family); ++g) {
    const std::span<const int> ranks = layout.ranks({family, g});
    out.emplace_back(ranks.begin(), ranks.end());
  }
  return out;
}

// "name:[[r,r],[r]]" as Python's json.dumps(separators=(',', ':')) writes it.
void append_family(std::string& out, std::string_view name, const Groups& groups) {
  out += name;
  out += ":[";
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (g) out += ',';
    out += '[';
    for (std::size_t i = 0; i < groups[g].size(); ++i) {
      if (i) out += ',';
      out += std::to_string(groups[g][i]);
    }
    out += ']';
  }
  out += ']';
}

std::string canonical(const RankLayout& layout, const std::vector<Family>& families) {
  std::string out;
  for (Family family : families) {
    if (!out.empty()) out += ';';
    out += family_name(family);
    out += ":[";
    for (int g = 0; g < layout.group_count(family); ++g) {
      if (g) out += ',';
      out += '[';
      bool first = true;
      for (int rank : layout.ranks({family, g})) {
        if (!first) out += ',';
        first = false;
        out += std::to_string(rank);
      }
      out += ']';
    }
    out += ']';
  }
  return out;
}

struct SizeTuple {
  int world, tp, cp, pp, ep, etp, gtp = 1, egtp = 1;
  auto operator<=>(const SizeTuple&) const = default;
};

ParallelConfig config_of(const SizeTuple& t, const std::string& order) {
  ParallelConfig c = testing::config(t.world, t.tp, t.cp, t.pp, t.ep, t.etp, 1, order);
  c.gtp = t.gtp;
  c.egtp = t.egtp;
  return c;
}

// The orders of one world range, as listed by an `orders LO HI ...` line.
struct OrderRange {
  int lo, hi;
  std::vector<std::string> orders;
};

struct Fixture {
  std::string file;
  // megatron-core 0.19's fixture: lines carry gtp and egtp, drawn from these sizes; it lists
  // gtp = egtp = 1 only up to world 8 and leaves out tuples no order can accept.
  std::vector<int> gtp_sizes;
  std::vector<Family> families;
  std::vector<int> worlds;
  std::vector<OrderRange> order_ranges;
  std::int64_t accepted = -1, rejected = -1;
  // Per size tuple: one code per order ('.' rejected, else an index into digests).
  struct Line {
    std::string codes;
    std::vector<std::string> digests;
  };
  std::map<SizeTuple, Line> lines;

  const std::vector<std::string>& orders_for(int world) const {
    for (const OrderRange& range : order_ranges)
      if (range.lo <= world && world <= range.hi) return range.orders;
    throw std::runtime_error("fixture has no orders for world " + std::to_string(world));
  }
};

const std::string kFixture0161 = "megatron_rank_groups";
const std::string kFixture019 = "megatron_0_19_rank_groups";

Fixture load_fixture(const std::string& name) {
  std::ifstream in(kDataDir + name + ".txt");
  if (!in) throw std::runtime_error("cannot open " + kDataDir + name + ".txt");
  Fixture f;
  f.file = name;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    std::string head;
    words >> head;
    if (head == "families") {
      for (std::string name; words >> name;) {
        const std::optional<Family> family = family_from_name(name);
        if (!family) throw std::runtime_error("fixture names unknown family '" + name + "'");
        f.families.push_back(*family);
      }
    } else if (head == "worlds") {
      for (int w; words >> w;) f.worlds.push_back(w);
    } else if (head == "orders") {
      OrderRange range{};
      words >> range.lo >> range.hi;
      for (std::string order; words >> order;) range.orders.push_back(order);
      f.order_ranges.push_back(std::move(range));
    } else if (head == "gtp_sizes") {
      for (int g; words >> g;) f.gtp_sizes.push_back(g);
    } else if (head == "totals") {
      words >> f.accepted >> f.rejected;
    } else {
      SizeTuple t{std::stoi(head), 0, 0, 0, 0, 0};
      Fixture::Line entry;
      words >> t.tp >> t.cp >> t.pp >> t.ep >> t.etp;
      if (!f.gtp_sizes.empty()) words >> t.gtp >> t.egtp;
      words >> entry.codes;
      for (std::string digest; words >> digest;) entry.digests.push_back(digest);
      if (!words.eof() || entry.codes.empty())
        throw std::runtime_error("malformed fixture line: " + line);
      f.lines.emplace(t, std::move(entry));
    }
  }
  return f;
}

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// The size tuples of a fixture's coverage, in the script's order.
std::vector<SizeTuple> coverage(const Fixture& f) {
  std::vector<SizeTuple> out;
  for (int world : f.worlds) {
    const std::vector<int> ds = divisors(world);
    std::vector<int> gs;
    for (int g : f.gtp_sizes)
      if (world % g == 0) gs.push_back(g);
    if (f.gtp_sizes.empty()) gs = {1};
    for (int tp : ds)
      for (int cp : ds)
        for (int pp : ds)
          for (int ep : ds)
            for (int etp : ds)
              for (int gtp : gs)
                for (int egtp : gs) {
                  const SizeTuple t{world, tp, cp, pp, ep, etp, gtp, egtp};
                  if (!f.gtp_sizes.empty()) {
                    if (gtp == 1 && egtp == 1 && world > 8) continue;
                    if (world % (tp * cp * pp * gtp) != 0 || world % (etp * ep * pp * egtp) != 0)
                      continue;
                  }
                  out.push_back(t);
                }
  }
  return out;
}

// Every configuration of the fixture's coverage: acceptance must match check_config, and the
// groups of accepted ones must hash to Megatron's digest.
void expect_every_configuration_agrees(const Fixture& f) {
  ASSERT_FALSE(f.worlds.empty());
  ASSERT_GE(f.accepted, 0) << "fixture has no totals line";

  std::int64_t accepted = 0, rejected = 0, failures = 0;
  std::size_t lines_seen = 0;
  auto report = [&](const ParallelConfig& c, const std::string& what) {
    if (++failures <= kMaxReported)
      ADD_FAILURE() << describe(c) << ": " << what
                    << "\n  Megatron's text: python3 tests/topologies/megatron_rank_fixture.py "
                       "PATH/parallel_state.py --show "
                    << c.world << ' ' << c.tp << ' ' << c.cp << ' ' << c.pp << ' ' << c.ep << ' '
                    << c.etp << ' '
                    << (f.gtp_sizes.empty() ? ""
                                            : std::to_string(c.gtp) + ' ' + std::to_string(c.egtp) + ' ')
                    << c.order;
  };

  for (const SizeTuple& t : coverage(f)) {
    const std::vector<std::string>& orders = f.orders_for(t.world);
    const auto it = f.lines.find(t);
    const Fixture::Line* entry = it == f.lines.end() ? nullptr : &it->second;
    if (entry) {
      ++lines_seen;
      ASSERT_EQ(entry->codes.size(), orders.size())
          << "fixture line for world " << t.world << " has the wrong number of codes";
    }
    for (std::size_t o = 0; o < orders.size(); ++o) {
      const ParallelConfig c = config_of(t, orders[o]);
      const char code = entry ? entry->codes[o] : '.';
      const bool megatron_accepts = code != '.';
      const std::optional<std::string> error = check_config(c);
      (megatron_accepts ? accepted : rejected) += 1;
      if (megatron_accepts != !error.has_value()) {
        report(c, megatron_accepts ? "Megatron accepts, tally rejects: " + *error
                                   : "Megatron rejects, tally accepts");
        continue;
      }
      if (!megatron_accepts) continue;
      const std::size_t index = kDigits.find(code);
      ASSERT_LT(index, entry->digests.size()) << "bad code in fixture";
      const std::string text = canonical(RankLayout(c), f.families);
      const std::string digest = hex16(fnv1a64(text));
      if (digest != entry->digests[index])
        report(c, "groups differ: Megatron digest " + entry->digests[index] + ", tally digest " +
                      digest + "\n  tally's text:    " + text);
    }
  }
  EXPECT_EQ(failures, 0) << failures << " configurations disagree (first " << kMaxReported
                         << " shown)";
  // Guards against a truncated fixture or a coverage the two sides enumerate differently.
  EXPECT_EQ(lines_seen, f.lines.size()) << "fixture lines outside the enumerated coverage";
  EXPECT_EQ(accepted, f.accepted);
  EXPECT_EQ(rejected, f.rejected);
}

TEST(MegatronAgreement, EveryConfiguration) {
  const Fixture f = load_fixture(kFixture0161);
  ASSERT_EQ(f.families.size(), 16u);
  expect_every_configuration_agrees(f);
}

// megatron-core 0.19.2's RankGenerator with generalized TP: the gtp_remat axis, the groups that
// span it, the GTP groups and the world-sized distributed-optimizer group.
TEST(MegatronAgreement, EveryConfigurationWithGeneralizedTp) {
  const Fixture f = load_fixture(kFixture019);
  ASSERT_EQ(f.families.size(), 22u);
  ASSERT_FALSE(f.gtp_sizes.empty());
  expect_every_configuration_agrees(f);
}

// The readable subset: full group lists, compared family by family.
void expect_readable_subset_agrees(const std::string& name) {
  std::ifstream in(kDataDir + name + ".json");
  ASSERT_TRUE(in) << "cannot open " << kDataDir << name << ".json";
  const nlohmann::json data = nlohmann::json::parse(in);
  const Fixture f = load_fixture(name);
  ASSERT_GE(data.at("configs").size(), 3u);

  for (const nlohmann::json& entry : data.at("configs")) {
    const auto size = [&](const char* key) { return entry.value(key, 1); };
    const SizeTuple t{size("world"), size("tp"), size("cp"), size("pp"),
                      size("ep"),    size("etp"), size("gtp"), size("egtp")};
    const ParallelConfig c = config_of(t, entry.at("order").get<std::string>());
    SCOPED_TRACE(describe(c));
    const bool megatron_accepts = entry.at("accepted");
    const std::optional<std::string> error = check_config(c);
    ASSERT_EQ(megatron_accepts, !error.has_value())
        << (error ? "tally: " + *error : "Megatron: " + entry.value("rejected_by", ""));
    if (!megatron_accepts) continue;

    const RankLayout layout(c);
    std::string megatron_text;
    for (const std::string& family_name : data.at("families").get<std::vector<std::string>>()) {
      const Family family = family_from_name(family_name).value();
      const Groups expected = entry.at("groups").at(family_name).get<Groups>();
      EXPECT_EQ(groups_of(layout, family), expected) << "family " << family_name;
      if (!megatron_text.empty()) megatron_text += ';';
      append_family(megatron_text, family_name, expected);
    }
    // The C++ canonical text and hash reproduce the script's, so the digests above compare
    // like with like.
    EXPECT_EQ(hex16(fnv1a64(megatron_text)), entry.at("digest").get<std::string>());
    EXPECT_EQ(canonical(layout, f.families), megatron_text);
    // Both fixture files come from one run: the digest line agrees where the order is covered.
    const std::vector<std::string>& orders = f.orders_for(c.world);
    const auto order = std::find(orders.begin(), orders.end(), c.order);
    const auto line = f.lines.find(t);
    if (order != orders.end() && line != f.lines.end()) {
      const char code = line->second.codes.at(order - orders.begin());
      ASSERT_NE(code, '.');
      EXPECT_EQ(line->second.digests.at(kDigits.find(code)), entry.at("digest").get<std::string>());
    }
  }
}

TEST(MegatronAgreement, ReadableSubset) { expect_readable_subset_agrees(kFixture0161); }

TEST(MegatronAgreement, ReadableSubsetWithGeneralizedTp) { expect_readable_subset_agrees(kFixture019); }

TEST(MegatronAgreement, Fnv1a64MatchesReferenceVectors) {
  EXPECT_EQ(hex16(fnv1a64("")), "cbf29ce484222325");
  EXPECT_EQ(hex16(fnv1a64("a")), "af63dc4c8601ec8c");
  EXPECT_EQ(hex16(fnv1a64("foobar")), "85944171f73967e8");
}

}  // namespace
}  // namespace tally::topologies
