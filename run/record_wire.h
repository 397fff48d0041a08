// A rank's record (record::RankRecord) as bytes, so a process-per-rank backend can gather every
// rank's record on the rank that judges. Groups travel as their rank lists (each process numbers
// its groups on its own); doubles and floats travel as their bits: the decoded record is
// identical.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "record/run_record.h"

namespace tally::run {

// `groups`: the table the record's group indices refer to.
std::string encode_rank_record(const record::RankRecord& rank,
                               const std::vector<std::vector<int>>& groups);
// Interns the record's groups into `groups` and its local record into `locals`. Throws
// std::invalid_argument when `bytes` is not an encoded RankRecord.
record::RankRecord decode_rank_record(std::string_view bytes, record::GroupTable& groups,
                                      record::LocalRecordPool& locals);

}  // namespace tally::run
