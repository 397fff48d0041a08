#include "manifest/statistics.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "manifest/manifest_json.h"
#include "record/run_record.h"
#include "record/text.h"

namespace tally::manifest {

namespace {

std::string digits(double x) { return record::all_digits(x); }

// Rounding of sums of `elements` squares near the bottom of the range, where relative bounds end.
double underflow_slack(std::int64_t elements) {
  return static_cast<double>(elements + 1) * std::numeric_limits<double>::denorm_min();
}

bool same_sum(double a, double b, std::int64_t elements) {
  return std::abs(a - b) <= kRoundingRtol * std::max(std::abs(a), std::abs(b)) + underflow_slack(elements);
}

// A piece with statistics: params[index] of a rank (optimizer -1, the whole box) or
// optimizers[optimizer].main_params[index] (a range of its param's box).
struct PieceRef {
  int rank = 0;
  int optimizer = -1;
  int index = 0;
  friend auto operator<=>(const PieceRef&, const PieceRef&) = default;
};

// Differences of zero counts and sums of squares between two ends of ranges.
struct Part {
  std::int64_t zeros = 0;
  double squares = 0.0;
  Part operator+(const Part& o) const { return {zeros + o.zeros, squares + o.squares}; }
  Part operator-(const Part& o) const { return {zeros - o.zeros, squares - o.squares}; }
};

Part part_of(const GradStats& s) { return {s.zeros, s.sum_squares}; }

// The pieces of one box of a logical param seen so far. Range ends are the nodes of a weighted
// union-find: a range [b, e) with statistics s says potential(e) - potential(b) = s, for zeros
// and sums of squares; a range between two ends already joined must agree with the difference
// their potentials imply.
struct BoxPieces {
  std::int64_t elements = 0;
  PieceRef whole;  // the first param holding the box
  GradStats stats;
  std::map<std::pair<std::int64_t, std::int64_t>, PieceRef> first_of_range;
  std::map<std::int64_t, int> node_at;
  std::vector<int> parent;
  std::vector<Part> above_parent;  // potential(node) - potential(parent)
  std::vector<std::vector<std::pair<int, PieceRef>>> ranges_at;  // per node: (other end, piece)

  int node(std::int64_t at) {
    auto [it, fresh] = node_at.try_emplace(at, static_cast<int>(parent.size()));
    if (fresh) {
      parent.push_back(it->second);
      above_parent.push_back({});
      ranges_at.emplace_back();
    }
    return it->second;
  }

  // The root of `x` and potential(x) - potential(root); compresses the path.
  std::pair<int, Part> find(int x) {
    int root = x;
    Part below_root;
    while (parent[static_cast<std::size_t>(root)] != root) {
      below_root = below_root + above_parent[static_cast<std::size_t>(root)];
      root = parent[static_cast<std::size_t>(root)];
    }
    Part rest = below_root;
    for (int y = x; parent[static_cast<std::size_t>(y)] != y;) {
      const int next = parent[static_cast<std::size_t>(y)];
      const Part own = above_parent[static_cast<std::size_t>(y)];
      parent[static_cast<std::size_t>(y)] = root;
      above_parent[static_cast<std::size_t>(y)] = rest;
      rest = rest - own;
      y = next;
    }
    return {root, below_root};
  }

  // The pieces of a path of ranges from end `from` to end `to` (joined ends), fewest first.
  std::vector<PieceRef> pieces_between(int from, int to) const {
    std::vector<std::pair<int, PieceRef>> came_from(parent.size(), {-1, PieceRef{}});
    std::deque<int> queue{from};
    came_from[static_cast<std::size_t>(from)].first = from;
    while (!queue.empty() && came_from[static_cast<std::size_t>(to)].first < 0) {
      const int x = queue.front();
      queue.pop_front();
      for (const auto& [y, piece] : ranges_at[static_cast<std::size_t>(x)])
        if (came_from[static_cast<std::size_t>(y)].first < 0) {
          came_from[static_cast<std::size_t>(y)] = {x, piece};
          queue.push_back(y);
        }
    }
    std::set<PieceRef> pieces;
    for (int y = to; y != from && came_from[static_cast<std::size_t>(y)].first >= 0;
         y = came_from[static_cast<std::size_t>(y)].first)
      pieces.insert(came_from[static_cast<std::size_t>(y)].second);
    return {pieces.begin(), pieces.end()};
  }
};

// Boxes of one tensor at the same offsets with other extents (a generalized-TP shard that holds
// only padding has extent 0) are different boxes.
struct BoxKey {
  int tensor = 0;
  std::array<std::int64_t, record::kMaxDims> offsets{};
  std::array<std::int64_t, record::kMaxDims> extents{};
  friend auto operator<=>(const BoxKey&, const BoxKey&) = default;
};

class StatisticsCheck {
 public:
  StatisticsCheck(const std::vector<const RankManifest*>& ranks,
                  const std::vector<std::vector<int>>& logical_of, bool agreement)
      : ranks_(ranks), logical_of_(logical_of), agreement_(agreement) {}

  void run() {
    for (const RankManifest* m : ranks_) {
      for (std::size_t i = 0; i < m->params.size(); ++i) check_param(*m, static_cast<int>(i));
      for (std::size_t c = 0; c < m->optimizers.size(); ++c)
        for (std::size_t k = 0; k < m->optimizers[c].main_params.size(); ++k)
          check_range(*m, {m->rank, static_cast<int>(c), static_cast<int>(k)});
    }
    for (auto& [key, box] : boxes_) check_parts(box);
  }

 private:
  const RankManifest& manifest(const PieceRef& p) const { return *ranks_[static_cast<std::size_t>(p.rank)]; }
  const MainParam& main_param(const PieceRef& p) const {
    return manifest(p).optimizers[static_cast<std::size_t>(p.optimizer)].main_params[static_cast<std::size_t>(p.index)];
  }
  const ModelParam& param_of(const PieceRef& p) const {
    const int index = p.optimizer < 0 ? p.index : main_param(p).param;
    return manifest(p).params[static_cast<std::size_t>(index)];
  }
  const GradStats& stats_of(const PieceRef& p) const {
    return p.optimizer < 0 ? param_of(p).stats : main_param(p).stats;
  }

  // "params[3] (NAME, box offsets [0,0] extents [8,8])" or "optimizers[0].main_params[2] (NAME,
  // elements [0,64) of box offsets [0,0] extents [8,8])".
  std::string name(const PieceRef& p) const {
    const ModelParam& param = param_of(p);
    const std::string box = "box offsets " + sizes_text(param.offsets) + " extents " + sizes_text(param.extents);
    if (p.optimizer < 0) return "params[" + std::to_string(p.index) + "] (" + param.logical_name + ", " + box + ")";
    const MainParam& m = main_param(p);
    return "optimizers[" + std::to_string(p.optimizer) + "].main_params[" + std::to_string(p.index) + "] (" +
           param.logical_name + ", elements [" + std::to_string(m.begin) + "," + std::to_string(m.end) + ") of " + box + ")";
  }
  // The piece as the first words of a message ("rank-0.json: params[3] (...)") or later in it.
  std::string first(const PieceRef& p) const { return manifest_file_name(p.rank) + ": " + name(p); }
  std::string other(const PieceRef& p) const { return manifest_file_name(p.rank) + " " + name(p); }
  std::string others(const std::vector<PieceRef>& pieces) const {
    std::string out;
    for (std::size_t i = 0; i < pieces.size(); ++i)
      out += (i == 0 ? "" : i + 1 == pieces.size() ? " and " : ", ") + other(pieces[i]);
    return out;
  }

  [[noreturn]] void reject(const std::string& message) const { throw ManifestError(message); }

  // The box params[index] of `rank` holds, named by its logical param and offsets.
  BoxKey box_key(int rank, int index) const {
    const ModelParam& param = ranks_[static_cast<std::size_t>(rank)]->params[static_cast<std::size_t>(index)];
    BoxKey key{logical_of_[static_cast<std::size_t>(rank)][static_cast<std::size_t>(index)], {}, {}};
    std::copy(param.offsets.begin(), param.offsets.end(), key.offsets.begin());
    std::copy(param.extents.begin(), param.extents.end(), key.extents.begin());
    return key;
  }

  void check_possible(const PieceRef& p, std::int64_t elements) const {
    const std::string rule = impossible_statistics(stats_of(p), elements);
    if (!rule.empty()) reject(first(p) + ": impossible statistics: " + rule);
  }

  // Pieces of the same elements: equal statistics.
  void check_same(const PieceRef& p, const PieceRef& q, std::int64_t elements) const {
    const GradStats& a = stats_of(p);
    const GradStats& b = stats_of(q);
    std::string differ;
    auto add = [&](const std::string& what) { differ += (differ.empty() ? "" : "; ") + what; };
    if (!same_sum(a.sum_squares, b.sum_squares, elements))
      add("sum_squares " + digits(a.sum_squares) + " here, " + digits(b.sum_squares) + " there");
    if (a.abs_max != b.abs_max) add("abs_max " + digits(a.abs_max) + " here, " + digits(b.abs_max) + " there");
    if (a.zeros != b.zeros)
      add("zeros " + std::to_string(a.zeros) + " here, " + std::to_string(b.zeros) + " there");
    if (!differ.empty())
      reject(first(p) + " and " + other(q) + " cover the same elements but disagree: " + differ +
             " (pieces of the same elements must have equal statistics)");
  }

  void check_param(const RankManifest& m, int index) {
    const PieceRef p{m.rank, -1, index};
    const ModelParam& param = m.params[static_cast<std::size_t>(index)];
    const std::int64_t elements = volume(param.extents);
    check_possible(p, elements);
    if (!agreement_) return;
    auto [it, fresh] = boxes_.try_emplace(box_key(m.rank, index));
    BoxPieces& box = it->second;
    if (!fresh) return check_same(p, box.whole, elements);
    box.elements = elements;
    box.whole = p;
    box.stats = param.stats;
    add_range(box, p, 0, elements);
  }

  void check_range(const RankManifest& m, const PieceRef& p) {
    const MainParam& piece = main_param(p);
    const PieceRef own{m.rank, -1, piece.param};
    const ModelParam& param = param_of(p);
    const std::int64_t elements = piece.end - piece.begin;
    check_possible(p, elements);
    if (!agreement_) return;
    if (elements == volume(param.extents)) return check_same(p, own, elements);
    BoxPieces& box = boxes_.at(box_key(m.rank, piece.param));
    auto [seen, fresh] = box.first_of_range.try_emplace({piece.begin, piece.end}, p);
    if (!fresh) return check_same(p, seen->second, elements);
    check_within_box(p, own, box);
    add_range(box, p, piece.begin, piece.end);
  }

  // A part of a box holds at most what the box holds, and at least the zeros the rest cannot.
  void check_within_box(const PieceRef& p, const PieceRef& own, const BoxPieces& box) const {
    const GradStats& s = stats_of(p);
    const GradStats& whole = box.stats;
    const MainParam& piece = main_param(p);
    const std::int64_t elements = piece.end - piece.begin;
    const std::int64_t least = whole.zeros - (box.elements - elements);
    std::string broken;
    if (s.zeros > whole.zeros)
      broken = "zeros " + std::to_string(s.zeros) + ", more than the whole box's " + std::to_string(whole.zeros);
    else if (s.zeros < least)
      broken = "zeros " + std::to_string(s.zeros) + ", but the box's " + std::to_string(whole.zeros) +
               " zeros leave at least " + std::to_string(least) + " in these " + std::to_string(elements) + " elements";
    else if (s.abs_max > whole.abs_max)
      broken = "abs_max " + digits(s.abs_max) + ", more than the whole box's " + digits(whole.abs_max);
    else if (s.sum_squares > whole.sum_squares * (1.0 + kRoundingRtol) + underflow_slack(box.elements))
      broken = "sum_squares " + digits(s.sum_squares) + ", more than the whole box's " + digits(whole.sum_squares);
    if (!broken.empty())
      reject(first(p) + " and its param " + other(own) + ": " + broken +
             " (a part of a box holds no more than the box, and the rest of the box no more than its elements)");
  }

  void add_range(BoxPieces& box, const PieceRef& p, std::int64_t begin, std::int64_t end) {
    const Part range = part_of(stats_of(p));
    const int b = box.node(begin);
    const int e = box.node(end);
    const auto [root_b, at_b] = box.find(b);
    const auto [root_e, at_e] = box.find(e);
    if (root_b == root_e) {
      const Part implied = at_e - at_b;
      const double scale = std::max({box.stats.sum_squares, range.squares, std::abs(implied.squares)});
      if (implied.zeros != range.zeros ||
          std::abs(implied.squares - range.squares) > kRoundingRtol * scale + underflow_slack(box.elements))
        reject(first(p) + ": zeros " + std::to_string(range.zeros) + " and sum_squares " + digits(range.squares) +
               ", but " + others(box.pieces_between(b, e)) + " leave zeros " + std::to_string(implied.zeros) +
               " and sum_squares " + digits(implied.squares) +
               " for these elements (the statistics of a box's parts add up to the box's)");
    } else {
      box.parent[static_cast<std::size_t>(root_e)] = root_b;
      box.above_parent[static_cast<std::size_t>(root_e)] = at_b + range - at_e;
    }
    box.ranges_at[static_cast<std::size_t>(b)].push_back({e, p});
    box.ranges_at[static_cast<std::size_t>(e)].push_back({b, p});
  }

  // Every part between two joined ends, nearest first: 0 .. all of its elements zero, a sum of
  // squares >= 0.
  void check_parts(BoxPieces& box) const {
    std::map<int, std::pair<std::int64_t, int>> last_of_root;  // root -> (position, node)
    for (const auto& [at, node] : box.node_at) {
      const auto [root, potential] = box.find(node);
      auto [last, fresh] = last_of_root.try_emplace(root, at, node);
      if (fresh) continue;
      const auto [from, from_node] = last->second;
      const Part part = potential - box.find(from_node).second;
      const bool possible = part.zeros >= 0 && part.zeros <= at - from &&
                            part.squares >= -(kRoundingRtol * box.stats.sum_squares + underflow_slack(box.elements));
      if (!possible) {
        const std::vector<PieceRef> pieces = box.pieces_between(from_node, node);
        reject(first(pieces.front()) + (pieces.size() > 1 ? ", " : "") +
               others(std::vector<PieceRef>(pieces.begin() + 1, pieces.end())) + " leave zeros " +
               std::to_string(part.zeros) + " and sum_squares " + digits(part.squares) + " for elements [" +
               std::to_string(from) + "," + std::to_string(at) +
               ") of their box (every part of a box holds 0 to all of its elements' zeros and a sum of squares >= 0)");
      }
      last->second = {at, node};
    }
  }

  const std::vector<const RankManifest*>& ranks_;
  const std::vector<std::vector<int>>& logical_of_;
  bool agreement_ = true;
  std::map<BoxKey, BoxPieces> boxes_;
};

}  // namespace

std::string impossible_statistics(const GradStats& s, std::int64_t elements) {
  if (!std::isfinite(s.sum_squares)) return "sum_squares " + digits(s.sum_squares) + " (expected a finite number)";
  if (!std::isfinite(s.abs_max)) return "abs_max " + digits(s.abs_max) + " (expected a finite number)";
  if (s.sum_squares < 0.0) return "sum_squares " + digits(s.sum_squares) + " (a sum of squares is >= 0)";
  if (s.abs_max < 0.0) return "abs_max " + digits(s.abs_max) + " (a magnitude is >= 0)";
  if (s.zeros < 0) return "zeros " + std::to_string(s.zeros) + " (a count is >= 0)";
  if (s.zeros > elements) return "zeros " + std::to_string(s.zeros) + " in " + std::to_string(elements) + " elements";
  const std::int64_t nonzero = elements - s.zeros;
  if (nonzero == 0 && (s.sum_squares != 0.0 || s.abs_max != 0.0))
    return "all " + std::to_string(elements) + " elements zero, but sum_squares " + digits(s.sum_squares) +
           " and abs_max " + digits(s.abs_max);
  if (nonzero > 0 && s.abs_max == 0.0)
    return std::to_string(nonzero) + " of " + std::to_string(elements) +
           " elements nonzero, but abs_max 0 (a nonzero element has a magnitude > 0)";
  // Squares of fp32 or bf16 values are exact in fp64; the sum rounds (kRoundingRtol).
  const double largest = s.abs_max * s.abs_max;
  const double slack = underflow_slack(elements);
  if (largest > s.sum_squares * (1.0 + kRoundingRtol) + slack)
    return "abs_max " + digits(s.abs_max) + " squared is " + digits(largest) + ", more than sum_squares " +
           digits(s.sum_squares) + " (the largest square is one of the squares summed)";
  const double most = static_cast<double>(nonzero) * largest;
  if (s.sum_squares > most * (1.0 + kRoundingRtol) + slack)
    return "sum_squares " + digits(s.sum_squares) + ", more than " + std::to_string(nonzero) +
           " nonzero elements times abs_max " + digits(s.abs_max) + " squared (" + digits(most) + ")";
  return "";
}

void check_statistics(const std::vector<const RankManifest*>& ranks,
                      const std::vector<std::vector<int>>& logical_of, bool agreement) {
  StatisticsCheck(ranks, logical_of, agreement).run();
}

}  // namespace tally::manifest
