// The lock of an op graph: taken once per recorded call to append, and by a materialization while
// it plans from the graph.
#pragma once

#include <atomic>
#include <thread>

namespace torchdefer {

// Note [The graph's lock]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Every recorded call takes its graph's lock to append its node (Note [Recording an op] in
// recording.cpp), and a materialization holds it while it plans. It is nearly always free: one
// thread records, and planning comes after. A std::mutex costs two calls into the C library and
// two atomic read-modify-writes per call; measured side by side in BM_RecordAlternating on a
// Llama-70B construction, recording took ~1.5% longer with it (docs/results.md). This lock is one
// atomic exchange to take and one release store to give back. A thread that finds it taken spins
// on a plain load and yields the processor between looks: a thread recording into a graph that
// another thread is planning from waits for the plan, as it did, and spends its time slices
// looking. Not recursive, like the std::mutex it replaces.
class GraphMutex {
 public:
  void lock() noexcept {
    while (taken_.exchange(true, std::memory_order_acquire)) {
      while (taken_.load(std::memory_order_relaxed)) {
        std::this_thread::yield();
      }
    }
  }
  bool try_lock() noexcept { return !taken_.exchange(true, std::memory_order_acquire); }
  void unlock() noexcept { taken_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> taken_{false};
};

}  // namespace torchdefer
