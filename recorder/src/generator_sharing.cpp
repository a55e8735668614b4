#include <torchdefer/generator_sharing.h>

#include <c10/util/Exception.h>

#include <condition_variable>
#include <mutex>
#include <new>
#include <string>

#include <pthread.h>

namespace torchdefer::detail {
namespace {

// Note [Replays that lend themselves the default generator]: counts in the process and on this
// thread, so that a thread's own recordings and replays never refuse each other.
struct Users {
  std::mutex mutex;
  std::condition_variable replay_ended;  // what a replay waiting for another thread's waits on
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
  // Made anew, not destroyed: the parent's threads that waited on it are not in the child.
  new (&the_users->replay_ended) std::condition_variable();
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

void count_out(int Users::*kind, int& mine) {
  Users& all = users();
  {
    const std::lock_guard<std::mutex> lock(all.mutex);
    --(all.*kind);
    --mine;
  }
  all.replay_ended.notify_all();
}

// Counts this thread in as one more recording, or refuses with `refusal` while another thread's
// replay lends itself the default generator.
void count_in_recording(const std::string& refusal) {
  Users& all = users();
  const std::lock_guard<std::mutex> lock(all.mutex);
  TORCH_CHECK(all.replays == my_replays, refusal);
  ++all.recordings;
  ++my_recordings;
}

constexpr const char* kLentGenerator =
    "another thread materializes or reads values with random ops that draw from the default CPU "
    "generator: that replay lends itself the generator, and ";

}  // namespace

void enter_recording() {
  count_in_recording(std::string("torchdefer: deferred_init cannot record while ") +
                     kLentGenerator +
                     "the recording would place its random ops from the lent states instead of "
                     "eager's. Record after that materialization ends, or materialize there with "
                     "rng=\"counter\" (which draws from the default generator only for ops with "
                     "no counter definition: randperm, multinomial).");
}

void leave_recording() { count_out(&Users::recordings, my_recordings); }

void forget_recording_of_another_thread() {
  Users& all = users();
  {
    const std::lock_guard<std::mutex> lock(all.mutex);
    --all.recordings;
  }
  all.replay_ended.notify_all();
}

RandomOpAfterReturnMark::RandomOpAfterReturnMark(const std::string& op) {
  count_in_recording("torchdefer: cannot record " + op + " on a deferred model's fakes while " +
                     kLentGenerator +
                     "the op would be placed from a lent state instead of where eager draws it. "
                     "Record it after that materialization ends, or materialize there with "
                     "rng=\"counter\".");
}

RandomOpAfterReturnMark::~RandomOpAfterReturnMark() {
  count_out(&Users::recordings, my_recordings);
}

DefaultGeneratorReplayMark::DefaultGeneratorReplayMark(const std::string& first_op,
                                                       bool counter_is_a_way_out) {
  Users& all = users();
  std::unique_lock<std::mutex> lock(all.mutex);
  all.replay_ended.wait(
      lock, [&] { return all.replays == my_replays || all.recordings != my_recordings; });
  TORCH_CHECK(all.recordings == my_recordings, "torchdefer: cannot materialize or read values (",
              first_op,
              " may draw from the default CPU generator) while another thread is inside "
              "deferred_init or records a random op on a deferred model's fakes: the replay lends "
              "itself the generator, and that recording would place its random ops from the lent "
              "states instead of eager's. Materialize after that recording ends",
              counter_is_a_way_out ? ", or with rng=\"counter\"." : ".");
  ++all.replays;
  ++my_replays;
}

DefaultGeneratorReplayMark::~DefaultGeneratorReplayMark() {
  count_out(&Users::replays, my_replays);
}

}  // namespace torchdefer::detail
