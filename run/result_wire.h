// A gradnorm::RankResult as bytes, so a process-per-rank backend can gather every rank's result on the
// rank that judges. Doubles travel as their bits: the decoded result is identical.
#pragma once

#include <string>
#include <string_view>

#include "gradnorm/path.h"

namespace tally::run {

std::string encode_rank_result(const gradnorm::RankResult& result);
// Throws std::invalid_argument when `bytes` is not an encoded gradnorm::RankResult.
gradnorm::RankResult decode_rank_result(std::string_view bytes);

}  // namespace tally::run
