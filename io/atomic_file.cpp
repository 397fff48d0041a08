#include "io/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace tally::io {

void write_file_atomically(const std::string& file, std::string_view text, std::string_view noun) {
  namespace fs = std::filesystem;
  const fs::path target(file);
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string temp =
      (folder / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()) + ".XXXXXX")).string();
  auto failure = [&](const std::string& step, int code) {
    return std::runtime_error(file + ": cannot write the " + std::string(noun) + " (" + step + ": " +
                              std::strerror(code) + ")");
  };
  const int fd = ::mkostemp(temp.data(), O_CLOEXEC);  // not inherited by a worker another lane starts
  if (fd < 0) throw failure("creating a temporary file in " + folder.string(), errno);
  int code = 0;
  std::string step;
  if (::fchmod(fd, 0644) != 0) {
    code = errno;
    step = "chmod " + temp;
  }
  for (std::size_t written = 0; code == 0 && written < text.size();) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      code = n < 0 ? errno : EIO;
      step = "writing " + temp;
    } else {
      written += static_cast<std::size_t>(n);
    }
  }
  if (code == 0 && ::fsync(fd) != 0) {
    code = errno;
    step = "fsync " + temp;
  }
  if (::close(fd) != 0 && code == 0) {
    code = errno;
    step = "closing " + temp;
  }
  if (code == 0 && ::rename(temp.c_str(), file.c_str()) != 0) {
    code = errno;
    step = "renaming " + temp;
  }
  if (code != 0) {
    ::unlink(temp.c_str());
    throw failure(step, code);
  }
  // Make the rename itself durable (best effort: some file systems refuse fsync on folders).
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

int remove_orphaned_temporaries(const std::string& folder) {
  namespace fs = std::filesystem;
  int removed = 0;
  std::error_code error;
  for (fs::directory_iterator it(folder, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    // ".<name>.tmp.<pid>.XXXXXX"
    const std::size_t tmp = name.rfind(".tmp.");
    if (!name.starts_with(".") || tmp == std::string::npos) continue;
    const std::string rest = name.substr(tmp + 5);
    const std::size_t dot = rest.find('.');
    if (dot == std::string::npos || dot == 0 || rest.size() - dot - 1 != 6) continue;
    const std::string pid_text = rest.substr(0, dot);
    if (pid_text.find_first_not_of("0123456789") != std::string::npos || pid_text.size() > 9) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(pid_text));
    if (pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    std::error_code ignored;
    if (fs::remove(it->path(), ignored)) ++removed;
  }
  return removed;
}

}  // namespace tally::io
