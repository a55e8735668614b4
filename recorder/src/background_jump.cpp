#include "background_jump.h"

#include <torchdefer/mt19937_jump.h>
#include <torchdefer/rng_anchors.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <pthread.h>

#include <condition_variable>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

namespace torchdefer::detail {
namespace {

// The JumpEnd of the jump the worker holds the default generator for, with no other jump queued
// after it; null when the worker does not hold it. Written under the worker's mutex, read
// without it by JumpEnd::held(): the worker clears it before it lets go of the generator, so
// whoever locked the generator since (on this thread, or on one this thread synchronized with)
// reads it cleared.
std::atomic<const JumpEnd*> holding{nullptr};

// Moves the default generator `draws` from `from` (from wherever it is when there is no `from`:
// a jump queued after another while the worker held it), the caller holding its mutex.
void jump_locked(at::CPUGeneratorImpl* impl, const std::optional<at::mt19937_data_pod>& from,
                 uint64_t draws) {
  at::mt19937 engine = impl->engine();
  if (from && !same_engine(engine.data(), *from)) {
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

}  // namespace

bool JumpEnd::held() const { return holding.load(std::memory_order_acquire) == this; }

void JumpEnd::publish(at::Tensor state, const at::mt19937_data_pod& engine) {
  state_ = std::move(state);
  engine_ = engine;
  made_.set_value();  // what state() and engine() wait for
}

namespace {

// The worker thread, the jump it makes and the one that may be queued after it (Note [The jump in
// the background], Note [A recording that starts during a jump]).
class Worker {
 public:
  Worker() : thread_([this] { run(); }) {}

  // Hands a jump from `from` over once the worker is idle; returns when the worker holds the
  // generator's mutex (or has already finished the jump).
  void hand_over(const at::mt19937_data_pod& from, uint64_t draws) {
    std::unique_lock<std::mutex> lock(mutex_);
    start(lock, from, draws);
  }

  // Hands over a jump from where `after` leaves the generator: queued after it while the worker
  // still holds the generator for it, else a jump from its state once the worker is idle.
  void hand_over_after(const std::shared_ptr<const JumpEnd>& after, uint64_t draws) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return !queued_ || holding.load() != after.get(); });
    if (holding.load() == after.get()) {
      queued_ = Job{std::nullopt, draws, std::make_shared<JumpEnd>()};
      holding = queued_->end.get();
      return;
    }
    lock.unlock();
    const at::mt19937_data_pod from = after->engine();  // made before it was let go
    lock.lock();
    start(lock, from, draws);
  }

  // The jump the worker holds the generator for now, if it does.
  std::shared_ptr<const JumpEnd> held() {
    const std::lock_guard<std::mutex> lock(mutex_);
    const std::shared_ptr<JumpEnd>& latest = queued_ ? queued_->end : job_.end;
    return latest != nullptr && holding.load() == latest.get() ? latest : nullptr;
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

  struct Job {
    std::optional<at::mt19937_data_pod> from;  // none: right after the jump before it
    uint64_t draws = 0;
    std::shared_ptr<JumpEnd> end;
  };

  // Starts a jump once the worker is idle, and returns when it holds the generator's mutex.
  void start(std::unique_lock<std::mutex>& lock, const at::mt19937_data_pod& from, uint64_t draws) {
    changed_.wait(lock, [&] { return phase_ == Phase::kIdle; });
    job_ = Job{from, draws, std::make_shared<JumpEnd>()};
    phase_ = Phase::kHandedOver;
    changed_.notify_all();
    changed_.wait(lock, [&] { return phase_ != Phase::kHandedOver; });
  }

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
      Job job;
      {
        const std::lock_guard<std::mutex> lock(mutex_);
        phase_ = Phase::kJumping;
        holding = job_.end.get();
        job = job_;
        changed_.notify_all();  // deferred_init may return now
      }
      while (true) {
        jump_locked(impl, job.from, job.draws);
        job.end->publish(generator.get_state(), impl->engine().data());
        const std::lock_guard<std::mutex> lock(mutex_);
        if (!queued_) {
          holding = nullptr;  // before the generator is let go (JumpEnd::held())
          break;
        }
        job = job_ = std::move(*queued_);  // still held: nobody moved the generator since
        queued_.reset();
        changed_.notify_all();
      }
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
  Job job_;
  std::optional<Job> queued_;
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

void jump_default_generator_in_background(const std::shared_ptr<const JumpEnd>& after,
                                          uint64_t draws) {
  const std::lock_guard<std::mutex> lock(worker_mutex());
  Worker* w = running_worker();
  if (w == nullptr) {
    jump_now(after->engine(), draws);
    return;
  }
  w->hand_over_after(after, draws);
}

std::shared_ptr<const JumpEnd> held_jump() {
  const std::lock_guard<std::mutex> lock(worker_mutex());
  return worker == nullptr ? nullptr : worker->held();
}

}  // namespace torchdefer::detail
