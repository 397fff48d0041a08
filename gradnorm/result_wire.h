// A RankResult as bytes, so a process-per-rank backend can gather every rank's result on the
// rank that judges. Doubles travel as their bits: the decoded result is identical.
#pragma once

#include <string>
#include <string_view>

#include "gradnorm/path.h"

namespace tally::gradnorm {

std::string encode_rank_result(const RankResult& result);
// Throws std::invalid_argument when `bytes` is not an encoded RankResult.
RankResult decode_rank_result(std::string_view bytes);

}  // namespace tally::gradnorm
