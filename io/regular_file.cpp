#include "io/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tally::io {

namespace {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "folder";
  if (S_ISFIFO(mode)) return "FIFO";
  if (S_ISCHR(mode)) return "character device";
  if (S_ISBLK(mode)) return "block device";
  if (S_ISSOCK(mode)) return "socket";
  return "special file";
}

}  // namespace

RegularFile::RegularFile(const std::string& path) {
  struct stat before {};
  if (::stat(path.c_str(), &before) != 0) {
    problem_ = Problem::cannot_stat;
    error_ = errno;
    return;
  }
  if (!S_ISREG(before.st_mode)) {
    problem_ = Problem::not_regular;
    kind_ = file_kind(before.st_mode);
    return;
  }
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) {
    problem_ = Problem::cannot_open;
    error_ = errno;
    return;
  }
  struct stat after {};
  if (::fstat(fd_, &after) != 0 || !S_ISREG(after.st_mode)) {
    problem_ = Problem::replaced;
    ::close(fd_);
    fd_ = -1;
    return;
  }
  size_ = after.st_size;
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::string RegularFile::why_not() const {
  switch (problem_) {
    case Problem::none: return "";
    case Problem::cannot_stat: return std::string("cannot be read (") + std::strerror(error_) + ")";
    case Problem::not_regular: return "is a " + kind_ + ", not a regular file";
    case Problem::cannot_open: return std::string("cannot be opened (") + std::strerror(error_) + ")";
    case Problem::replaced: return "was replaced by a file that is not a regular one while it was opened";
  }
  return "";
}

std::optional<std::string> RegularFile::read(off_t offset, std::size_t bytes) const {
  std::string out(bytes, '\0');
  std::size_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::pread(fd_, out.data() + got, bytes - got, offset + static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  out.resize(got);
  return out;
}

std::size_t read_at(int fd, char* out, std::size_t size, off_t offset) {
  std::size_t got = 0;
  while (got < size) {
    const ssize_t n = ::pread(fd, out + got, size - got, offset + static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  return got;
}

}  // namespace tally::io
