#include "record/run_record.h"

#include <type_traits>

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

// FNV-1a over the fields that decide equality (the statistics by their bits).
class Hasher {
 public:
  template <typename T>
  void add(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* bytes = reinterpret_cast<const unsigned char*>(&value);
    for (std::size_t i = 0; i < sizeof(T); ++i) hash_ = (hash_ ^ bytes[i]) * 0x100000001b3ull;
  }
  void add(const Attributes& a) {
    add(a.tensor_model_parallel), add(a.partition_dim), add(a.allreduce), add(a.shared);
  }
  void add(const std::optional<GradStats>& s) {
    add(s.has_value());
    if (s) add(s->sum_squares), add(s->abs_max), add(s->zeros);
  }
  std::uint64_t value() const { return hash_; }

 private:
  std::uint64_t hash_ = 0xcbf29ce484222325ull;
};

std::uint64_t hash_of(const LocalRecord& record) {
  Hasher h;
  for (const LocalParam& p : record.params) {
    h.add(p.tensor), h.add(p.box.extent.ndim);
    for (int d = 0; d < p.box.extent.ndim; ++d) h.add(p.box.offset[d]), h.add(p.box.extent.size[d]);
    h.add(p.attributes), h.add(p.stats);
  }
  for (const Piece& p : record.pieces) {
    h.add(p.param), h.add(p.child), h.add(p.range.begin), h.add(p.range.end);
    h.add(p.main_attributes), h.add(p.counted_in), h.add(p.in_zero_count);
    h.add(p.rule.basis), h.add(p.rule.dedup), h.add(p.rule.child_norm_discarded), h.add(p.stats);
  }
  return h.value();
}

}  // namespace

std::shared_ptr<const LocalRecord> LocalRecordPool::intern(LocalRecord&& record) {
  std::vector<std::shared_ptr<const LocalRecord>>& same_hash = by_hash_[hash_of(record)];
  for (const std::shared_ptr<const LocalRecord>& known : same_hash)
    if (*known == record) return known;
  same_hash.push_back(std::make_shared<const LocalRecord>(std::move(record)));
  ++count_;
  return same_hash.back();
}

}  // namespace tally::record
