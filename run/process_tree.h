// The processes a worker started, however they detached. torchrun starts each rank in its own
// session, so neither the worker's process group nor its session holds them: only the parent
// links of /proc/<pid>/stat do, and only while each parent lives (an orphan is re-parented to
// init). So a worker's tree is collected while it runs, and again before anything is killed.
#pragma once

#include <sys/types.h>

#include <string_view>
#include <vector>

namespace tally::run {

// A process, told apart from a later one with the same id by its start time (clock ticks after
// boot, /proc/<pid>/stat field 22).
struct ProcessId {
  pid_t pid = 0;
  unsigned long long start_time = 0;
  friend bool operator==(const ProcessId&, const ProcessId&) = default;
};

struct ProcessEntry {
  ProcessId id;
  pid_t parent = 0;
  bool zombie = false;  // ended, not yet reaped by its parent
};

// Every process now in /proc (zombies included), with its parent.
std::vector<ProcessEntry> process_table();

// `root` (when in `table`) and all its descendants in `table`, parents before children.
std::vector<ProcessId> process_tree(pid_t root, const std::vector<ProcessEntry>& table);

// `known` and `fresh` together, each process once, without those that have ended (or whose id now
// names another process).
std::vector<ProcessId> merge_trees(const std::vector<ProcessId>& known, const std::vector<ProcessId>& fresh);

// Whether `p` is still the process it was: alive (a zombie is not) with the same start time.
bool still_running(const ProcessId& p);

// Kills the tree of `root` (no root when 0) and `known` (collected earlier; each only while it is
// still the process it was) with every descendant they have now. Each is stopped first, and the
// table read again until no new descendant appears, so none escapes by starting another; then all
// get SIGKILL. Returns them. A zombie is left to its parent to reap (the root's, to the caller;
// reap_children for those re-parented to this process).
std::vector<ProcessId> kill_tree(pid_t root, const std::vector<ProcessId>& known);

// Makes this process the reaper of the orphans below it (Linux's PR_SET_CHILD_SUBREAPER): a
// worker's descendant that detaches (a session of its own, a double fork) and outlives its parent is
// re-parented to this process instead of init, so it is still found, and ended, with its worker.
// false where the system has no such thing.
bool become_subreaper();

// Whether `pid`'s environment (as it was started) holds the entry `entry` ("NAME=value") exactly;
// false when it cannot be read (another user's process, a zombie).
bool environment_holds(pid_t pid, std::string_view entry);

// Reaps each of `ended` that is, or becomes within `seconds` (its own parent reaped first), a child
// of this process, leaving no zombie of a killed tree behind. Never waits for a process that is
// not one of `ended`.
void reap_children(std::vector<ProcessId> ended, double seconds);

}  // namespace tally::run
