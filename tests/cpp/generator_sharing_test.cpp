// Note [Replays that lend themselves the default generator]: such a replay beside a recording on
// another thread is refused at whichever starts second, and waits for another thread's such
// replay to end; one thread may do all of them.
#include <torchdefer/extension.h>
#include <torchdefer/generator_sharing.h>

#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
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

TEST(GeneratorSharing, ARecordingIsRefusedWhileAnotherThreadReplaysOnTheDefaultGenerator) {
  while_another_thread_holds(
      [](auto wait) {
        detail::DefaultGeneratorReplayMark replaying("aten::uniform_", true);
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

TEST(GeneratorSharing, AReplayOnTheDefaultGeneratorIsRefusedWhileAnotherThreadRecords) {
  while_another_thread_holds(
      [](auto wait) {
        RecordingScope recording("a recording");
        wait();
      },
      [] {
        EXPECT_THROW(detail::DefaultGeneratorReplayMark replaying("aten::uniform_", true),
                     c10::Error);
      });
  detail::DefaultGeneratorReplayMark afterwards("aten::uniform_", true);
}

TEST(GeneratorSharing, AReplayOnTheDefaultGeneratorWaitsForAnotherThreadsToEnd) {
  std::atomic<bool> started{false};
  std::optional<std::thread> second;
  while_another_thread_holds(
      [](auto wait) {
        detail::DefaultGeneratorReplayMark replaying("aten::uniform_", true);
        wait();
      },
      [&] {
        second.emplace([&] {
          detail::DefaultGeneratorReplayMark replaying("aten::randperm", false);
          started = true;
        });
        // Long enough for a second replay that did not wait to have started.
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        EXPECT_FALSE(started);
      });
  second->join();
  EXPECT_TRUE(started);
}

TEST(GeneratorSharing, OneThreadMayRecordAndReplayOnTheDefaultGeneratorAtOnce) {
  RecordingScope recording("a recording");
  detail::DefaultGeneratorReplayMark replaying("aten::uniform_", true);
  detail::DefaultGeneratorReplayMark nested_replay("aten::normal_", true);
  RecordingScope nested("a nested recording");
}

}  // namespace
}  // namespace torchdefer
