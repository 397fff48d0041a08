// Manifests as JSON (docs/manifest.md): strict reading (an unknown key, a wrong type, a value out
// of range is an error naming the file, the field path and the rule), canonical writing, and
// the folder of one run (rank-<R>.json per rank).
#pragma once

#include <cstddef>
#include <functional>
#include <mutex>
#include <optional>
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

// The groups rank files refer to while a run is read. Version 2: fixed, read from groups.json
// before any rank file. Version 1: grown from each rank file's lists (interned, so every list is
// held once). Safe to share between reading threads.
class RunGroups {
 public:
  RunGroups() : grown_(std::in_place, table_) {}           // version 1
  explicit RunGroups(std::vector<std::vector<int>> table);  // version 2
  int version() const { return fixed_ ? 2 : 1; }
  // Version 1: the id of a sorted rank list, added when new.
  GroupId intern(const std::vector<int>& ranks);
  // Version 2 (read-only, so without a lock): the table.
  const std::vector<std::vector<int>>& table() const { return table_; }
  std::vector<std::vector<int>> take() { return std::move(table_); }

 private:
  bool fixed_ = false;
  std::mutex mutex_;
  std::vector<std::vector<int>> table_;
  std::optional<record::GroupTable> grown_;  // version 1: interns into table_
};

// A rank's file in `version` (1: every group written out as its rank list; 2: ids into the
// run's groups.json). `groups` is the run's table the manifest's ids index.
nlohmann::ordered_json manifest_to_json(const RankManifest& m, const std::vector<std::vector<int>>& groups,
                                        int version = kManifestVersion);
// 2-space indented JSON and a final newline.
std::string manifest_to_text(const RankManifest& m, const std::vector<std::vector<int>>& groups,
                             int version = kManifestVersion);
// Reads every field strictly; checks only what one file can say about itself (indices and
// ranges in bounds, boxes inside the logical shape, each group holding the file's own rank).
// The file's version must be `groups`' (a version 1 file's lists are interned into it).
// Messages start with `source`.
RankManifest manifest_from_json(const nlohmann::json& json, std::string_view source, RunGroups& groups);
RankManifest manifest_from_text(std::string_view text, std::string_view source, RunGroups& groups);

// groups.json of a version 2 run: {"tally_groups": 2, "world": W, "groups": [[ranks], ...]}.
inline constexpr const char* kGroupsFileName = "groups.json";
inline constexpr std::size_t kMaxGroupsBytes = std::size_t{512} << 20;
std::string groups_to_text(int world, const std::vector<std::vector<int>>& groups);
// Each list sorted, without repeats, in [0, world), non-empty; no list twice. Returns the world.
int groups_from_text(std::string_view text, std::string_view source, std::vector<std::vector<int>>& groups);

// "rank-7.json".
std::string manifest_file_name(int rank);

// The bytes of a file of a run's folder, by its path; throws ManifestError when it cannot.
using FileBytes = std::function<std::string(const std::string& path)>;
// The manifests among the files `paths` of `folder` (those named rank-<R>.json, and groups.json;
// others ignored and never read), in rank order, each read with `bytes_of` and strictly, holding
// the rank its name says, on up to `threads` threads (0: one per core). A folder with
// groups.json is a version 2 run, else version 1. Throws ManifestError, naming `folder` when no
// file is a manifest; where several files are bad, the first in rank order is named.
RunManifests read_run(const std::vector<std::string>& paths, const FileBytes& bytes_of,
                      const std::string& folder, unsigned threads = 0);
// Every manifest of `dir`, as read_run reads them. Throws ManifestError when the folder cannot
// be read or holds no manifest.
RunManifests load_run(const std::string& dir, unsigned threads = 0);
// Writes rank-<R>.json for each manifest (and, for version 2, groups.json), each atomically;
// creates `dir` when missing.
void write_run(const std::string& dir, const RunManifests& run, int version = kManifestVersion);

}  // namespace tally::manifest
