// A worker's log: its ranks' output (stdout and stderr, appended to `worker.log`), which a thread of
// tally keeps within a bound however much the worker prints. Past it, the log keeps its start (where
// the first error of a failed start is), one line saying about how much was left out, and the
// newest output. The worker writes the file itself, so what it prints after tally is gone (why it
// ended) is still there.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <filesystem>
#include <mutex>
#include <thread>

namespace tally::run {

class WorkerLog {
 public:
  // What a log keeps once it is past `max_bytes` (looked at every `period_ms`, first one period
  // after it is made): its first
  // `head_bytes` and a quarter of the bound of the newest output.
  struct Bounds {
    std::size_t max_bytes = std::size_t{64} << 20;
    std::size_t head_bytes = std::size_t{1} << 20;
    int period_ms = 10;
  };

  // Creates (truncates) `file`, open for appending. Throws std::runtime_error naming the file.
  WorkerLog(std::filesystem::path file, Bounds bounds);
  explicit WorkerLog(std::filesystem::path file) : WorkerLog(std::move(file), Bounds{}) {}
  ~WorkerLog();
  WorkerLog(const WorkerLog&) = delete;
  WorkerLog& operator=(const WorkerLog&) = delete;

  // The file, open for appending (close-on-exec: a spawn dup2s it to the worker's stdout and
  // stderr, which then append to it whatever tally does to its size).
  int fd() const { return fd_; }
  const std::filesystem::path& file() const { return file_; }
  // Bytes of the worker's output left out so far (about: what it appends while the log is cut is
  // counted with the rest of the cut).
  std::size_t left_out_bytes() const { return left_out_.load(); }

  // What the thread does at each look: cuts the log if it is past its bound.
  void enforce_bound();

 private:
  void watch();
  void keep_head_and_newest(std::size_t size);

  std::filesystem::path file_;
  Bounds bounds_;
  int fd_ = -1;
  std::size_t marker_bytes_ = 0;  // of the line that says what was left out, once there is one
  std::atomic<std::size_t> left_out_{0};
  std::mutex cut_;    // one cut at a time
  std::mutex mutex_;  // guards stop_
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tally::run
