#include "run/record_wire.h"

#include <cstring>
#include <stdexcept>
#include <type_traits>

namespace tally::run {

namespace {

constexpr std::uint32_t kMagic = 0x54414c52;  // "TALR"

class Writer {
 public:
  template <typename T>
  void put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const char* bytes = reinterpret_cast<const char*>(&value);
    out_.append(bytes, sizeof(T));
  }
  template <typename T>
  void put(const std::optional<T>& value) {
    put<std::uint8_t>(value.has_value());
    if (value) put(*value);
  }
  template <typename T>
  void put_vector(const std::vector<T>& values) {
    put<std::uint64_t>(values.size());
    for (const T& v : values) put(v);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  template <typename T>
  T get() {
    if (at_ + sizeof(T) > bytes_.size()) throw std::invalid_argument("truncated rank record");
    T value;
    std::memcpy(&value, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  template <typename T>
  std::optional<T> get_optional() {
    if (!get<std::uint8_t>()) return std::nullopt;
    return get<T>();
  }
  // A count of elements of `element_bytes` each that must fit in what is left.
  std::size_t count(std::size_t element_bytes) {
    const std::uint64_t n = get<std::uint64_t>();
    if (n > (bytes_.size() - at_) / std::max<std::size_t>(element_bytes, 1))
      throw std::invalid_argument("truncated rank record");
    return static_cast<std::size_t>(n);
  }
  template <typename T>
  std::vector<T> get_vector() {
    std::vector<T> values(count(sizeof(T)));
    for (T& v : values) v = get<T>();
    return values;
  }
  bool done() const { return at_ == bytes_.size(); }

 private:
  std::string_view bytes_;
  std::size_t at_ = 0;
};

void put_group(Writer& w, int index, const std::vector<std::vector<int>>& groups) {
  if (index < 0) {
    w.put<std::uint8_t>(0);
    return;
  }
  w.put<std::uint8_t>(1);
  w.put_vector(groups[static_cast<std::size_t>(index)]);
}

int get_group(Reader& r, record::GroupTable& groups) {
  if (!r.get<std::uint8_t>()) return -1;
  return groups.intern(r.get_vector<int>());
}

}  // namespace

std::string encode_rank_record(const record::RankRecord& rank,
                               const std::vector<std::vector<int>>& groups) {
  Writer w;
  w.put(kMagic);
  w.put<std::int32_t>(rank.rank);
  put_group(w, rank.tp_group, groups);
  put_group(w, rank.expert_tp_group, groups);
  put_group(w, rank.gtp_group, groups);
  put_group(w, rank.expert_gtp_group, groups);
  const record::LocalRecord& local = *rank.local;
  w.put<std::uint64_t>(local.params.size());
  for (const record::LocalParam& p : local.params) {
    w.put(p.tensor);
    w.put(p.box);
    w.put(p.attributes);
    w.put(p.stats);
  }
  w.put<std::uint64_t>(local.pieces.size());
  for (const record::Piece& p : local.pieces) {
    w.put(p.param);
    w.put(p.child);
    w.put(p.range);
    w.put(p.main_attributes);
    w.put(p.counted_in);
    w.put(p.in_zero_count);
    w.put(p.rule);
    w.put(p.stats);
  }
  w.put<std::uint64_t>(rank.children.size());
  for (const record::ChildRecord& c : rank.children) {
    put_group(w, c.stats_group, groups);
    put_group(w, c.tp_group, groups);
    put_group(w, c.expert_tp_group, groups);
    w.put(c.norm);
    w.put(c.clip);
  }
  const record::Reported& r = rank.reported;
  w.put(r.norm);
  w.put(r.inf_norm);
  w.put(r.zeros);
  w.put(r.clip_coefficient);
  w.put_vector(r.p_norms);
  w.put_vector(r.group_norms);
  w.put<std::uint8_t>(rank.clipped != nullptr);
  if (rank.clipped) {
    w.put<std::uint64_t>(rank.clipped->size());
    for (const record::ClippedParam& c : *rank.clipped) {
      w.put(c.coefficient);
      w.put<std::uint64_t>(c.size);
      w.put<std::uint8_t>(c.data != nullptr);  // null: left as stored
      if (c.data)
        for (float v : c.values()) w.put(v);
    }
  }
  return w.take();
}

record::RankRecord decode_rank_record(std::string_view bytes, record::GroupTable& groups,
                                      record::LocalRecordPool& locals) {
  Reader in(bytes);
  if (in.get<std::uint32_t>() != kMagic) throw std::invalid_argument("not a rank record");
  record::RankRecord rank;
  rank.rank = in.get<std::int32_t>();
  rank.tp_group = get_group(in, groups);
  rank.expert_tp_group = get_group(in, groups);
  rank.gtp_group = get_group(in, groups);
  rank.expert_gtp_group = get_group(in, groups);
  record::LocalRecord local;
  std::vector<record::LocalParam> params(in.count(sizeof(record::LocalParam::tensor)));
  for (record::LocalParam& p : params) {
    p.tensor = in.get<int>();
    p.box = in.get<record::Box>();
    p.attributes = in.get<record::Attributes>();
    p.stats = in.get_optional<record::GradStats>();
  }
  local.params = std::move(params);
  local.pieces.resize(in.count(sizeof(record::Piece::param)));
  for (record::Piece& p : local.pieces) {
    p.param = in.get<int>();
    p.child = in.get<int>();
    p.range = in.get<record::ElementRange>();
    p.main_attributes = in.get<record::Attributes>();
    p.counted_in = in.get<int>();
    p.in_zero_count = in.get<bool>();
    p.rule = in.get<record::Rule>();
    p.stats = in.get_optional<record::GradStats>();
  }
  rank.local = locals.intern(std::move(local));
  rank.children.resize(in.count(1));
  for (record::ChildRecord& c : rank.children) {
    c.stats_group = get_group(in, groups);
    c.tp_group = get_group(in, groups);
    c.expert_tp_group = get_group(in, groups);
    c.norm = in.get_optional<double>();
    c.clip = in.get_optional<record::Clip>();
  }
  record::Reported& r = rank.reported;
  r.norm = in.get_optional<double>();
  r.inf_norm = in.get_optional<double>();
  r.zeros = in.get_optional<std::int64_t>();
  r.clip_coefficient = in.get_optional<double>();
  r.p_norms = in.get_vector<double>();
  r.group_norms = in.get_vector<record::GroupNorm>();
  if (in.get<std::uint8_t>()) {
    auto clipped = std::make_shared<record::ClippedValues>(in.count(sizeof(double)));
    for (record::ClippedParam& c : *clipped) {
      c.coefficient = in.get<double>();
      c.size = static_cast<std::size_t>(in.get<std::uint64_t>());
      if (!in.get<std::uint8_t>()) continue;
      if (c.size > bytes.size() / sizeof(float)) throw std::invalid_argument("truncated rank record");
      auto values = std::make_shared<std::vector<float>>(c.size);
      for (float& v : *values) v = in.get<float>();
      c.data = std::shared_ptr<const float>(values, values->data());
    }
    rank.clipped = std::move(clipped);
  }
  if (!in.done()) throw std::invalid_argument("trailing bytes after a rank record");
  return rank;
}

}  // namespace tally::run
