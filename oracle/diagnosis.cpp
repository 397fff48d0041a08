#include "oracle/diagnosis.h"

#include <algorithm>
#include <optional>
#include <set>

namespace tally::oracle {

namespace {

std::string ranks_text(const std::vector<int>& ranks) {
  return record::rank_list_text(ranks, static_cast<std::int64_t>(ranks.size()), kMaxListedRanks);
}

// "[0,1] (rank 1 there)": a group and the holder's index in it.
std::string group_role(const std::vector<int>& group, int rank) {
  const auto at = std::find(group.begin(), group.end(), rank);
  const std::string position =
      at == group.end() ? "not in it" : "rank " + std::to_string(at - group.begin()) + " there";
  return ranks_text(group) + " (" + position + ")";
}

// The group a replicated piece's filter de-duplicated on (an index into RunRecord::groups; -1:
// its optimizer gave none).
int dedup_group(const record::RankRecord& rank, const record::Piece& piece) {
  const record::ChildRecord& child = rank.children[static_cast<std::size_t>(piece.child)];
  switch (piece.rule.dedup) {
    case record::DedupGroup::global_tp: return rank.tp_group;
    case record::DedupGroup::expert_tp: return child.expert_tp_group;
    case record::DedupGroup::tp: return child.tp_group;
  }
  return -1;
}

// The replicated piece's group: which one the filter de-duplicated on, and how it got it.
std::string replicated_text(const record::RunRecord& run, const record::RankRecord& rank,
                            const record::Piece& piece) {
  static const std::vector<int> kNone;
  auto group = [&](int index) -> const std::vector<int>& {
    return index < 0 ? kNone : run.groups[static_cast<std::size_t>(index)];
  };
  const record::ChildRecord& child = rank.children[static_cast<std::size_t>(piece.child)];
  const std::vector<int>& tp = group(rank.tp_group);
  const std::vector<int>& expert_tp = group(rank.expert_tp_group);
  const bool expert = !piece.main_attributes.allreduce;
  const std::string not_expert_tp = ", not its expert-TP group " + ranks_text(expert_tp);
  const std::vector<int>& used = group(dedup_group(rank, piece));
  switch (piece.rule.dedup) {
    case record::DedupGroup::global_tp:
      return std::string(expert ? "" : "replicated; ") +
             "no TP group given: fell back to the global TP rank, TP group " +
             group_role(tp, rank.rank) + (expert && tp != expert_tp ? not_expert_tp : "");
    case record::DedupGroup::expert_tp: {
      if (!expert)
        return "replicated, de-duplicated on the expert-TP group " + group_role(used, rank.rank) +
               (used != tp ? ", not its TP group " + ranks_text(tp) : "");
      if (used == expert_tp) return "replicated expert param, expert-TP group " + group_role(used, rank.rank);
      return "expert-topology param de-duplicated on " + std::string(used == tp ? "a TP group " : "") +
             group_role(used, rank.rank) + not_expert_tp;
    }
    case record::DedupGroup::tp: {
      if (!expert) {
        if (used == tp) return "replicated, TP group " + group_role(used, rank.rank);
        return "replicated, de-duplicated on " + group_role(used, rank.rank) + ", not its TP group " +
               ranks_text(tp);
      }
      const std::string on = child.expert_tp_group < 0 ? "no expert-TP group: fell back to the TP group "
                                                       : "expert-topology param de-duplicated on a TP group ";
      return on + group_role(used, rank.rank) + (used != expert_tp ? not_expert_tp : "");
    }
  }
  return "?";
}

// The group of megatron-core 0.19's GTP duplicate test for a piece; -1 where none applies or
// the record lacks it.
int gtp_dedup_group(const record::RankRecord& rank, const record::Piece& piece) {
  switch (piece.rule.gtp_dedup) {
    case record::GtpDedup::none: return -1;
    case record::GtpDedup::gtp: return rank.gtp_group;
    case record::GtpDedup::expert_gtp: return rank.expert_gtp_group;
  }
  return -1;
}

bool first_of(const record::RunRecord& run, int group, int rank) {
  const std::vector<int>& ranks = run.groups[static_cast<std::size_t>(group)];
  return !ranks.empty() && ranks.front() == rank;
}

// Whether the rule recorded for a piece keeps it (before any norm is discarded); nullopt where
// a group it names is missing from the record.
std::optional<bool> rule_keeps(const record::RunRecord& run, const record::RankRecord& rank,
                               const record::Piece& piece) {
  if (piece.rule.basis == record::Basis::shared_copy) return false;
  if (piece.rule.basis == record::Basis::no_filter) return true;
  if (piece.rule.gtp_dedup != record::GtpDedup::none) {
    const int gtp = gtp_dedup_group(rank, piece);
    if (gtp < 0) return std::nullopt;
    if (!first_of(run, gtp, rank.rank)) return false;
  }
  if (piece.rule.basis == record::Basis::tensor_parallel_shard) return true;
  const int group = dedup_group(rank, piece);
  if (group < 0) return std::nullopt;
  return first_of(run, group, rank.rank);
}

// What one rank does with one tensor.
struct Holding {
  std::int64_t held = 0, owned = 0, counted = 0;
  bool shared_copy = false;
  std::string rule;  // the rules of its pieces, each once, "; "-separated
};

Holding holding(const record::RunRecord& run, const record::RankRecord& rank, int tensor, int ledger) {
  Holding h;
  const record::LocalRecord& local = *rank.local;
  for (const record::LocalParam& p : local.params)
    if (p.tensor == tensor) {
      h.held += p.box.numel();
      h.shared_copy = h.shared_copy || p.attributes.shared;
    }
  for (const record::Piece& piece : local.pieces) {
    if (local.params[static_cast<std::size_t>(piece.param)].tensor != tensor) continue;
    h.owned += piece.range.size();
    if (counts_in(piece, ledger, run)) h.counted += piece.range.size();
    const std::string why = rule_text(run, rank, piece, ledger);
    if (h.rule.find(why) == std::string::npos) h.rule += (h.rule.empty() ? "" : "; ") + why;
  }
  return h;
}

bool owns_in_child(const record::LocalRecord& local, int tensor, int child) {
  for (const record::Piece& piece : local.pieces)
    if (piece.child == child && local.params[static_cast<std::size_t>(piece.param)].tensor == tensor)
      return true;
  return false;
}

std::string ledger_text(const record::RunRecord& run, int ledger) {
  if (ledger == zero_count_ledger(run)) return "; in the zero count";
  if (ledger == 0) return "";
  return "; in the '" + run.norm_groups[static_cast<std::size_t>(ledger)].name + "' norm";
}

}  // namespace

std::string rule_text(const record::RunRecord& run, const record::RankRecord& rank,
                      const record::Piece& piece, int ledger) {
  const record::LocalParam& param = rank.local->params[static_cast<std::size_t>(piece.param)];
  std::string why;
  if (!param.attributes.allreduce && piece.main_attributes.allreduce)
    why = "the main copy lost allreduce=False (treated as dense); ";
  if (param.attributes.shared && !piece.main_attributes.shared)
    why += "the main copy lost shared=True (a duplicate counted as the tensor); ";
  switch (piece.rule.basis) {
    case record::Basis::shared_copy: why += "a shared copy"; break;
    case record::Basis::no_filter: why += "no duplicate filter"; break;
    case record::Basis::tensor_parallel_shard: why += "a tensor_model_parallel shard"; break;
    case record::Basis::replicated: why += replicated_text(run, rank, piece); break;
  }
  if (param.attributes.gtp_weight_remat) why += ", a GTP shard (is_gtp_weight_remat)";
  if (const int gtp = gtp_dedup_group(rank, piece); gtp >= 0)
    why += std::string(", not a GTP shard: ") +
           (piece.rule.gtp_dedup == record::GtpDedup::expert_gtp ? "expert " : "") + "GTP group " +
           group_role(run.groups[static_cast<std::size_t>(gtp)], rank.rank);
  const record::Tensor& tensor = run.tensors[static_cast<std::size_t>(param.tensor)];
  if (tensor.norm_group != 0)
    why += ", in grad_norm_group '" + run.norm_groups[static_cast<std::size_t>(tensor.norm_group)].name + "'";
  if (piece.rule.child_norm_discarded) why += "; its optimizer's norm was computed, then discarded";
  const bool counted = counts_in(piece, ledger, run);
  // A run's own decision can contradict its rule (a manifest's kept and kept_zeros are reported,
  // not derived): say so rather than let the rule seem to explain it.
  if (const std::optional<bool> keeps = rule_keeps(run, rank, piece)) {
    const bool expected = ledger == zero_count_ledger(run)
                              ? *keeps
                              : *keeps && !piece.rule.child_norm_discarded && tensor.norm_group == ledger;
    if (counted != expected)
      return why + (counted ? ": kept, though that rule drops it" : ": dropped, though that rule keeps it");
  }
  return why + (counted ? ": kept" : ": dropped");
}

namespace {

// The ranks of the stats groups in which rank `observer` reduces `tensor`: those of its children
// whose group has a member owning a piece of it in that child.
std::set<int> stats_group_members(const record::RunRecord& run, const record::RankRecord& observer, int tensor) {
  std::set<int> members;
  for (std::size_t c = 0; c < observer.children.size(); ++c) {
    const std::vector<int>& group = run.groups[static_cast<std::size_t>(observer.children[c].stats_group)];
    const bool holds = std::any_of(group.begin(), group.end(), [&](int member) {
      return owns_in_child(*run.ranks[static_cast<std::size_t>(member)].local, tensor, static_cast<int>(c));
    });
    if (holds) members.insert(group.begin(), group.end());
  }
  return members;
}

bool owns_a_piece(const record::LocalRecord& local, int tensor) {
  return std::any_of(local.pieces.begin(), local.pieces.end(), [&](const record::Piece& piece) {
    return local.params[static_cast<std::size_t>(piece.param)].tensor == tensor;
  });
}

}  // namespace

Miscount miscount_of(const record::RunRecord& run, const WrongCount& wrong) {
  const record::Tensor& tensor = run.tensors[static_cast<std::size_t>(wrong.tensor)];
  Miscount m;
  m.param = wrong.tensor;
  m.name = tensor.name;
  m.param_class = tensor.kind + ledger_text(run, wrong.ledger);
  m.kind = tensor.kind;
  m.ledger = wrong.ledger == zero_count_ledger(run) ? "zero count"
             : wrong.ledger == 0                    ? ""
                                                    : run.norm_groups[static_cast<std::size_t>(wrong.ledger)].name;
  m.least = wrong.least;
  m.most = wrong.most;
  {
    const std::set<int> members =
        stats_group_members(run, run.ranks[static_cast<std::size_t>(wrong.ranks.front())], wrong.tensor);
    m.owned_outside = std::any_of(run.ranks.begin(), run.ranks.end(), [&](const record::RankRecord& rank) {
      return !members.count(rank.rank) && owns_a_piece(*rank.local, wrong.tensor);
    });
  }
  if (wrong.least != wrong.most)  // a total can look right while elements are not
    m.param_class += "; its elements counted from " + std::to_string(wrong.least) + " to " +
                     std::to_string(wrong.most) + " times";
  m.numel = tensor.shape.numel();
  m.expected = expected_times(run, wrong.tensor, wrong.ledger) * m.numel;
  m.counted = wrong.counted;
  m.observed_on = wrong.ranks.front();
  m.wrong_rank_count = static_cast<std::int64_t>(wrong.ranks.size());
  const auto listed = static_cast<std::ptrdiff_t>(std::min(wrong.ranks.size(), kMaxListedRanks));
  m.wrong_ranks.assign(wrong.ranks.begin(), wrong.ranks.begin() + listed);
  m.wrong_counted.assign(wrong.counted_by_rank.begin(), wrong.counted_by_rank.begin() + listed);
  return m;
}

void diagnose(const record::RunRecord& run, int ledger, Miscount& m) {
  const int tensor = m.param;
  const record::RankRecord& observer = run.ranks[static_cast<std::size_t>(m.observed_on)];
  std::set<int> members;
  for (std::size_t c = 0; c < observer.children.size(); ++c) {
    const std::vector<int>& group = run.groups[static_cast<std::size_t>(observer.children[c].stats_group)];
    const bool holds = std::any_of(group.begin(), group.end(), [&](int member) {
      return owns_in_child(*run.ranks[static_cast<std::size_t>(member)].local, tensor, static_cast<int>(c));
    });
    if (!holds) continue;
    m.stats_group += (m.stats_group.empty() ? "" : "; ") + std::string("stats group ") +
                     ranks_text(group) + " of " + run.children[c];
    members.insert(group.begin(), group.end());
  }
  if (m.stats_group.empty()) m.stats_group = "stats groups, where no optimizer holds it";
  std::vector<int> outside;
  for (const record::RankRecord& rank : run.ranks) {
    const Holding h = holding(run, rank, tensor, ledger);
    if (h.held == 0 && h.owned == 0) continue;
    if (!members.count(rank.rank)) {
      if (h.owned > 0) outside.push_back(rank.rank);
      continue;
    }
    if (m.contributions.size() >= kMaxContributions) continue;
    Contribution k;
    k.rank = rank.rank;
    k.held = h.held;
    k.owned = h.owned;
    k.counted = h.counted;
    k.shared_copy = h.shared_copy;
    k.rule = h.rule.empty() ? "holds it, but none of its optimizers owns a piece (another rank's does, or none)"
                            : h.rule;
    m.contributions.push_back(std::move(k));
  }
  if (!outside.empty()) m.stats_group += "; owned outside it by ranks " + ranks_text(outside);
}

}  // namespace tally::oracle
