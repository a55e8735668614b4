// Note [Replays that lend themselves the default generator]: such a replay beside a recording or
// another such replay on another thread is refused at whichever starts second; one thread may do
// all of them.
#include <torchdefer/deferred_init.h>
#include <torchdefer/generator_sharing.h>

#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <condition_variable>
#include <mutex>
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

TEST(GeneratorSharing, AReplayOnTheDefaultGeneratorIsRefusedWhileAnotherThreadRunsOne) {
  while_another_thread_holds(
      [](auto wait) {
        detail::DefaultGeneratorReplayMark replaying("aten::uniform_", true);
        wait();
      },
      [] {
        try {
          detail::DefaultGeneratorReplayMark replaying("aten::randperm", false);
          FAIL() << "a second replay on the default generator started beside another thread's";
        } catch (const c10::Error& e) {
          const std::string message = e.what();
          EXPECT_NE(message.find("aten::randperm"), std::string::npos) << message;
          EXPECT_NE(message.find("one after the other"), std::string::npos) << message;
          EXPECT_EQ(message.find("rng=\"counter\""), std::string::npos) << message;
        }
      });
  detail::DefaultGeneratorReplayMark afterwards("aten::uniform_", true);
}

TEST(GeneratorSharing, OneThreadMayRecordAndReplayOnTheDefaultGeneratorAtOnce) {
  RecordingScope recording("a recording");
  detail::DefaultGeneratorReplayMark replaying("aten::uniform_", true);
  detail::DefaultGeneratorReplayMark nested_replay("aten::normal_", true);
  RecordingScope nested("a nested recording");
}

}  // namespace
}  // namespace torchdefer
