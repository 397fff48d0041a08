#include "run/framework_worker.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <optional>
#include <string_view>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "io/atomic_file.h"
#include "casefile/case_file.h"
#include "run/target.h"
#include "io/json_read.h"
#include "io/regular_file.h"
#include "vocab/gradients.h"
#include "kernels/gradient_generator.h"
#include "manifest/manifest_json.h"
#include "manifest/to_record.h"
#include "oracle/ground_truth.h"
#include "oracle/judge.h"
#include "run/evidence.h"
#include "run/process_tree.h"
#include "run/worker_log.h"
#include "run/target_run.h"
#include "topologies/logical_model.h"

extern char** environ;

namespace tally::run {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A duration as a message gives it: 1.5 s is "1.5", not "1".
std::string seconds_text(double seconds) {
  if (seconds >= 100) return std::to_string(static_cast<long long>(seconds + 0.5));
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", seconds);
  return text;
}

// How long tally waits, once it has asked a worker to stop (the stop file), before it terminates
// it; and after SIGTERM (torchrun forwards it to its ranks) before it kills the whole tree.
constexpr double kTerminateSeconds = 2.0;
// How often the pool records the processes of a running worker (run/process_tree.h): a rank its
// launcher leaves behind is found only through a record made while the launcher lived.
constexpr double kTrackSeconds = 0.25;
// How long tally waits for the processes of a killed worker to die, to reap those it took in.
constexpr double kReapSeconds = 2.0;
// The environment variable every process of a worker inherits: its queue folder.
constexpr const char* kWorkerTagVariable = "TALLY_WORKER_QUEUE";
// How many earlier cases of a queue are named when their manifests come back for a later one.
constexpr std::size_t kRememberedCases = 256;

// What a worker's files may hold: a hello and a result are small (run/worker_files.h); a log is
// read only in part.
constexpr std::size_t kMaxMessageShown = 4000;  // of a result's message
constexpr std::size_t kLogTailBytes = 32 << 10;  // the end of a log that is shown
constexpr std::size_t kLogScanBytes = 1 << 20;   // the start of a log searched for its first exception
constexpr std::size_t kMaxLineShown = 400;       // of one log line

// The whole of a small file a worker wrote. Throws std::runtime_error naming the file and why.
std::string read_worker_file(const fs::path& path, std::size_t max_bytes) {
  const io::RegularFile file(path.string());
  if (!file.is_open()) throw std::runtime_error(path.string() + " " + file.why_not());
  if (static_cast<std::uintmax_t>(file.size()) > max_bytes)
    throw std::runtime_error(path.string() + " holds " + std::to_string(file.size()) + " bytes, more than the " +
                             std::to_string(max_bytes) + " such a file may");
  std::optional<std::string> text = file.read(0, static_cast<std::size_t>(file.size()));
  if (!text) throw std::runtime_error(path.string() + " cannot be read to its end");
  return std::move(*text);
}

// At most `max` bytes of `text` on one line: control characters escaped, the rest counted.
std::string shown_line(std::string_view text, std::size_t max) {
  std::string out = io::escape_controls(text.substr(0, max));
  if (text.size() > max) out += "... (" + std::to_string(text.size() - max) + " more bytes)";
  return out;
}

// Whether a log line is a Python exception's last line ("ValueError: ..."), the launcher's own
// report that a child failed aside: a dotted name ending in Error or Exception, then the end of
// the line or ": ". One pass over the line, no backtracking (a long line once overflowed the
// stack of a regex).
bool is_exception_line(std::string_view line) {
  const auto name_char = [](char ch, bool first) {
    return std::isalpha(static_cast<unsigned char>(ch)) || ch == '_' ||
           (!first && (std::isdigit(static_cast<unsigned char>(ch)) || ch == '.'));
  };
  std::size_t end = 0;
  while (end < line.size() && name_char(line[end], end == 0)) ++end;
  const std::string_view name = line.substr(0, end), rest = line.substr(end);
  if (!name.ends_with("Error") && !name.ends_with("Exception")) return false;
  if (!rest.empty() && !rest.starts_with(": ")) return false;
  return name.find("ChildFailedError") == std::string_view::npos &&
         line.find("ChildFailedError") == std::string_view::npos;
}

// The lines of `text`.
std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> lines;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t newline = text.find('\n', at);
    const std::size_t end = newline == std::string_view::npos ? text.size() : newline;
    lines.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return lines;
}

// The last `count` lines of a worker's log, indented, for an error message; first the log's first
// exception when the tail lacks it (torchrun's report of a failed rank fills the end of the log
// and hides the rank's own error). Reads at most the log's first kLogScanBytes and last
// kLogTailBytes, and shows at most kMaxLineShown bytes of a line.
std::string log_tail(const fs::path& log, std::size_t count = 25) {
  const io::RegularFile file(log.string());
  if (!file.is_open()) return " (its log " + log.string() + " " + file.why_not() + ")";
  const std::size_t size = static_cast<std::size_t>(file.size());
  const std::size_t tail_from = size > kLogTailBytes ? size - kLogTailBytes : 0;
  const std::string tail_bytes = file.read(static_cast<off_t>(tail_from), size - tail_from).value_or("");
  std::vector<std::string_view> tail = lines_of(tail_bytes);
  const bool cut_first = tail_from > 0 && tail.size() <= count;  // the first shown began earlier
  if (tail.size() > count) tail.erase(tail.begin(), tail.end() - static_cast<std::ptrdiff_t>(count));
  if (tail.empty()) return " (its log " + log.string() + " is empty)";

  std::string first_exception;
  const std::string head = tail_from == 0 ? std::string() : file.read(0, std::min(size, kLogScanBytes)).value_or("");
  for (std::string_view line : lines_of(tail_from == 0 ? std::string_view(tail_bytes) : std::string_view(head)))
    if (is_exception_line(line)) {
      first_exception = shown_line(line, kMaxLineShown);
      break;
    }
  std::string text;
  std::vector<std::string> shown;
  for (std::string_view line : tail) shown.push_back(shown_line(line, kMaxLineShown));
  if (cut_first) shown.front() = "..." + shown.front();
  if (!first_exception.empty() && std::find(shown.begin(), shown.end(), first_exception) == shown.end())
    text += "; the first error in its log: " + first_exception;
  text += "; the end of its log " + log.string() + ":";
  for (const std::string& line : shown) text += "\n    " + line;
  return text;
}

oracle::Verdict infra_error(std::string call, std::string message) {
  return oracle::infra_error_verdict(std::move(call), std::move(message));
}

// The case as the worker reads it: what to execute, nothing about expectations or provenance.
casefile::Case request_case(casefile::Case c) {
  c.description.clear();
  c.expect.reset();
  c.target.reset();
  return c;
}

// FNV-1a, 64 bits: a request's identity against accidents (a stale answer), not against an adversary.
struct Fnv1a {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  void add(std::string_view bytes) {
    for (unsigned char b : bytes) hash = (hash ^ b) * 0x100000001b3ull;
    hash = (hash ^ 0xff) * 0x100000001b3ull;  // a separator: ("ab", "c") is not ("a", "bc")
  }
  std::string hex() const {
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
    return text;
  }
};

std::string case_key(const casefile::Case& c) {
  return casefile::case_to_json(request_case(c)).dump();
}

}  // namespace

LogicalGradients logical_gradients(const casefile::Case& c, const std::optional<ReductionGroups>& reduction) {
  static_assert(sizeof(float) == 4);
  const topologies::LogicalModel model(c.model, c.topology);
  const std::vector<kernels::GeneratorSpec> specs = vocab::param_generators(c.path.gradients, model);
  LogicalGradients out;
  out.values.reserve(static_cast<std::size_t>(model.total_elements()));
  nlohmann::ordered_json params = nlohmann::ordered_json::array();
  for (const topologies::LogicalParam& p : model.params()) {
    const kernels::GeneratorSpec& spec = specs[static_cast<std::size_t>(p.id)];
    std::vector<std::int64_t> shape(p.shape.dims.begin(), p.shape.dims.begin() + p.shape.rank);
    nlohmann::ordered_json entry = {{"name", p.name},
                                    {"class", topologies::class_name(p.param_class)},
                                    {"shape", shape},
                                    {"offset", out.values.size()},
                                    {"stage", p.stage}};
    // A worker that builds its own pipeline (DeepSpeed's) puts a copy of it on the last stage.
    if (p.tied && model.last_stage_copy() == topologies::SharedCopy::output_layer) entry["last_stage_copy"] = true;
    params.push_back(std::move(entry));
    const std::uint64_t key = kernels::stream_key(spec.seed, static_cast<std::uint64_t>(p.id));
    for (std::int64_t e = 0; e < p.numel; ++e)
      out.values.push_back(kernels::stored_value(spec, key, static_cast<std::uint64_t>(e)));
  }
  // The request's identity: what the worker is asked to run and with which values. A worker echoes
  // it in every manifest, so manifests of another case (a queue loop one case behind) are told apart
  // from a framework's miscount.
  Fnv1a digest;
  digest.add(casefile::case_to_text(request_case(c)));
  digest.add(params.dump());
  digest.add(std::string_view(reinterpret_cast<const char*>(out.values.data()), out.values.size() * sizeof(float)));
  out.case_digest = digest.hex();
  // The dim TP splits each param along (its class's, docs/megatron-reference.md §3), so no worker
  // restates the class table. Derived from the class the digest holds, it is left out of the digest:
  // a run saved before the field was sent keeps its identity.
  for (const topologies::LogicalParam& p : model.params()) {
    const int dim = topologies::partition_dim(p.param_class);
    params[static_cast<std::size_t>(p.id)]["split_dim"] = dim < 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(dim);
  }
  nlohmann::ordered_json index = {{"tally_gradients", 1},
                                  {"case_digest", out.case_digest},
                                  {"dtype", "float32"},
                                  {"elements", out.values.size()},
                                  {"params", std::move(params)}};
  if (reduction) {
    nlohmann::ordered_json given_whole = nlohmann::ordered_json::object();
    for (int size : reduction->sizes) {
      DealtShares& dealt = out.shares[size];
      dealt = deal_shares(out.values, size, reduction->divisor, c.path.gradients.generator.dtype);
      given_whole[std::to_string(size)] = dealt.given_whole;
    }
    index["shares"] = {{"divisor", reduction->divisor}, {"group_sizes", reduction->sizes}, {"given_whole", given_whole}};
  }
  out.index_json = index.dump(1) + "\n";
  return out;
}

std::string worker_command_for(const std::string& command, int world) {
  std::string out = command;
  const std::string token = "{world}";
  for (std::size_t at = out.find(token); at != std::string::npos; at = out.find(token, at))
    out.replace(at, token.size(), std::to_string(world));
  return out;
}

struct WorkerPool::Worker {
  int world = 0;
  fs::path queue;
  pid_t pid = -1;  // the launcher (/bin/sh exec'ing the command), not yet reaped; -1: not running
  // In the environment of every process the worker starts (kWorkerTagVariable=<queue>): a
  // descendant that detached and was re-parented to tally (the subreaper) is known by it.
  std::string tag;
  std::unique_ptr<WorkerLog> log;
  // Every process of the worker seen so far: ranks in sessions of their own (torchrun's) are
  // found only through their parents, so the tree is recorded while the launcher lives.
  std::vector<ProcessId> tree;
  Clock::time_point tracked{};
  WorkerHello hello;
  std::int64_t next_case = 1;
  // The digests of the cases sent to this start's queue, newest last (at most kRememberedCases), so
  // that manifests of an earlier case are named as that case's.
  std::deque<std::pair<std::string, std::string>> sent;
  void remember(const std::string& digest, const std::string& name) {
    sent.emplace_back(digest, name);
    if (sent.size() > kRememberedCases) sent.pop_front();
  }
  int starts = 0;  // each start has its own queue folder

  // Records the worker's processes, at most every kTrackSeconds unless `now`.
  void track(bool now = false) {
    if (pid <= 0 || (!now && seconds_since(tracked) < kTrackSeconds)) return;
    const std::vector<ProcessEntry> table = process_table();
    reap_ended_orphans(table);
    tree = merge_trees(tree, process_tree(pid, table));
    adopt(table);
    tracked = Clock::now();
  }

  // Orphans of this worker that tally took in and that ended on their own are reaped as they end,
  // so a sweep of thousands of cases leaves no zombies in the process table. Only those known to
  // be this worker's: never the launcher (waited on by `exited`) nor another pool's.
  void reap_ended_orphans(const std::vector<ProcessEntry>& table) {
    const pid_t self = ::getpid();
    for (const ProcessEntry& e : table)
      if (e.parent == self && e.zombie && e.id.pid != pid &&
          std::find(tree.begin(), tree.end(), e.id) != tree.end())
        ::waitpid(e.id.pid, nullptr, WNOHANG);
  }

  // The worker's orphans that tally, their subreaper, took in: children of tally carrying its tag.
  void adopt(const std::vector<ProcessEntry>& table) {
    const pid_t self = ::getpid();
    for (const ProcessEntry& e : table)
      if (e.parent == self && e.id.pid != pid && !e.zombie && environment_holds(e.id.pid, tag))
        tree = merge_trees(tree, process_tree(e.id.pid, table));
  }

  // Whether the launcher has exited (then reaped, its `status` set).
  bool exited(int& status) { return pid > 0 && ::waitpid(pid, &status, WNOHANG) == pid; }

  // The launcher has exited and is reaped: kills what it left behind (also what `killed` names,
  // already killed), and reaps those re-parented to tally.
  void end_leftovers(std::vector<ProcessId> killed = {}) {
    adopt(process_table());
    const std::vector<ProcessId> now_killed = kill_tree(0, tree);
    killed.insert(killed.end(), now_killed.begin(), now_killed.end());
    killed.insert(killed.end(), tree.begin(), tree.end());
    reap_children(std::move(killed), kReapSeconds);
    pid = -1;
    tree.clear();
  }
};

WorkerPool::WorkerPool(WorkerOptions options) : options_(std::move(options)) {
  if (options_.command.empty()) throw std::invalid_argument("WorkerPool: no worker command");
  if (!options_.judge) throw std::invalid_argument("WorkerPool: no judge of the worker's answers");
  // Orphans of a worker (a rank that detached, a daemon) come back to tally, to be ended with it.
  become_subreaper();
  if (options_.work_dir.empty()) {
    std::string pattern = (fs::temp_directory_path() / "tally-worker-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr)
      throw std::runtime_error("cannot create a folder for the worker queues under " +
                               fs::temp_directory_path().string() + ": " + std::strerror(errno));
    root_ = pattern;
    own_root_ = true;
  } else {
    root_ = options_.work_dir;
    std::error_code error;
    fs::create_directories(root_, error);
    if (error) throw std::runtime_error("cannot create the worker folder " + root_ + ": " + error.message());
  }
}

WorkerPool::~WorkerPool() {
  for (auto& [world, w] : workers_) stop(*w);
  if (own_root_ && !keep_root_) {
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }
}

std::string WorkerPool::kept_log_tail(const Worker& w) {
  keep_root_ = true;  // the message names this log: it must still be there to be read
  return log_tail(w.queue / "worker.log");
}

WorkerPool::Ended WorkerPool::stop(Worker& w, bool ask) {
  if (w.pid <= 0) return Ended::by_itself;
  w.track(/*now=*/true);
  if (ask) {
    try {
      io::write_file_atomically((w.queue / "stop").string(), "stop\n", "stop file");
    } catch (const std::exception&) {
      ask = false;  // the queue is gone or full: terminating is all that is left
    }
  }
  // Asked: the worker ends its process groups and exits. Then (or unasked) the launcher is told to
  // terminate (torchrun forwards it to its ranks); what is left after that is killed, the whole
  // tree, ranks in other sessions included.
  int status = 0;
  const auto wait_exit = [&](double seconds) {
    const Clock::time_point start = Clock::now();
    while (seconds_since(start) < seconds) {
      if (w.exited(status)) return true;
      w.track();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  bool exited = ask && wait_exit(options_.stop_seconds);
  const bool exited_asked = exited;
  if (!exited) {
    w.track(/*now=*/true);
    ::kill(w.pid, SIGTERM);
    exited = wait_exit(kTerminateSeconds);
  }
  std::vector<ProcessId> killed;
  if (!exited) {
    killed = kill_tree(w.pid, w.tree);
    ::waitpid(w.pid, &status, 0);
  }
  w.end_leftovers(std::move(killed));
  return exited_asked ? Ended::by_itself : exited ? Ended::terminated : Ended::killed;
}

WorkerPool::Worker& WorkerPool::worker(int world) {
  std::unique_ptr<Worker>& slot = workers_[world];
  if (!slot) {
    slot = std::make_unique<Worker>();
    slot->world = world;
  }
  Worker& w = *slot;
  if (w.pid > 0) {
    int status = 0;
    if (!w.exited(status)) return w;
    w.end_leftovers();  // the launcher is gone; its ranks must not linger
  }
  // A fresh queue per start: nothing of a previous worker (or a rank it left behind) is read as
  // this one's, and the kept manifests of earlier failing runs stay where they are.
  ++w.starts;
  w.queue = fs::path(root_) / ("world-" + std::to_string(world) + (w.starts > 1 ? "-" + std::to_string(w.starts) : ""));
  std::error_code error;
  fs::remove_all(w.queue, error);
  fs::create_directories(w.queue, error);
  if (error) throw std::runtime_error("cannot create the worker queue " + w.queue.string() + ": " + error.message());
  w.next_case = 1;
  w.sent.clear();
  const fs::path log = w.queue / "worker.log";
  const std::string command = "exec " + worker_command_for(options_.command, world) + " --queue '" +
                              w.queue.string() + "' --parent-pid " + std::to_string(::getpid());
  // One write per message: the lanes of a sweep share the stream.
  if (options_.progress)
    *options_.progress << ("starting the world-" + std::to_string(world) + " worker: " + command.substr(5) + " (log " +
                           log.string() + ")\n")
                       << std::flush;

  w.log.reset();  // the previous start's
  w.log = std::make_unique<WorkerLog>(log);
  w.tag = std::string(kWorkerTagVariable) + "=" + w.queue.string();
  std::vector<char*> environment;
  for (char** entry = environ; *entry != nullptr; ++entry)
    if (!std::string_view(*entry).starts_with(std::string(kWorkerTagVariable) + "=")) environment.push_back(*entry);
  environment.push_back(w.tag.data());
  environment.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&files, w.log->fd(), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&files, w.log->fd(), STDERR_FILENO);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  // A session (and process group) of its own: no signal of tally's terminal reaches it, and stopping
  // it reaches every rank that stays in it.
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSID);
  const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
  pid_t pid = -1;
  const int spawned =
      ::posix_spawn(&pid, "/bin/sh", &files, &attributes, const_cast<char**>(argv), environment.data());
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attributes);
  if (spawned != 0) throw std::runtime_error("cannot start the worker (/bin/sh): " + std::string(std::strerror(spawned)));
  w.pid = pid;

  const Clock::time_point start = Clock::now();
  const fs::path hello = w.queue / "hello.json";
  const std::string who = "the world-" + std::to_string(world) + " worker";
  while (!fs::exists(fs::symlink_status(hello))) {
    int status = 0;
    if (w.exited(status)) {
      w.end_leftovers();
      throw std::runtime_error(who + " exited before it was up (" +
                               (WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status))
                                                  : "signal " + std::to_string(WTERMSIG(status))) +
                               ")" + kept_log_tail(w));
    }
    if (seconds_since(start) > options_.start_seconds) {
      // Not up, so not reading its queue: a stop file would go unread.
      stop(w, /*ask=*/false);
      throw std::runtime_error(who + " was not up after " + seconds_text(options_.start_seconds) +
                               " s (--start-timeout; it was stopped)" + kept_log_tail(w));
    }
    w.track();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  w.track(/*now=*/true);
  try {
    w.hello = read_hello(read_worker_file(hello, kMaxHelloBytes), options_.cannot_run_settings);
  } catch (const std::exception& e) {
    stop(w, /*ask=*/false);
    throw std::runtime_error(who + "'s " + hello.string() + " is not a valid hello (docs/schemas/hello.schema.json): " +
                             shown_line(e.what(), kMaxLineShown));
  }
  if (w.hello.world != world) {
    stop(w, /*ask=*/false);
    throw std::runtime_error("the worker started for world " + std::to_string(world) + " has world " +
                             std::to_string(w.hello.world) + ": its command must start {world} ranks (" +
                             options_.command + ")");
  }
  if (options_.progress) {
    std::string message = "world-" + std::to_string(world) + " worker up in " +
                          std::to_string(static_cast<int>(seconds_since(start) + 0.5)) + " s: " + w.hello.framework +
                          " " + w.hello.version + "\n";
    // Said once, not once per refused case: what its cases will not ask for on this machine.
    for (const auto& [setting, why] : w.hello.cannot_run)
      message += "  it cannot run " + setting + " here: " + shown_line(why, kMaxLineShown) + "\n";
    *options_.progress << message << std::flush;
  }
  return w;
}

const WorkerHello& WorkerPool::hello(int world) {
  // Once a worker of this world has said hello, its framework and version are known: a worker
  // that died since is restarted by the next case, not to be asked again.
  auto it = workers_.find(world);
  if (it != workers_.end() && it->second->hello.world == world) return it->second->hello;
  return worker(world).hello;
}

// A worker that has run out of something it cannot give back (a rank's threads: a gloo group holds
// its own while anything refers to it) writes `retiring` with its reason before a case's result and
// exits after it. tally waits for it to go, so that the next case starts a fresh worker rather than
// reaching one on its way out (which would read as a worker that died during that case).
void WorkerPool::retire_if_asked(Worker& w, const std::string& after_case) {
  const fs::path retiring = w.queue / "retiring";
  std::error_code error;
  if (fs::symlink_status(retiring, error).type() != fs::file_type::regular) return;
  std::string why;
  try {
    why = read_worker_file(retiring, kMaxRetiringBytes);
  } catch (const std::exception& e) {
    why = e.what();
  }
  while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
  if (options_.progress)
    *options_.progress << ("the world-" + std::to_string(w.world) + " worker retires after " + after_case + " (" +
                           shown_line(why, kMaxLineShown) + "): the next case starts a fresh one\n")
                       << std::flush;
  const Ended ended = stop(w, /*ask=*/true);
  // A worker that said it retires and did not end is stopped: said so, since it cost the wait.
  if (ended != Ended::by_itself && options_.progress)
    *options_.progress << ("the retiring world-" + std::to_string(w.world) + " worker did not end within " +
                           seconds_text(options_.stop_seconds) + " s: it was " +
                           (ended == Ended::terminated ? "terminated" : "killed") + "\n")
                       << std::flush;
}

WorkerRun WorkerPool::execute(const casefile::Case& c) {
  Worker& w = worker(c.topology.world);
  const std::string name = "case-" + std::to_string(w.next_case++);
  const fs::path request = w.queue / (name + ".json");
  const fs::path gradients_index = w.queue / (name + ".gradients.json");
  const fs::path gradients_values = w.queue / (name + ".gradients.f32");
  const fs::path result_file = w.queue / (name + ".result.json");
  const fs::path manifests = w.queue / name;
  const fs::path engine_file = w.queue / (name + ".engine.json");

  const std::optional<ReductionGroups> reduction =
      options_.reduction_groups ? options_.reduction_groups(c) : std::nullopt;
  const LogicalGradients gradients = logical_gradients(c, reduction);
  SentRequest sent{name, gradients.case_digest, {}};
  for (const auto& [digest, earlier] : w.sent) sent.earlier.emplace(digest, earlier);
  w.remember(gradients.case_digest, name);
  io::write_file_atomically(
      gradients_values.string(),
      std::string_view(reinterpret_cast<const char*>(gradients.values.data()), gradients.values.size() * sizeof(float)),
      "gradient values");
  std::vector<fs::path> share_files;
  for (const auto& [size, dealt] : gradients.shares) {
    share_files.push_back(w.queue / shares_file_name(name, size));
    io::write_file_atomically(
        share_files.back().string(),
        std::string_view(reinterpret_cast<const char*>(dealt.shares.data()), dealt.shares.size() * sizeof(float)),
        "gradient shares");
  }
  io::write_file_atomically(gradients_index.string(), gradients.index_json, "gradient index");
  if (options_.engine_config)
    if (std::optional<std::string> engine = options_.engine_config(c))
      io::write_file_atomically(engine_file.string(), *engine, "engine configuration");
  // The case last: its appearance tells the worker that everything of the case is there.
  casefile::write_case_file(request.string(), request_case(c), case_frameworks());

  WorkerRun out;
  const Clock::time_point start = Clock::now();
  auto clean_request = [&] {
    std::error_code ignored;
    fs::remove(gradients_values, ignored);
    fs::remove(gradients_index, ignored);
    fs::remove(engine_file, ignored);
    for (const fs::path& file : share_files) fs::remove(file, ignored);
  };
  const std::string worker_call = w.hello.framework + " worker (world " + std::to_string(w.world) + ")";
  while (!fs::exists(fs::symlink_status(result_file))) {
    int status = 0;
    if (w.exited(status)) {
      w.end_leftovers();  // ranks the launcher left behind
      clean_request();
      out.seconds = seconds_since(start);
      out.verdict = infra_error(worker_call, "the worker exited during " + name + kept_log_tail(w));
      return out;
    }
    if (seconds_since(start) > options_.case_seconds) {
      const std::string tail = kept_log_tail(w);
      stop(w, /*ask=*/false);  // it is busy with the case: a stop file would go unread
      clean_request();
      out.seconds = seconds_since(start);
      out.verdict = infra_error(worker_call, name + " gave no result within " + seconds_text(options_.case_seconds) +
                                                 " s (--case-timeout; the worker was stopped)" + tail);
      return out;
    }
    w.track();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  out.seconds = seconds_since(start);
  clean_request();

  retire_if_asked(w, name);
  WorkerResult result;
  try {
    result = read_result(read_worker_file(result_file, kMaxResultBytes));
  } catch (const std::exception& e) {
    // A worker that writes no result it should is not trusted with the next case: restarted.
    const std::string tail = kept_log_tail(w);
    stop(w, /*ask=*/false);
    out.verdict = infra_error(worker_call, result_file.string() + " is not a result (" +
                                               shown_line(e.what(), kMaxLineShown) + "; the worker was stopped)" +
                                               tail);
    return out;
  }
  std::error_code no_folder;
  const bool ran = fs::symlink_status(manifests, no_folder).type() != fs::file_type::not_found;
  if (result.refused && refusal_not_the_frameworks(result.message)) {
    // A refusal hides whatever the case would show: taken only as the framework's own words.
    out.verdict = infra_error(worker_call, "the worker answered \"refused\" to " + name + " " +
                                               *refusal_not_the_frameworks(result.message) + kept_log_tail(w));
  } else if (result.refused && ran) {
    out.verdict = infra_error(worker_call, "the worker answered \"refused\" to " + name + " after writing " +
                                               manifests.string() + ": a refusal is the framework declining the case "
                                               "as it is set up, before any run" + kept_log_tail(w));
    out.manifests = manifests.string();  // what it ran, kept beside the error
  } else if (result.refused) {
    // The framework's own check declined the case at set-up: a refusal, counted by its reason.
    out.verdict = oracle::refused_verdict(w.hello.framework + " " + w.hello.version,
                                          shown_line(result.message, kMaxMessageShown));
  } else if (!result.ok) {
    // The worker or the framework failed on the case; the log holds its traceback.
    out.verdict = infra_error(w.hello.framework + " " + w.hello.version,
                              shown_line(result.message.empty() ? "error" : result.message, kMaxMessageShown) +
                                  kept_log_tail(w));
  } else if (std::error_code error; fs::symlink_status(manifests, error).type() != fs::file_type::directory) {
    const fs::file_type type = fs::symlink_status(manifests, error).type();
    out.verdict = infra_error(worker_call, "the worker answered \"ok\" to " + name + " but left no folder of manifests: " +
                                               manifests.string() + " is " +
                                               (type == fs::file_type::not_found ? "missing" : "not a folder") + kept_log_tail(w));
  } else {
    try {
      out.verdict = options_.judge(c, manifests.string(), sent);
    } catch (const std::exception& e) {
      out.verdict = infra_error("reading the manifests of " + name, e.what());
    }
    // A verdict stands only on files its saved copy keeps: a link (read, but never copied) is the
    // worker's error, so that a replay of the saved case judges what this run judged.
    if (out.verdict.kind != oracle::Verdict::Kind::infra_error)
      if (std::optional<std::string> why = not_plain_evidence(manifests))
        out.verdict = infra_error("the manifests of " + name, *why);
    out.manifests = manifests.string();  // the evidence of the verdict
  }
  // A pass (or a refusal, which left no manifests) is not kept.
  if ((out.verdict.kind == oracle::Verdict::Kind::pass && !options_.keep_passing) ||
      out.verdict.kind == oracle::Verdict::Kind::refused) {
    std::error_code ignored;
    fs::remove_all(manifests, ignored);
    fs::remove(result_file, ignored);
    fs::remove(request, ignored);
    out.manifests.clear();
  }
  // The most recent run of the case is its evidence: an earlier run's manifests never stand for a
  // later run that left none.
  if (!out.manifests.empty()) failing_runs_[case_key(c)] = out.manifests;
  else failing_runs_.erase(case_key(c));
  return out;
}

std::optional<std::string> WorkerPool::manifests_of(const casefile::Case& c) const {
  auto it = failing_runs_.find(case_key(c));
  if (it == failing_runs_.end()) return std::nullopt;
  return it->second;
}

}  // namespace tally::run
