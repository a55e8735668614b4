#include <torchdefer/generator_sharing.h>

#include <c10/util/Exception.h>

#include <mutex>

#include <pthread.h>

namespace torchdefer::detail {
namespace {

// Note [A recording and a torch-mode replay on two threads]: counts in the process and on this
// thread, so that a thread's own recording and replay never refuse each other.
struct Users {
  std::mutex mutex;
  int recordings = 0;
  int replays = 0;
};

thread_local int my_recordings = 0;
thread_local int my_replays = 0;

// A child forked while other threads record or replay has only the forking thread, whose counts
// are the child's: the mutex is held across fork() and the counts reset in the child.
Users* the_users = nullptr;
void lock_for_fork() { the_users->mutex.lock(); }
void unlock_after_fork() { the_users->mutex.unlock(); }
void reset_in_child() {
  the_users->recordings = my_recordings;
  the_users->replays = my_replays;
  the_users->mutex.unlock();
}

Users& users() {
  // Never destroyed: marks can end at thread exit.
  static Users* const all = [] {
    the_users = new Users();
    pthread_atfork(lock_for_fork, unlock_after_fork, reset_in_child);
    return the_users;
  }();
  return *all;
}

// Counts this thread in as one more of `kind` (recordings or replays), refused with `refusal`
// while another thread is one of `other`.
void count_in(int Users::*kind, int& mine, int Users::*other, int others_mine,
              const char* refusal) {
  Users& all = users();
  const std::lock_guard<std::mutex> lock(all.mutex);
  TORCH_CHECK(all.*other == others_mine, refusal);
  ++(all.*kind);
  ++mine;
}

void count_out(int Users::*kind, int& mine) {
  Users& all = users();
  const std::lock_guard<std::mutex> lock(all.mutex);
  --(all.*kind);
  --mine;
}

}  // namespace

void enter_recording() {
  count_in(&Users::recordings, my_recordings, &Users::replays, my_replays,
           "torchdefer: deferred_init cannot record while another thread materializes or reads "
           "values in torch RNG mode: that replay lends itself the default CPU generator, and the "
           "recording would place its random ops from the lent states instead of eager's. Record "
           "after that materialization ends, or materialize with rng=\"counter\" there.");
}

void leave_recording() { count_out(&Users::recordings, my_recordings); }

TorchModeReplayMark::TorchModeReplayMark() {
  count_in(&Users::replays, my_replays, &Users::recordings, my_recordings,
           "torchdefer: cannot materialize or read values in torch RNG mode while another thread "
           "is inside deferred_init: the replay lends itself the default CPU generator, and that "
           "recording would place its random ops from the lent states instead of eager's. "
           "Materialize after that deferred_init returns, or with rng=\"counter\".");
}

TorchModeReplayMark::~TorchModeReplayMark() { count_out(&Users::replays, my_replays); }

}  // namespace torchdefer::detail
