// A real run's evidence kept with its case file: the manifests folder a worker left, copied next to
// the saved case (`<case>.manifests/`), so `tally replay` judges it where the framework is absent.
// What a worker left is not trusted: only regular files and folders are copied, never followed
// links, FIFOs, devices or sockets (which would block a reader or copy a device), and each file
// at most a manifest's size. What is left out is listed in the copy (`NOT-COPIED.txt`) and
// returned, so a run whose manifests could not be read is still saved with what it left; only a
// copy that cannot be written fails.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace tally::run {

// What a copy left out, one line each ("rank-1.json: a FIFO, not a regular file").
struct EvidenceCopy {
  std::vector<std::string> left_out;
};

// The name of the file in a copy that lists what it left out.
inline constexpr const char* kNotCopiedFile = "NOT-COPIED.txt";

// Copies the folder `from` (a worker's case-<K>/) into `to`, replacing what `to` held. Throws
// std::runtime_error naming `to` when it cannot be written; nothing about `from` throws.
EvidenceCopy copy_evidence(const std::filesystem::path& from, const std::filesystem::path& to);

// The same into a folder the user named (`tally run --manifests DIR`): `to` is created where it is
// missing and its files of the same names replaced; nothing else in it is removed.
EvidenceCopy copy_evidence_into(const std::filesystem::path& from, const std::filesystem::path& to);

// Why the folder `dir` a worker left is not plain evidence: the first entry that is not a regular
// file or a folder (a symbolic link, which a reader would follow but a copy does not keep; a FIFO;
// a device), or nullopt. A run judged from such a folder could not be judged again from its copy.
std::optional<std::string> not_plain_evidence(const std::filesystem::path& dir);

}  // namespace tally::run
