// A regular file opened for reading, or why not, without ever blocking: a FIFO or a device left in
// a file's place (a worker still writing its queue, a user's mistake) would block a plain open or
// read forever. The type is checked before the open, the open does not block, and the type is
// checked again once open (the file may have been replaced meanwhile). Read by range (pread), so a
// caller can take a bounded window of a large file (the head and tail of a worker's log).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <optional>
#include <string>

namespace tally::io {

class RegularFile {
 public:
  enum class Problem {
    none,
    cannot_stat,  // missing, or its folder unreadable: `error` says why
    not_regular,  // a folder, FIFO, device or socket: `kind` names it
    cannot_open,  // `error` says why
    replaced,     // it was no regular file once opened
  };

  explicit RegularFile(const std::string& path);
  ~RegularFile();
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  bool is_open() const { return fd_ >= 0; }
  Problem problem() const { return problem_; }
  // "folder", "FIFO", "character device", "block device", "socket", "special file" (not_regular).
  const std::string& kind() const { return kind_; }
  // The problem as the end of a sentence that begins with the file's name: "is a FIFO, not a
  // regular file", "cannot be opened (Permission denied)".
  std::string why_not() const;
  // The size once opened.
  off_t size() const { return size_; }

  // Up to `bytes` bytes from `offset` (fewer at the end of the file); nullopt on a read error.
  std::optional<std::string> read(off_t offset, std::size_t bytes) const;

 private:
  int fd_ = -1;
  off_t size_ = 0;
  Problem problem_ = Problem::none;
  std::string kind_;
  int error_ = 0;
};

// Up to `size` bytes of `fd` from `offset` into `out`, retried across interruptions; returns how
// many were read (fewer at the end of the file or on an error).
std::size_t read_at(int fd, char* out, std::size_t size, off_t offset);

}  // namespace tally::io
