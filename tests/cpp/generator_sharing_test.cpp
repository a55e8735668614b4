// Note [A recording and a torch-mode replay on two threads]: the pair is refused at whichever
// starts second; one thread may do both.
#include <torchdefer/deferred_init.h>
#include <torchdefer/generator_sharing.h>

#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <condition_variable>
#include <mutex>
#include <thread>

namespace torchdefer {
namespace {

// Runs `hold` on another thread, which keeps it until `body` on this thread returns.
template <typename Hold, typename Body>
void while_another_thread_holds(Hold hold, Body body) {
  std::mutex mutex;
  std::condition_variable changed;
  bool held = false;
  bool done = false;
  std::thread other([&] {
    hold([&] {
      std::unique_lock<std::mutex> lock(mutex);
      held = true;
      changed.notify_all();
      changed.wait(lock, [&] { return done; });
    });
  });
  {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return held; });
  }
  try {
    body();
  } catch (...) {
    {
      const std::lock_guard<std::mutex> lock(mutex);
      done = true;
    }
    changed.notify_all();
    other.join();
    throw;
  }
  {
    const std::lock_guard<std::mutex> lock(mutex);
    done = true;
  }
  changed.notify_all();
  other.join();
}

TEST(GeneratorSharing, ARecordingIsRefusedWhileAnotherThreadReplaysInTorchMode) {
  while_another_thread_holds(
      [](auto wait) {
        detail::TorchModeReplayMark replaying;
        wait();
      },
      [] {
        try {
          RecordingScope scope("a recording");
          FAIL() << "a recording opened during another thread's torch-mode replay";
        } catch (const c10::Error& e) {
          EXPECT_NE(std::string(e.what()).find("rng=\"counter\""), std::string::npos) << e.what();
        }
      });
  RecordingScope afterwards("a recording after the replay");  // nothing left marked
}

TEST(GeneratorSharing, ATorchModeReplayIsRefusedWhileAnotherThreadRecords) {
  while_another_thread_holds(
      [](auto wait) {
        RecordingScope recording("a recording");
        wait();
      },
      [] { EXPECT_THROW(detail::TorchModeReplayMark replaying, c10::Error); });
  detail::TorchModeReplayMark afterwards;
}

TEST(GeneratorSharing, OneThreadMayRecordAndReplayInTorchModeAtOnce) {
  RecordingScope recording("a recording");
  detail::TorchModeReplayMark replaying;
  RecordingScope nested("a nested recording");
}

}  // namespace
}  // namespace torchdefer
