#include "run/framework_worker.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <regex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "casefile/atomic_file.h"
#include "casefile/case_file.h"
#include "gradnorm/gradients.h"
#include "kernels/gradient_generator.h"
#include "manifest/manifest_json.h"
#include "manifest/to_record.h"
#include "oracle/ground_truth.h"
#include "oracle/judge.h"
#include "topologies/logical_model.h"

extern char** environ;

namespace tally::run {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Whether a log line is a Python exception's last line ("ValueError: ..."), the launcher's own
// report that a child failed aside.
bool is_exception_line(const std::string& line) {
  static const std::regex exception(R"(^[A-Za-z_][A-Za-z0-9_.]*(Error|Exception)(: .*)?$)");
  return line.find("ChildFailedError") == std::string::npos && std::regex_match(line, exception);
}

// The last `lines` lines of a worker's log, indented, for an error message; first the log's first
// exception when the tail lacks it (torchrun's report of a failed rank fills the end of the log
// and hides the rank's own error).
std::string log_tail(const fs::path& log, std::size_t lines = 25) {
  std::ifstream in(log);
  std::deque<std::string> tail;
  std::string first_exception;
  for (std::string line; std::getline(in, line);) {
    if (first_exception.empty() && is_exception_line(line)) first_exception = line;
    tail.push_back(line);
    if (tail.size() > lines) tail.pop_front();
  }
  if (tail.empty()) return " (its log " + log.string() + " is empty)";
  std::string text;
  if (!first_exception.empty() && std::find(tail.begin(), tail.end(), first_exception) == tail.end())
    text += "; the first error in its log: " + first_exception;
  text += "; the end of its log " + log.string() + ":";
  for (const std::string& line : tail) text += "\n    " + line;
  return text;
}

oracle::Verdict infra_error(std::string call, std::string message) {
  oracle::Verdict v;
  v.kind = oracle::Verdict::Kind::infra_error;
  v.infra_call = std::move(call);
  v.infra_message = std::move(message);
  return v;
}

// The case as the worker reads it: what to execute, nothing about expectations or provenance.
casefile::Case request_case(casefile::Case c) {
  c.description.clear();
  c.expect.reset();
  c.target.reset();
  return c;
}

std::string case_key(const casefile::Case& c) {
  return casefile::case_to_json(request_case(c)).dump();
}

void write_binary_atomically(const fs::path& file, const std::vector<float>& values) {
  const fs::path temporary = file.string() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(values.data()),
              static_cast<std::streamsize>(values.size() * sizeof(float)));
    if (!out) throw std::runtime_error("cannot write " + temporary.string());
  }
  fs::rename(temporary, file);
}

}  // namespace

LogicalGradients logical_gradients(const casefile::Case& c) {
  static_assert(sizeof(float) == 4);
  const topologies::LogicalModel model(c.model, c.topology);
  const std::vector<kernels::GeneratorSpec> specs = gradnorm::param_generators(c.path.gradients, model);
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
  nlohmann::ordered_json index = {{"tally_gradients", 1},
                                  {"dtype", "float32"},
                                  {"elements", out.values.size()},
                                  {"params", std::move(params)}};
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

oracle::Verdict judge_manifests(const std::string& dir, double rtol) {
  const record::RunRecord run = manifest::to_record(manifest::load_run(dir, 1));
  oracle::Bounds bounds;
  bounds.rtol = rtol;
  return oracle::judge(run, oracle::truth_from_box_statistics(run), bounds);
}

struct WorkerPool::Worker {
  int world = 0;
  fs::path queue;
  pid_t pid = -1;  // the process group's leader (also its id); -1: not running
  WorkerHello hello;
  std::int64_t next_case = 1;
  int starts = 0;  // each start has its own queue folder
};

WorkerPool::WorkerPool(WorkerOptions options) : options_(std::move(options)) {
  if (options_.command.empty()) throw std::invalid_argument("WorkerPool: no worker command");
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
  if (own_root_) {
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }
}

void WorkerPool::stop(Worker& w, bool ask) {
  if (w.pid <= 0) return;
  if (ask) std::ofstream(w.queue / "stop") << "stop\n";
  Clock::time_point asked = Clock::now();
  int status = 0;
  bool terminated = false;
  while (::waitpid(w.pid, &status, WNOHANG) == 0) {
    if (!terminated && (!ask || seconds_since(asked) > 20)) {
      // torchrun starts each rank in its own session: only the launcher, told to terminate,
      // reaches them (it forwards the signal), so it gets a chance before the group is killed.
      ::kill(w.pid, SIGTERM);
      terminated = true;
      asked = Clock::now();
    } else if (terminated && seconds_since(asked) > 10) {
      ::kill(-w.pid, SIGKILL);
      ::waitpid(w.pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Ranks its launcher left behind, if any.
  ::kill(-w.pid, SIGKILL);
  w.pid = -1;
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
    if (::waitpid(w.pid, &status, WNOHANG) == 0) return w;
    ::kill(-w.pid, SIGKILL);  // the leader is gone; its ranks must not linger
    w.pid = -1;
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
  const fs::path log = w.queue / "worker.log";
  const std::string command = "exec " + worker_command_for(options_.command, world) + " --queue '" +
                              w.queue.string() + "' --parent-pid " + std::to_string(::getpid());
  if (options_.progress)
    *options_.progress << "starting the world-" << world << " worker: " << command.substr(5) << " (log "
                       << log.string() << ")\n" << std::flush;

  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&files, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&files, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);  // its own group: stopping it reaches every rank
  const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, "/bin/sh", &files, &attributes, const_cast<char**>(argv), environ);
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attributes);
  if (spawned != 0) throw std::runtime_error("cannot start the worker (/bin/sh): " + std::string(std::strerror(spawned)));
  w.pid = pid;

  const Clock::time_point start = Clock::now();
  const fs::path hello = w.queue / "hello.json";
  while (!fs::exists(hello)) {
    int status = 0;
    if (::waitpid(w.pid, &status, WNOHANG) == w.pid) {
      w.pid = -1;
      throw std::runtime_error("the world-" + std::to_string(world) + " worker exited before it was up (" +
                               (WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status))
                                                  : "signal " + std::to_string(WTERMSIG(status))) +
                               ")" + log_tail(log));
    }
    if (seconds_since(start) > options_.start_seconds) {
      stop(w);
      throw std::runtime_error("the world-" + std::to_string(world) + " worker was not up after " +
                               std::to_string(static_cast<int>(options_.start_seconds)) + " s" + log_tail(log));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(read_file(hello));
    w.hello.framework = j.at("framework").get<std::string>();
    w.hello.version = j.at("version").get<std::string>();
    w.hello.producer = j.value("producer", std::string());
    w.hello.world = j.at("world").get<int>();
    w.hello.plants = {};
    if (j.contains("plants")) w.hello.plants.planted = j.at("plants").get<std::map<std::string, std::string>>();
    w.hello.dtypes.clear();
    if (j.contains("dtypes")) w.hello.dtypes = j.at("dtypes").get<std::vector<std::string>>();
    w.hello.megatron_model_rules = false;
    if (j.contains("model_rules")) {
      if (j.at("model_rules") != "megatron")
        throw std::runtime_error("model_rules must be \"megatron\" (or absent: the framework's own), got " +
                                 j.at("model_rules").dump());
      w.hello.megatron_model_rules = true;
    }
    if (j.contains("cannot_plant"))
      w.hello.plants.not_planted = j.at("cannot_plant").get<std::map<std::string, std::string>>();
  } catch (const std::exception& e) {
    stop(w);
    throw std::runtime_error("the world-" + std::to_string(world) + " worker's " + hello.string() +
                             " is not a hello (framework, version, world): " + e.what());
  }
  if (w.hello.world != world) {
    stop(w);
    throw std::runtime_error("the worker started for world " + std::to_string(world) + " has world " +
                             std::to_string(w.hello.world) + ": its command must start {world} ranks (" +
                             options_.command + ")");
  }
  if (options_.progress)
    *options_.progress << "world-" << world << " worker up in " << static_cast<int>(seconds_since(start) + 0.5)
                       << " s: " << w.hello.framework << " " << w.hello.version << "\n" << std::flush;
  return w;
}

const WorkerHello& WorkerPool::hello(int world) {
  // Once a worker of this world has said hello, its framework and version are known: a worker
  // that died since is restarted by the next case, not to be asked again.
  auto it = workers_.find(world);
  if (it != workers_.end() && it->second->hello.world == world) return it->second->hello;
  return worker(world).hello;
}

WorkerRun WorkerPool::execute(const casefile::Case& c) {
  Worker& w = worker(c.topology.world);
  const std::string name = "case-" + std::to_string(w.next_case++);
  const fs::path request = w.queue / (name + ".json");
  const fs::path gradients_index = w.queue / (name + ".gradients.json");
  const fs::path gradients_values = w.queue / (name + ".gradients.f32");
  const fs::path result_file = w.queue / (name + ".result.json");
  const fs::path manifests = w.queue / name;

  const LogicalGradients gradients = logical_gradients(c);
  write_binary_atomically(gradients_values, gradients.values);
  casefile::write_file_atomically(gradients_index.string(), gradients.index_json, "gradient index");
  // The case last: its appearance tells the worker that everything of the case is there.
  casefile::write_case_file(request.string(), request_case(c));

  WorkerRun out;
  const Clock::time_point start = Clock::now();
  auto clean_request = [&] {
    std::error_code ignored;
    fs::remove(gradients_values, ignored);
    fs::remove(gradients_index, ignored);
  };
  while (!fs::exists(result_file)) {
    int status = 0;
    if (::waitpid(w.pid, &status, WNOHANG) == w.pid) {
      ::kill(-w.pid, SIGKILL);  // ranks the leader left behind
      w.pid = -1;
      clean_request();
      out.seconds = seconds_since(start);
      out.verdict = infra_error(w.hello.framework + " worker (world " + std::to_string(w.world) + ")",
                                "the worker exited during " + name + log_tail(w.queue / "worker.log"));
      return out;
    }
    if (seconds_since(start) > options_.case_seconds) {
      const std::string tail = log_tail(w.queue / "worker.log");
      stop(w, /*ask=*/false);  // it is busy with the case: a stop file would go unread
      clean_request();
      out.seconds = seconds_since(start);
      out.verdict = infra_error(w.hello.framework + " worker (world " + std::to_string(w.world) + ")",
                                name + " gave no result within " +
                                    std::to_string(static_cast<int>(options_.case_seconds)) +
                                    " s (the worker was stopped)" + tail);
      return out;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  out.seconds = seconds_since(start);
  clean_request();

  std::string status, message;
  try {
    const nlohmann::json j = nlohmann::json::parse(read_file(result_file));
    status = j.at("status").get<std::string>();
    message = j.value("message", std::string());
  } catch (const std::exception& e) {
    out.verdict = infra_error(w.hello.framework + " worker", result_file.string() + " is not a result: " + e.what());
    return out;
  }
  if (status != "ok") {
    out.verdict = infra_error(w.hello.framework + " " + w.hello.version, message.empty() ? status : message);
  } else {
    try {
      out.verdict = judge_manifests(manifests.string(), options_.rtol);
      out.manifests = manifests.string();
    } catch (const std::exception& e) {
      out.verdict = infra_error("reading the manifests of " + name, e.what());
    }
  }
  if (out.verdict.kind == oracle::Verdict::Kind::pass && !options_.keep_passing) {
    std::error_code ignored;
    fs::remove_all(manifests, ignored);
    fs::remove(result_file, ignored);
    fs::remove(request, ignored);
    out.manifests.clear();
  } else if (!out.manifests.empty()) {
    failing_runs_[case_key(c)] = out.manifests;
  }
  return out;
}

std::optional<std::string> WorkerPool::manifests_of(const casefile::Case& c) const {
  auto it = failing_runs_.find(case_key(c));
  if (it == failing_runs_.end()) return std::nullopt;
  return it->second;
}

}  // namespace tally::run
