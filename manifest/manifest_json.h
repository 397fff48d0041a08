// Manifests as JSON (docs/manifest.md): strict reading (an unknown key, a wrong type, a value out
// of range is an error naming the file, the field path and the rule), canonical writing, and
// the folder of one run (rank-<R>.json per rank).
#pragma once

#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "manifest/manifest.h"

namespace tally::manifest {

// The largest manifest file read (a rank of a real model with ~10^5 params fits).
inline constexpr std::size_t kMaxManifestBytes = std::size_t{64} << 20;

// Bad input: one line naming the file (when there is one), the field and the rule. Exit 2.
class ManifestError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

nlohmann::ordered_json manifest_to_json(const RankManifest& m);
// 2-space indented JSON and a final newline.
std::string manifest_to_text(const RankManifest& m);
// Reads every field strictly; checks only what one file can say about itself (indices and
// ranges in bounds, boxes inside the logical shape). Messages start with `source`.
RankManifest manifest_from_json(const nlohmann::json& json, std::string_view source);
RankManifest manifest_from_text(std::string_view text, std::string_view source);

// "rank-7.json".
std::string manifest_file_name(int rank);

// The bytes of a file of a run's folder, by its path; throws ManifestError when it cannot.
using FileBytes = std::function<std::string(const std::string& path)>;
// The manifests among the files `paths` of `folder` (those named rank-<R>.json, others ignored
// and never read), in rank order, each read with `bytes_of` one at a time and strictly, holding
// the rank its name says. Throws ManifestError, naming `folder` when no file is a manifest.
std::vector<RankManifest> read_run(const std::vector<std::string>& paths, const FileBytes& bytes_of,
                                   const std::string& folder);
// Every rank-<R>.json of `dir` (other files ignored), as read_run reads them. Throws
// ManifestError when the folder cannot be read or holds no manifest.
std::vector<RankManifest> load_run(const std::string& dir);
// Writes rank-<R>.json for each manifest, each atomically; creates `dir` when missing.
void write_run(const std::string& dir, const std::vector<RankManifest>& manifests);

}  // namespace tally::manifest
