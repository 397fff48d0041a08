// The accumulation types and the constants of the documented summation order of the local
// statistics (kernels/local_stats.h, "Determinism contract"): what the oracle's error bound
// (oracle/tolerance.h) reasons about. Types and constants only, no code that sums: the oracle
// includes this header and never the kernels' reductions.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace tally::kernels {

inline constexpr int kStatsLanes = 8;
inline constexpr std::int64_t kStatsChunk = 2048;

enum class Accumulation : std::uint8_t { fp32, fp64 };

inline std::string_view accumulation_name(Accumulation accumulation) {  // "fp32", "fp64"
  return accumulation == Accumulation::fp32 ? "fp32" : "fp64";
}
inline std::optional<Accumulation> accumulation_from_name(std::string_view name) {
  if (name == "fp32") return Accumulation::fp32;
  if (name == "fp64") return Accumulation::fp64;
  return std::nullopt;
}

}  // namespace tally::kernels
