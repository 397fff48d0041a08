#include "oracle/ledger.h"

#include <algorithm>
#include <limits>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include "oracle/detail/compensated_sum.h"

namespace tally::oracle {

int expected_times(const record::RunRecord& run, int tensor, int ledger) {
  if (ledger == zero_count_ledger(run)) return 1;
  return run.tensors[static_cast<std::size_t>(tensor)].norm_group == ledger ? 1 : 0;
}

bool counts_in(const record::Piece& piece, int ledger, const record::RunRecord& run) {
  return ledger == zero_count_ledger(run) ? piece.in_zero_count : piece.counted_in == ledger;
}

namespace {

using detail::CompensatedSum;

// The distinct local records of a run, which rank holds which, and the first rank of each.
struct Locals {
  std::vector<const record::LocalRecord*> distinct;
  std::vector<int> first_rank;
  std::vector<int> of_rank;
};

Locals distinct_locals(const record::RunRecord& run) {
  Locals locals;
  std::unordered_map<const record::LocalRecord*, int> index;
  locals.of_rank.reserve(run.ranks.size());
  for (const record::RankRecord& rank : run.ranks) {
    auto [it, fresh] = index.try_emplace(rank.local.get(), static_cast<int>(locals.distinct.size()));
    if (fresh) {
      locals.distinct.push_back(rank.local.get());
      locals.first_rank.push_back(rank.rank);
    }
    locals.of_rank.push_back(it->second);
  }
  return locals;
}

// A piece as a range of atoms, with the ledgers it enters (bit L: ledger L).
struct AtomRange {
  std::int64_t first = 0, last = 0;
  int child = 0;
  std::uint32_t ledgers = 0;
};

struct Atoms {
  std::int64_t count = 0;
  std::vector<std::int64_t> size;  // elements per atom
  std::vector<int> tensor_of;      // per atom
  std::vector<std::vector<AtomRange>> ranges;  // per distinct local record
};

std::uint32_t ledger_bits(const record::Piece& piece, const record::RunRecord& run) {
  std::uint32_t bits = 0;
  if (piece.counted_in >= 0) bits |= std::uint32_t{1} << piece.counted_in;
  if (piece.in_zero_count) bits |= std::uint32_t{1} << zero_count_ledger(run);
  return bits;
}

// Leading dims that every piece of a tensor spans whole, each piece a whole box, repeat one
// pattern of runs in every index of them (row-major order): the ledger cuts the trailing dims
// once and weighs each atom by the repetitions. A row-parallel weight [out, in / tp] is then tp
// atoms, not out * tp.
struct Fold {
  int dims = 0;
  std::int64_t repeat = 1;
};

std::vector<Fold> fold_tensors(const record::RunRecord& run, const Locals& locals) {
  std::vector<Fold> folds(run.tensors.size());
  for (std::size_t t = 0; t < folds.size(); ++t) folds[t].dims = std::max(run.tensors[t].shape.ndim - 1, 0);
  for (const record::LocalRecord* local : locals.distinct)
    for (const record::Piece& piece : local->pieces) {
      const record::LocalParam& param = local->params[static_cast<std::size_t>(piece.param)];
      Fold& fold = folds[static_cast<std::size_t>(param.tensor)];
      const record::Extents& shape = run.tensors[static_cast<std::size_t>(param.tensor)].shape;
      if (piece.range.begin != 0 || piece.range.end != param.box.numel()) {
        fold.dims = 0;
        continue;
      }
      int whole = 0;
      while (whole < fold.dims && param.box.offset[whole] == 0 && param.box.extent.size[whole] == shape.size[whole])
        ++whole;
      fold.dims = whole;
    }
  for (std::size_t t = 0; t < folds.size(); ++t) {
    for (int d = 0; d < folds[t].dims; ++d) folds[t].repeat *= run.tensors[t].shape.size[d];
    if (folds[t].repeat <= 0) folds[t] = Fold{};  // an empty dim: nothing to fold
  }
  return folds;
}

record::Extents trailing(const record::Extents& extents, int folded) {
  record::Extents out;
  out.ndim = extents.ndim - folded;
  for (int d = 0; d < out.ndim; ++d) out.size[d] = extents.size[d + folded];
  return out;
}

record::Box trailing(const record::Box& box, int folded) {
  record::Box out;
  out.extent = trailing(box.extent, folded);
  for (int d = 0; d < out.extent.ndim; ++d) out.offset[d] = box.offset[d + folded];
  return out;
}

Atoms cut_atoms(const record::RunRecord& run, const Locals& locals, std::int64_t max_intervals) {
  const std::size_t tensors = run.tensors.size();
  const std::vector<Fold> folds = fold_tensors(run, locals);
  std::vector<std::vector<std::int64_t>> cuts(tensors);
  {
    // Room for two cuts per piece and per tensor end: most pieces are one run.
    std::vector<std::size_t> pieces(tensors, 0);
    for (const record::LocalRecord* local : locals.distinct)
      for (const record::Piece& piece : local->pieces)
        ++pieces[static_cast<std::size_t>(local->params[static_cast<std::size_t>(piece.param)].tensor)];
    for (std::size_t t = 0; t < tensors; ++t) {
      cuts[t].reserve(2 + 2 * pieces[t]);
      cuts[t] = {0, run.tensors[t].shape.numel() / folds[t].repeat};
    }
  }
  // Pass 1 cuts the tensors at every run's ends and keeps the runs that enter a ledger.
  struct Run {
    std::size_t local;
    int tensor, child;
    std::uint32_t ledgers;
    std::int64_t lo, hi;
  };
  std::vector<Run> runs;
  std::int64_t intervals = 0;
  for (std::size_t li = 0; li < locals.distinct.size(); ++li)
    for (const record::Piece& piece : locals.distinct[li]->pieces) {
      const record::LocalParam& param = locals.distinct[li]->params[static_cast<std::size_t>(piece.param)];
      const std::uint32_t bits = ledger_bits(piece, run);
      std::vector<std::int64_t>& c = cuts[static_cast<std::size_t>(param.tensor)];
      const Fold& fold = folds[static_cast<std::size_t>(param.tensor)];
      const record::Extents& shape = run.tensors[static_cast<std::size_t>(param.tensor)].shape;
      const record::Box box = fold.dims > 0 ? trailing(param.box, fold.dims) : param.box;
      const record::ElementRange range = fold.dims > 0 ? record::ElementRange{0, box.numel()} : piece.range;
      for_each_interval(fold.dims > 0 ? trailing(shape, fold.dims) : shape, box,
                        range.begin, range.end, [&](std::int64_t lo, std::int64_t hi) {
        if (++intervals > max_intervals)
          throw RecordTooLarge("the pieces of rank " + std::to_string(locals.first_rank[li]) +
                               " and the ranks before it cut the logical tensors into more than " +
                               std::to_string(max_intervals) + " runs of contiguous elements");
        c.push_back(lo);
        c.push_back(hi);
        if (bits != 0) runs.push_back({li, param.tensor, piece.child, bits, lo, hi});
      });
    }

  Atoms atoms;
  std::vector<std::int64_t> first_atom(tensors);
  for (std::size_t t = 0; t < tensors; ++t) {
    std::vector<std::int64_t>& c = cuts[t];
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    first_atom[t] = atoms.count;
    for (std::size_t k = 0; k + 1 < c.size(); ++k) {
      atoms.size.push_back((c[k + 1] - c[k]) * folds[t].repeat);
      atoms.tensor_of.push_back(static_cast<int>(t));
    }
    atoms.count += static_cast<std::int64_t>(c.size()) - 1;
  }
  atoms.ranges.resize(locals.distinct.size());
  for (const Run& r : runs) {
    const std::vector<std::int64_t>& c = cuts[static_cast<std::size_t>(r.tensor)];
    const auto at = [&](std::int64_t x) {
      return first_atom[static_cast<std::size_t>(r.tensor)] + (std::lower_bound(c.begin(), c.end(), x) - c.begin());
    };
    atoms.ranges[r.local].push_back({at(r.lo), at(r.hi), r.child, r.ledgers});
  }
  return atoms;
}

// One child's reduction over one group: per checked ledger and atom, how often the members
// counted it; the kept sums of squares and zero counts where the record has statistics.
struct GroupSum {
  std::vector<int> counts;  // [checked ledger * atoms + atom]
  CompensatedSum squares;
  std::int64_t zeros = 0;
};

// Per tensor and ledger, the count of one class of ranks, when it is wrong.
struct ClassMiscount {
  std::int64_t counted = 0;
  int least = 0, most = 0;
};

class LedgerCounter {
 public:
  LedgerCounter(const record::RunRecord& run, std::int64_t max_intervals)
      : run_(run), locals_(distinct_locals(run)), atoms_(cut_atoms(run, locals_, max_intervals)) {
    for (int g = 0; g < static_cast<int>(run.norm_groups.size()); ++g)
      if (run.norm_groups[static_cast<std::size_t>(g)].counted) checked_.push_back(g);
    if (run.zero_count_reported) checked_.push_back(zero_count_ledger(run));
    has_statistics_ = true;
    for (const record::LocalRecord* local : locals_.distinct)
      for (const record::Piece& piece : local->pieces) has_statistics_ = has_statistics_ && piece.stats;
  }

  LedgerResult count() {
    LedgerResult result;
    result.has_statistics = has_statistics_;
    // Ranks whose children reduce over identically composed groups share one judgement.
    std::map<std::vector<const GroupSum*>, std::vector<int>> classes;
    std::vector<const GroupSum*> sums;  // one rank's, copied only into a new class
    for (const record::RankRecord& rank : run_.ranks) {
      sums.clear();
      for (int c = 0; c < static_cast<int>(rank.children.size()); ++c)
        sums.push_back(&group_sum(c, rank.children[static_cast<std::size_t>(c)].stats_group));
      if (has_statistics_) {
        CompensatedSum squares;
        std::int64_t zeros = 0;
        for (const GroupSum* s : sums) {
          squares.merge(s->squares);
          zeros += s->zeros;
        }
        result.implied_norm.push_back(std::sqrt(squares.value()));
        result.implied_zeros.push_back(zeros);
      }
      auto found = classes.find(sums);
      if (found == classes.end()) found = classes.emplace(sums, std::vector<int>{}).first;
      found->second.push_back(rank.rank);
    }

    // tensor -> ledger -> (rank, its count) of every wrong rank, and the count of the class
    // holding the lowest of them (classes come in no rank order)
    struct Wrong {
      std::vector<std::pair<int, std::int64_t>> ranks;
      ClassMiscount shown;
      int shown_rank = std::numeric_limits<int>::max();
    };
    std::map<int, std::map<int, Wrong>> wrong;
    for (const auto& [sums, ranks] : classes)
      for (const auto& [key, miscount] : judge_class(sums)) {
        Wrong& entry = wrong[key.first][key.second];
        const int lowest = *std::min_element(ranks.begin(), ranks.end());
        if (lowest < entry.shown_rank) {
          entry.shown = miscount;
          entry.shown_rank = lowest;
        }
        for (int rank : ranks) entry.ranks.emplace_back(rank, miscount.counted);
      }
    for (auto& [tensor, by_ledger] : wrong) {
      auto& [ledger, entry] = *by_ledger.begin();  // the first ledger that counts it wrongly
      WrongCount w;
      w.tensor = tensor;
      w.ledger = ledger;
      std::sort(entry.ranks.begin(), entry.ranks.end());
      for (const auto& [rank, counted] : entry.ranks) {
        w.ranks.push_back(rank);
        w.counted_by_rank.push_back(counted);
      }
      w.counted = entry.shown.counted;
      w.least = entry.shown.least;
      w.most = entry.shown.most;
      result.wrong.push_back(std::move(w));
    }
    return result;
  }

 private:
  const GroupSum& group_sum(int child, int group) {
    auto [by_group, fresh] = by_group_.try_emplace({child, group}, nullptr);
    if (!fresh) return *by_group->second;
    // Groups whose members share their local records sum alike: data-parallel replicas.
    const std::vector<int>& members = run_.groups[static_cast<std::size_t>(group)];
    composition_.assign(1, child);  // a scratch key, copied only for a new composition
    for (int member : members) composition_.push_back(locals_.of_rank[static_cast<std::size_t>(member)]);
    auto found = by_composition_.find(composition_);
    if (found == by_composition_.end()) found = by_composition_.emplace(composition_, sum_over(child, composition_)).first;
    const std::unique_ptr<GroupSum>& sum = found->second;
    by_group->second = sum.get();
    return *sum;
  }

  std::unique_ptr<GroupSum> sum_over(int child, const std::vector<int>& composition) {
    auto sum = std::make_unique<GroupSum>();
    const std::size_t atoms = static_cast<std::size_t>(atoms_.count);
    const std::size_t row = atoms + 1;
    difference_.assign(checked_.size() * row, 0);
    for (std::size_t m = 1; m < composition.size(); ++m) {
      const std::size_t li = static_cast<std::size_t>(composition[m]);
      for (const AtomRange& r : atoms_.ranges[li]) {
        if (r.child != child) continue;
        for (std::size_t k = 0; k < checked_.size(); ++k)
          if (r.ledgers & (std::uint32_t{1} << checked_[k])) {
            ++difference_[k * row + static_cast<std::size_t>(r.first)];
            --difference_[k * row + static_cast<std::size_t>(r.last)];
          }
      }
      if (!has_statistics_) continue;
      for (const record::Piece& piece : locals_.distinct[li]->pieces) {
        if (piece.child != child) continue;
        if (piece.counted_in == 0) sum->squares.add(piece.stats->sum_squares);
        if (piece.in_zero_count) sum->zeros += piece.stats->zeros;
      }
    }
    sum->counts.resize(checked_.size() * atoms);
    for (std::size_t k = 0; k < checked_.size(); ++k) {
      int running = 0;
      for (std::size_t a = 0; a < atoms; ++a) sum->counts[k * atoms + a] = running += difference_[k * row + a];
    }
    return sum;
  }

  // The tensors the ledgers of one class of ranks count wrongly, by (tensor, ledger).
  std::map<std::pair<int, int>, ClassMiscount> judge_class(const std::vector<const GroupSum*>& sums) {
    std::map<std::pair<int, int>, ClassMiscount> out;
    const std::size_t atoms = static_cast<std::size_t>(atoms_.count);
    for (std::size_t k = 0; k < checked_.size(); ++k) {
      const int ledger = checked_[k];
      // Per tensor: elements counted, the fewest and most times, and whether any atom is wrong.
      int current = -1;
      ClassMiscount tally;
      bool wrong = false;
      auto close = [&] {
        if (current >= 0 && wrong) out[{current, ledger}] = tally;
      };
      for (std::size_t a = 0; a < atoms; ++a) {
        int times = 0;
        for (const GroupSum* s : sums) times += s->counts[k * atoms + a];
        const int tensor = atoms_.tensor_of[a];
        if (tensor != current) {
          close();
          current = tensor;
          tally = {0, times, times};
          wrong = false;
        }
        tally.counted += times * atoms_.size[a];
        tally.least = std::min(tally.least, times);
        tally.most = std::max(tally.most, times);
        wrong = wrong || times != expected_times(run_, tensor, ledger);
      }
      close();
    }
    return out;
  }

  const record::RunRecord& run_;
  Locals locals_;
  Atoms atoms_;
  std::vector<int> checked_;  // the ledgers judged: counted norm groups, then the zero count
  bool has_statistics_ = false;
  std::map<std::pair<int, int>, GroupSum*> by_group_;
  std::map<std::vector<int>, std::unique_ptr<GroupSum>> by_composition_;
  std::vector<int> composition_;  // group_sum's scratch key
  std::vector<int> difference_;  // sum_over's scratch: [checked ledger * (atoms + 1) + atom]
};

}  // namespace

LedgerResult count_ledgers(const record::RunRecord& run, std::int64_t max_intervals) {
  return LedgerCounter(run, max_intervals).count();
}

}  // namespace tally::oracle
