#include "run/result_wire.h"

#include <cstring>
#include <stdexcept>

namespace tally::run {

namespace {

constexpr std::uint32_t kMagic = 0x54414c59;  // "TALY"

class Writer {
 public:
  template <typename T>
  void put(T value) {
    const char* bytes = reinterpret_cast<const char*>(&value);
    out_.append(bytes, sizeof(T));
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
    if (at_ + sizeof(T) > bytes_.size()) throw std::invalid_argument("truncated rank result");
    T value;
    std::memcpy(&value, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  bool done() const { return at_ == bytes_.size(); }

 private:
  std::string_view bytes_;
  std::size_t at_ = 0;
};

}  // namespace

std::string encode_rank_result(const gradnorm::RankResult& r) {
  Writer w;
  w.put(kMagic);
  w.put<std::int32_t>(r.rank);
  for (double value : {r.norm, r.inf_norm, r.mtp_norm, r.clip_coefficient, r.mtp_clip_coefficient})
    w.put(value);
  w.put<std::int64_t>(r.zeros);
  w.put<std::uint32_t>(static_cast<std::uint32_t>(r.p_norms.size()));
  for (double p : r.p_norms) w.put(p);
  w.put<std::uint32_t>(static_cast<std::uint32_t>(r.children.size()));
  for (const gradnorm::ChildOutcome& c : r.children) {
    w.put<std::uint8_t>(static_cast<std::uint8_t>(c.group.family));
    w.put<std::int32_t>(c.group.index);
    w.put(c.norm);
    w.put(c.clip_coefficient);
  }
  const std::vector<std::int64_t>& ledger = *r.ledger;
  w.put<std::uint64_t>(ledger.size());
  for (std::int64_t count : ledger) w.put(count);
  return w.take();
}

gradnorm::RankResult decode_rank_result(std::string_view bytes) {
  Reader in(bytes);
  if (in.get<std::uint32_t>() != kMagic) throw std::invalid_argument("not a rank result");
  gradnorm::RankResult r;
  r.rank = in.get<std::int32_t>();
  r.norm = in.get<double>();
  r.inf_norm = in.get<double>();
  r.mtp_norm = in.get<double>();
  r.clip_coefficient = in.get<double>();
  r.mtp_clip_coefficient = in.get<double>();
  r.zeros = in.get<std::int64_t>();
  const std::uint32_t p_count = in.get<std::uint32_t>();
  for (std::uint32_t i = 0; i < p_count; ++i) r.p_norms.push_back(in.get<double>());
  const std::uint32_t children = in.get<std::uint32_t>();
  for (std::uint32_t i = 0; i < children; ++i) {
    gradnorm::ChildOutcome c;
    c.group.family = static_cast<topologies::Family>(in.get<std::uint8_t>());
    c.group.index = in.get<std::int32_t>();
    c.norm = in.get<double>();
    c.clip_coefficient = in.get<double>();
    r.children.push_back(c);
  }
  const std::uint64_t size = in.get<std::uint64_t>();
  if (size > bytes.size()) throw std::invalid_argument("truncated rank result");
  auto ledger = std::make_shared<std::vector<std::int64_t>>(size);
  for (std::uint64_t i = 0; i < size; ++i) (*ledger)[i] = in.get<std::int64_t>();
  r.ledger = std::move(ledger);
  if (!in.done()) throw std::invalid_argument("trailing bytes after a rank result");
  return r;
}

}  // namespace tally::run
