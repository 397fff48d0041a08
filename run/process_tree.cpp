#include "run/process_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

namespace tally::run {

namespace {

struct StatLine {
  ProcessEntry entry;
  char state = '?';
};

// /proc/<pid>/stat: "pid (comm) state ppid ... starttime(22) ...". comm may hold spaces and
// parentheses, so the fields are counted from its last ')'.
std::optional<StatLine> read_stat(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buffer[1024];
  const ssize_t n = ::read(fd, buffer, sizeof buffer - 1);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  buffer[n] = '\0';
  const char* close = std::strrchr(buffer, ')');
  if (close == nullptr || close[1] != ' ') return std::nullopt;
  StatLine line;
  line.entry.id.pid = pid;
  line.state = close[2];
  line.entry.zombie = line.state == 'Z' || line.state == 'X';
  const char* field = close + 2;  // field 3, the state
  for (int number = 3; number <= 22 && *field != '\0'; ++number) {
    if (number == 4) line.entry.parent = static_cast<pid_t>(std::strtol(field, nullptr, 10));
    if (number == 22) {
      line.entry.id.start_time = std::strtoull(field, nullptr, 10);
      return line;
    }
    field = std::strchr(field, ' ');
    if (field == nullptr) return std::nullopt;
    ++field;
  }
  return std::nullopt;
}

bool contains(const std::vector<ProcessId>& list, pid_t pid) {
  return std::any_of(list.begin(), list.end(), [pid](const ProcessId& p) { return p.pid == pid; });
}

}  // namespace

std::vector<ProcessEntry> process_table() {
  std::vector<ProcessEntry> table;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return table;
  while (const dirent* entry = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || pid <= 0) continue;
    if (const std::optional<StatLine> line = read_stat(static_cast<pid_t>(pid))) table.push_back(line->entry);
  }
  ::closedir(proc);
  return table;
}

std::vector<ProcessId> process_tree(pid_t root, const std::vector<ProcessEntry>& table) {
  std::vector<ProcessId> tree;
  for (const ProcessEntry& e : table)
    if (e.id.pid == root) tree.push_back(e.id);
  if (tree.empty()) return tree;
  // Breadth first: each round adds the children of the previous round's processes.
  for (std::size_t first = 0; first < tree.size();) {
    const std::size_t end = tree.size();
    for (const ProcessEntry& e : table)
      for (std::size_t i = first; i < end; ++i)
        if (e.parent == tree[i].pid && !contains(tree, e.id.pid)) tree.push_back(e.id);
    first = end;
  }
  return tree;
}

bool still_running(const ProcessId& p) {
  const std::optional<StatLine> line = read_stat(p.pid);
  return line && line->entry.id.start_time == p.start_time && line->state != 'Z' && line->state != 'X';
}

std::vector<ProcessId> merge_trees(const std::vector<ProcessId>& known, const std::vector<ProcessId>& fresh) {
  std::vector<ProcessId> out;
  for (const std::vector<ProcessId>* list : {&fresh, &known})
    for (const ProcessId& p : *list)
      if (!contains(out, p.pid) && still_running(p)) out.push_back(p);
  return out;
}

std::vector<ProcessId> kill_tree(pid_t root, const std::vector<ProcessId>& known) {
  std::vector<ProcessId> victims;
  std::vector<ProcessEntry> table = process_table();
  if (root > 0) victims = process_tree(root, table);
  for (const ProcessId& p : known)
    if (!contains(victims, p.pid) && still_running(p)) victims.push_back(p);
  // Stop each, then look again for children started meanwhile, until there are none.
  for (std::size_t stopped = 0; stopped < victims.size();) {
    for (; stopped < victims.size(); ++stopped) ::kill(victims[stopped].pid, SIGSTOP);
    table = process_table();
    for (const ProcessEntry& e : table)
      if (contains(victims, e.parent) && !contains(victims, e.id.pid)) victims.push_back(e.id);
  }
  for (const ProcessId& p : victims) ::kill(p.pid, SIGKILL);
  return victims;
}

bool become_subreaper() {
#ifdef PR_SET_CHILD_SUBREAPER
  return ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0;
#else
  return false;
#endif
}

bool environment_holds(pid_t pid, std::string_view entry) {
  const std::string path = "/proc/" + std::to_string(pid) + "/environ";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  // Entries are NUL-terminated; an environment is read up to 4 MiB (far more than a shell passes on).
  std::string text;
  char buffer[1 << 15];
  for (ssize_t n; text.size() < (std::size_t{4} << 20) && (n = ::read(fd, buffer, sizeof buffer)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    text.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = std::min(text.find('\0', at), text.size());
    if (std::string_view(text).substr(at, end - at) == entry) return true;
    at = end + 1;
  }
  return false;
}

void reap_children(std::vector<ProcessId> ended, double seconds) {
  const pid_t self = ::getpid();
  const auto start = std::chrono::steady_clock::now();
  while (!ended.empty()) {
    std::vector<ProcessId> left;
    for (const ProcessId& p : ended) {
      const std::optional<StatLine> line = read_stat(p.pid);
      if (!line || line->entry.id.start_time != p.start_time) continue;  // gone (reaped by its parent)
      if (line->entry.parent == self) {
        if (::waitpid(p.pid, nullptr, WNOHANG) != p.pid) left.push_back(p);  // still dying
      } else if (contains(ended, line->entry.parent)) {
        left.push_back(p);  // ours once its parent, one of `ended`, is reaped
      }
    }
    ended = std::move(left);
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= seconds) break;
    if (!ended.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace tally::run
