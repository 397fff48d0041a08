#include "record/run_record.h"

#include <cstdint>

namespace tally::record {

GroupTable::GroupTable(std::vector<std::vector<int>>& groups) : groups_(groups) {
  for (int i = 0; i < static_cast<int>(groups_.size()); ++i) index_.emplace(groups_[i], i);
}

int GroupTable::intern(const std::vector<int>& ranks) {
  auto [it, fresh] = index_.try_emplace(ranks, static_cast<int>(groups_.size()));
  if (fresh) groups_.push_back(ranks);
  return it->second;
}

namespace {

// A hash of the fields that locate and decide each param and piece (equal records hash alike;
// the pool compares whole records on a hash hit). One multiply-xorshift step per field.
class Hasher {
 public:
  void add(std::int64_t value) {
    hash_ = (hash_ ^ static_cast<std::uint64_t>(value)) * 0x9e3779b97f4a7c15ull;
    hash_ ^= hash_ >> 29;
  }
  std::uint64_t value() const { return hash_; }

 private:
  std::uint64_t hash_ = 0xcbf29ce484222325ull;
};

std::uint64_t hash_of(const LocalParams& params) {
  Hasher h;
  h.add(static_cast<std::int64_t>(params.size()));
  for (const LocalParam& p : params) {
    h.add(p.tensor);
    for (int d = 0; d < p.box.extent.ndim; ++d) h.add(p.box.offset[d]);
  }
  return h.value();
}

// `params` is pooled: its identity stands for its content.
std::uint64_t hash_of(const LocalParams& pooled, const std::vector<Piece>& pieces) {
  Hasher h;
  h.add(static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(pooled.identity())));
  for (const Piece& p : pieces)
    h.add((p.range.begin << 20) ^ (p.range.end << 2) ^ (p.counted_in + 1) ^ (p.in_zero_count ? 1 << 10 : 0) ^
          (static_cast<std::int64_t>(p.rule.basis) << 12) ^ (static_cast<std::int64_t>(p.rule.dedup) << 15));
  return h.value();
}

}  // namespace

LocalParams LocalRecordPool::intern_params(const LocalParams& params) {
  if (auto known = by_identity_.find(params.identity()); known != by_identity_.end()) return known->second;
  std::vector<LocalParams>& same_hash = params_by_hash_[hash_of(params)];
  for (const LocalParams& known : same_hash)
    if (known == params) return known;  // (its identity is not kept: the list may be freed)
  same_hash.push_back(params);
  by_identity_.emplace(params.identity(), params);
  ++param_lists_;
  return params;
}

std::shared_ptr<const LocalRecord> LocalRecordPool::intern(const LocalRecord& record) {
  LocalRecord pooled{intern_params(record.params), {}};
  std::vector<std::shared_ptr<const LocalRecord>>& same_hash = by_hash_[hash_of(pooled.params, record.pieces)];
  for (const std::shared_ptr<const LocalRecord>& known : same_hash)
    if (known->params.identity() == pooled.params.identity() && known->pieces == record.pieces &&
        known->clipped_stats == record.clipped_stats)
      return known;
  pooled.pieces = record.pieces;
  pooled.clipped_stats = record.clipped_stats;
  same_hash.push_back(std::make_shared<const LocalRecord>(std::move(pooled)));
  ++count_;
  return same_hash.back();
}

}  // namespace tally::record
