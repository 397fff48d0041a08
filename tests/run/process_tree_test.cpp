// The processes of a worker (run/process_tree.h): found through parent links, whatever session
// they are in, and killed together.
#include "run/process_tree.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace tally::run {
namespace {

TEST(ProcessTree, HoldsEveryDescendantParentsFirstAndNothingElse) {
  const std::vector<ProcessEntry> table = {
      {{10, 1}, 1}, {{11, 2}, 10}, {{12, 3}, 11}, {{13, 4}, 1}, {{14, 5}, 10}, {{15, 6}, 13},
  };
  const std::vector<ProcessId> tree = process_tree(10, table);
  ASSERT_EQ(tree.size(), 4u);
  EXPECT_EQ(tree[0], (ProcessId{10, 1}));
  EXPECT_EQ(tree[1], (ProcessId{11, 2}));
  EXPECT_EQ(tree[2], (ProcessId{14, 5}));
  EXPECT_EQ(tree[3], (ProcessId{12, 3})) << "a grandchild after the children";
  EXPECT_TRUE(process_tree(99, table).empty()) << "no root, no tree";
}

TEST(ProcessTree, TheTableHoldsThisProcessWithItsParent) {
  const std::vector<ProcessEntry> table = process_table();
  const auto self = std::find_if(table.begin(), table.end(), [](const ProcessEntry& e) { return e.id.pid == ::getpid(); });
  ASSERT_NE(self, table.end());
  EXPECT_EQ(self->parent, ::getppid());
  EXPECT_TRUE(still_running(self->id));
  EXPECT_FALSE(still_running({self->id.pid, self->id.start_time + 1})) << "another process by the same id";
  EXPECT_EQ(merge_trees({{self->id.pid, self->id.start_time + 1}}, {}).size(), 0u) << "one that ended is dropped";
  EXPECT_EQ(merge_trees({self->id}, {self->id}).size(), 1u) << "each process once";
}

bool running(pid_t pid) {
  const std::vector<ProcessEntry> table = process_table();
  for (const ProcessEntry& e : table)
    if (e.id.pid == pid) return still_running(e.id);
  return false;
}

// A child that starts a grandchild in a session of its own (as torchrun starts a rank) and
// writes its pid to `pipe`; both sleep.
pid_t start_tree(int pipe_write) {
  const pid_t child = ::fork();
  if (child == 0) {
    const pid_t grandchild = ::fork();
    if (grandchild == 0) {
      ::setsid();
      for (;;) ::pause();
    }
    (void)!::write(pipe_write, &grandchild, sizeof grandchild);
    for (;;) ::pause();
  }
  return child;
}

// start_tree, and the grandchild's pid it reports (0 when the pipe gave none).
pid_t start_tree_and_read(pid_t& grandchild) {
  int pipe[2];
  if (::pipe(pipe) != 0) return -1;
  const pid_t child = start_tree(pipe[1]);
  if (::read(pipe[0], &grandchild, sizeof grandchild) != static_cast<ssize_t>(sizeof grandchild)) grandchild = 0;
  ::close(pipe[0]);
  ::close(pipe[1]);
  return child;
}

TEST(ProcessTree, KillingTheTreeReachesAGrandchildInAnotherSession) {
  pid_t grandchild = 0;
  const pid_t child = start_tree_and_read(grandchild);
  ASSERT_GT(grandchild, 0);
  for (int i = 0; i < 100 && ::getsid(grandchild) != grandchild; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(::getsid(grandchild), grandchild) << "the grandchild leads a session of its own";
  const std::vector<ProcessId> tree = process_tree(child, process_table());
  ASSERT_EQ(tree.size(), 2u);

  kill_tree(child, {});
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  for (int i = 0; i < 200 && running(grandchild); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(running(grandchild));
}

TEST(ProcessTree, KillingTheKnownReachesAnOrphan) {
  pid_t grandchild = 0;
  const pid_t child = start_tree_and_read(grandchild);
  ASSERT_GT(grandchild, 0);
  const std::vector<ProcessId> known = process_tree(child, process_table());
  ASSERT_EQ(known.size(), 2u);
  ::kill(child, SIGKILL);  // the launcher dies first: its child is re-parented, out of its tree
  ::waitpid(child, nullptr, 0);
  EXPECT_TRUE(running(grandchild));
  kill_tree(0, known);
  for (int i = 0; i < 200 && running(grandchild); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(running(grandchild)) << "the orphan was found through the tree recorded before";
}

TEST(ProcessTree, AnOrphanComesBackToItsSubreaperAndIsReapedOnceKilled) {
  ASSERT_TRUE(become_subreaper());
  pid_t grandchild = 0;
  const pid_t child = start_tree_and_read(grandchild);
  ASSERT_GT(grandchild, 0);
  ::kill(child, SIGKILL);  // its parent dies before anyone recorded it: a detached orphan
  ::waitpid(child, nullptr, 0);
  pid_t parent = 0;
  for (int i = 0; i < 200; ++i) {
    for (const ProcessEntry& e : process_table())
      if (e.id.pid == grandchild) parent = e.parent;
    if (parent == ::getpid()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(parent, ::getpid()) << "re-parented to this process, not to init";
  reap_children(kill_tree(grandchild, {}), 2.0);
  EXPECT_FALSE(running(grandchild));
  EXPECT_EQ(::kill(grandchild, 0), -1) << "reaped: no zombie left";
}

TEST(ProcessTree, AProcesssEnvironmentSaysWhoseItIs) {
  const pid_t child = ::fork();
  if (child == 0) {
    char entry[] = "TALLY_WORKER_QUEUE=/tmp/q/world-2";
    char* environment[] = {entry, nullptr};
    ::execle("/bin/sleep", "sleep", "30", static_cast<char*>(nullptr), environment);
    ::_exit(127);
  }
  bool holds = false;
  for (int i = 0; i < 200 && !(holds = environment_holds(child, "TALLY_WORKER_QUEUE=/tmp/q/world-2")); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // until it has exec'd
  EXPECT_TRUE(holds);
  EXPECT_FALSE(environment_holds(child, "TALLY_WORKER_QUEUE=/tmp/q/world-2-2")) << "a whole entry, not a prefix";
  EXPECT_FALSE(environment_holds(child, "TALLY_WORKER_QUEUE=/tmp/q/world")) << "a whole entry, not a prefix";
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_FALSE(environment_holds(child, "TALLY_WORKER_QUEUE=/tmp/q/world-2")) << "a process that is gone holds nothing";
}

}  // namespace
}  // namespace tally::run
