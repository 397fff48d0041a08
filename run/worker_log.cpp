#include "run/worker_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

#include "io/regular_file.h"

namespace tally::run {

namespace {

void write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a full disk: the log is for messages, the worker goes on
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

}  // namespace

WorkerLog::WorkerLog(std::filesystem::path file, Bounds bounds) : file_(std::move(file)), bounds_(bounds) {
  if (bounds_.head_bytes * 2 + 4096 > bounds_.max_bytes || bounds_.period_ms < 1)
    throw std::invalid_argument("WorkerLog: max_bytes must hold the head twice and more, and the period be positive");
  fd_ = ::open(file_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error("cannot create the worker's log " + file_.string() + ": " + std::strerror(errno));
  thread_ = std::thread([this] { watch(); });
}

WorkerLog::~WorkerLog() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  ::close(fd_);
}

void WorkerLog::watch() {
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, std::chrono::milliseconds(bounds_.period_ms), [this] { return stop_; })) {
    lock.unlock();
    enforce_bound();
    lock.lock();
  }
}

void WorkerLog::enforce_bound() {
  std::lock_guard lock(cut_);
  struct stat st {};
  if (::fstat(fd_, &st) == 0 && static_cast<std::size_t>(st.st_size) > bounds_.max_bytes)
    keep_head_and_newest(static_cast<std::size_t>(st.st_size));
}

// The file becomes its head, one line saying how much of the worker's output was left out, and the
// newest quarter of the bound. The worker appends meanwhile: what it appends between the read of
// the newest and the cut is left out with the rest (counted from the size at the cut).
void WorkerLog::keep_head_and_newest(std::size_t size) {
  const std::size_t newest = bounds_.max_bytes / 4;
  std::string tail(newest, '\0');
  tail.resize(io::read_at(fd_, tail.data(), newest, static_cast<off_t>(size - newest)));
  struct stat st {};
  const std::size_t at_cut = ::fstat(fd_, &st) == 0 ? static_cast<std::size_t>(st.st_size) : size;
  if (::ftruncate(fd_, static_cast<off_t>(bounds_.head_bytes)) != 0) return;
  const std::size_t left_out = left_out_.load() + at_cut - bounds_.head_bytes - marker_bytes_ - tail.size();
  std::string text = "\n[tally: about " + std::to_string(left_out) +
                     " bytes of the worker's output left out here; the newest follow]\n";
  marker_bytes_ = text.size();
  text += tail;
  write_all(fd_, text.data(), text.size());  // appended: after anything the worker wrote since the cut
  left_out_ = left_out;  // once the log says so
}

}  // namespace tally::run
