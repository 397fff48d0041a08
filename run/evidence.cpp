#include "run/evidence.h"

#include <stdexcept>
#include <system_error>

#include "io/atomic_file.h"
#include "io/json_read.h"
#include "manifest/manifest_json.h"

namespace tally::run {

namespace fs = std::filesystem;

namespace {

const char* kind_of(fs::file_type type) {
  switch (type) {
    case fs::file_type::symlink: return "a symbolic link";
    case fs::file_type::fifo: return "a FIFO";
    case fs::file_type::character: return "a character device";
    case fs::file_type::block: return "a block device";
    case fs::file_type::socket: return "a socket";
    default: return "not a regular file or folder";
  }
}

// The largest file copied: groups.json's bound, the larger of a manifest folder's two.
constexpr std::size_t kMaxEvidenceFileBytes = manifest::kMaxGroupsBytes;
// How deep a worker's folder is followed (a manifest folder is flat).
constexpr int kMaxDepth = 8;

void make_folder(const fs::path& to) {
  std::error_code error;
  fs::create_directories(to, error);
  if (error) throw std::runtime_error("cannot create " + to.string() + ": " + error.message());
}

void copy_folder(const fs::path& from, const fs::path& to, const std::string& prefix, int depth,
                 EvidenceCopy& copy) {
  make_folder(to);
  std::error_code error;
  fs::directory_iterator it(from, error), end;
  for (; !error && it != end; it.increment(error)) {
    const fs::path source = it->path();
    const std::string name = prefix + source.filename().string();
    std::error_code status_error;
    const fs::file_type type = fs::symlink_status(source, status_error).type();
    if (status_error) {
      copy.left_out.push_back(name + ": cannot be examined (" + status_error.message() + ")");
    } else if (type == fs::file_type::directory) {
      if (depth >= kMaxDepth) copy.left_out.push_back(name + ": a folder deeper than " + std::to_string(kMaxDepth));
      else copy_folder(source, to / source.filename(), name + "/", depth + 1, copy);
    } else if (type != fs::file_type::regular) {
      copy.left_out.push_back(name + ": " + kind_of(type) + ", not copied");
    } else {
      std::string bytes;
      try {
        bytes = io::read_bounded_file(source.string(), kMaxEvidenceFileBytes, "file of a run's manifests");
      } catch (const std::exception& e) {
        copy.left_out.push_back(name + ": not copied (" + e.what() + ")");
        continue;
      }
      io::write_file_atomically((to / source.filename()).string(), bytes, "copy of a run's manifest file");
    }
  }
  if (error) copy.left_out.push_back((prefix.empty() ? from.string() : prefix) + ": cannot be listed (" + error.message() + ")");
}

}  // namespace

EvidenceCopy copy_evidence(const fs::path& from, const fs::path& to) {
  std::error_code error;
  fs::remove_all(to, error);
  if (error) throw std::runtime_error("cannot replace " + to.string() + ": " + error.message());
  return copy_evidence_into(from, to);
}

std::optional<std::string> not_plain_evidence(const fs::path& dir) {
  std::error_code error;
  fs::recursive_directory_iterator it(dir, error), end;
  for (int seen = 0; !error && it != end; it.increment(error)) {
    if (it.depth() >= kMaxDepth || ++seen > 4096) return dir.string() + ": deeper or larger than a run's manifests";
    std::error_code status_error;
    const fs::file_type type = fs::symlink_status(it->path(), status_error).type();
    if (status_error) return it->path().string() + ": cannot be examined (" + status_error.message() + ")";
    if (type != fs::file_type::regular && type != fs::file_type::directory)
      return it->path().string() + " is " + kind_of(type) +
             ": a run's manifests are regular files, kept as they are with its case (a copy follows no link)";
  }
  if (error) return dir.string() + ": cannot be listed (" + error.message() + ")";
  return std::nullopt;
}

EvidenceCopy copy_evidence_into(const fs::path& from, const fs::path& to) {
  EvidenceCopy copy;
  std::error_code error;
  const fs::file_type type = fs::symlink_status(from, error).type();
  if (type == fs::file_type::directory) {
    copy_folder(from, to, "", 0, copy);
  } else {
    make_folder(to);
    copy.left_out.push_back(from.string() + ": " +
                            (type == fs::file_type::not_found ? std::string("missing") : std::string(kind_of(type))) +
                            " (the worker left no folder of manifests)");
  }
  if (!copy.left_out.empty()) {
    std::string text = "What the worker left in " + from.string() + " that was not copied here:\n";
    for (const std::string& line : copy.left_out) text += "  " + io::escape_controls(line) + "\n";
    io::write_file_atomically((to / kNotCopiedFile).string(), text, "list of what a copy left out");
  }
  return copy;
}

}  // namespace tally::run
