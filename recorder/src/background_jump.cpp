#include "background_jump.h"

#include <torchdefer/mt19937_jump.h>
#include <torchdefer/rng_anchors.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <pthread.h>

#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>

namespace torchdefer::detail {
namespace {

// Moves the default generator `draws` from `from`, the caller holding its mutex.
void jump_locked(at::CPUGeneratorImpl* impl, const at::mt19937_data_pod& from, uint64_t draws) {
  at::mt19937 engine = impl->engine();
  if (!same_engine(engine.data(), from)) {
    return;  // moved since the recorder left it: the draws are moot
  }
  mt19937_discard(engine, draws);
  impl->set_engine(engine);
}

void jump_now(const at::mt19937_data_pod& from, uint64_t draws) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const std::lock_guard<std::mutex> lock(generator.mutex());
  jump_locked(at::check_generator<at::CPUGeneratorImpl>(generator), from, draws);
}

// The worker thread and the one job it may hold (Note [The jump in the background]).
class Worker {
 public:
  Worker() : thread_([this] { run(); }) {}

  // Hands the jump over once the previous one is done; returns when the worker holds the
  // generator's mutex (or has already finished the jump).
  void hand_over(const at::mt19937_data_pod& from, uint64_t draws) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return phase_ == Phase::kIdle; });
    from_ = from;
    draws_ = draws;
    phase_ = Phase::kHandedOver;
    changed_.notify_all();
    changed_.wait(lock, [&] { return phase_ != Phase::kHandedOver; });
  }

  // Locks the worker with no jump pending: what a fork needs (released by the caller).
  std::unique_lock<std::mutex> idle() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return phase_ == Phase::kIdle; });
    return lock;
  }

  void stop_and_join() {
    {
      std::unique_lock<std::mutex> lock = idle();
      stop_ = true;
      changed_.notify_all();
    }
    thread_.join();
  }

 private:
  enum class Phase { kIdle, kHandedOver, kJumping };

  void run() {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    auto* impl = at::check_generator<at::CPUGeneratorImpl>(generator);
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return stop_ || phase_ == Phase::kHandedOver; });
        if (phase_ != Phase::kHandedOver) {
          return;  // stopped
        }
      }
      // The generator's mutex before our own: hand_over() waits on ours without holding it.
      std::unique_lock<std::mutex> generator_lock(generator.mutex());
      {
        const std::lock_guard<std::mutex> lock(mutex_);
        phase_ = Phase::kJumping;
        changed_.notify_all();  // deferred_init may return now
      }
      jump_locked(impl, from_, draws_);
      generator_lock.unlock();
      const std::lock_guard<std::mutex> lock(mutex_);
      phase_ = Phase::kIdle;  // only once the generator's mutex is free (a fork waits for this)
      changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  Phase phase_ = Phase::kIdle;
  bool stop_ = false;
  at::mt19937_data_pod from_{};
  uint64_t draws_ = 0;
  std::thread thread_;  // last: starts once the members above exist
};

// The process's worker, started on first use. A fork's child replaces it (its thread is not
// there); both only ever happen with one thread using it (the fork holds it idle).
Worker* worker = nullptr;
std::mutex& worker_mutex() {
  static std::mutex mutex;
  return mutex;
}

// Held from the fork's prepare handler to its parent/child handler.
std::unique_lock<std::mutex>& held_for_fork() {
  static std::unique_lock<std::mutex> held;
  return held;
}

void before_fork() {
  worker_mutex().lock();
  if (worker != nullptr) {
    held_for_fork() = worker->idle();
  }
}

void after_fork_in_parent() {
  if (held_for_fork().owns_lock()) {
    held_for_fork().unlock();
  }
  held_for_fork() = {};
  worker_mutex().unlock();
}

void after_fork_in_child() {
  // The Worker and its lock belong to the parent's thread, which the child does not have: the
  // Worker is left as it is (a few kilobytes, never destroyed, so its std::thread is never
  // joined), and the next jump starts a worker of the child's own.
  held_for_fork().release();
  worker = nullptr;
  worker_mutex().unlock();
}

// Set once the worker was stopped at exit: later jumps (from static destructors) run in place.
bool stopped_at_exit = false;

// Stops the worker at exit. Constructed after the default generator, so destroyed before it.
struct Reaper {
  Reaper() {
    at::detail::getDefaultCPUGenerator();
    pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
  }
  ~Reaper() {
    const std::lock_guard<std::mutex> lock(worker_mutex());
    if (worker != nullptr) {
      worker->stop_and_join();
      delete worker;
      worker = nullptr;
    }
    stopped_at_exit = true;
  }
};

// The worker, started if need be; null when none can run (at exit, or no thread could start).
// The caller holds worker_mutex().
Worker* running_worker() {
  static Reaper reaper;
  if (worker == nullptr && !stopped_at_exit) {
    try {
      worker = new Worker();
    } catch (const std::system_error&) {
      return nullptr;
    }
  }
  return worker;
}

}  // namespace

void jump_default_generator_in_background(const at::mt19937_data_pod& from, uint64_t draws) {
  const std::lock_guard<std::mutex> lock(worker_mutex());
  Worker* w = running_worker();
  if (w == nullptr) {
    jump_now(from, draws);
    return;
  }
  w->hand_over(from, draws);
}

void wait_for_background_jump() {
  const std::lock_guard<std::mutex> lock(worker_mutex());
  if (worker != nullptr) {
    worker->idle();
  }
}

}  // namespace torchdefer::detail
