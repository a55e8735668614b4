// Ranks in separate processes: each materializes its own shard of the same recording; an
// all-gather through a c10d FileStore equals a full materialization on every rank.
#include <gtest/gtest.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

extern char** environ;

namespace {

int run_ranks(int world, int dim) {
  const std::string store = "/tmp/torchdefer_store_" + std::to_string(getpid()) + "_" +
                            std::to_string(world) + "_" + std::to_string(dim);
  std::remove(store.c_str());
  std::vector<pid_t> children;
  for (int rank = 0; rank < world; ++rank) {
    std::vector<std::string> args = {TORCHDEFER_RANK_EXE, store, std::to_string(rank),
                                     std::to_string(world), std::to_string(dim)};
    std::vector<char*> argv;
    for (std::string& a : args) {
      argv.push_back(a.data());
    }
    argv.push_back(nullptr);
    pid_t child = 0;
    if (posix_spawn(&child, argv[0], nullptr, nullptr, argv.data(), environ) != 0) {
      return -1;
    }
    children.push_back(child);
  }
  int failures = 0;
  for (pid_t child : children) {
    int status = 0;
    waitpid(child, &status, 0);
    failures += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::remove(store.c_str());
  return failures;
}

TEST(MultiProcess, TwoRanksGatherToTheFullModel) { EXPECT_EQ(run_ranks(2, 0), 0); }

TEST(MultiProcess, FourRanksGatherToTheFullModelAlongDimOne) { EXPECT_EQ(run_ranks(4, 1), 0); }

}  // namespace
