// The op graph's own structures: the lists it appends to, and how it finds a fake's storage.
#include <torchdefer/op_graph.h>
#include <torchdefer/torchdefer.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace torchdefer {
namespace {

// Counts its live instances, so that a test sees each element constructed and destroyed once.
struct Counted {
  explicit Counted(int64_t v) : value(v) { ++live; }
  Counted(const Counted& other) : value(other.value) { ++live; }
  Counted(Counted&& other) noexcept : value(other.value) {
    other.value = -1;
    ++live;
  }
  ~Counted() { --live; }
  int64_t value;
  static inline int64_t live = 0;
};

TEST(StableVector, KeepsEveryElementWhereItWasAppendedAndDestroysEachOnce) {
  const int64_t live_before = Counted::live;
  {
    StableVector<Counted, 2> elements;  // blocks of 4, 8, 16, 32...
    std::vector<const Counted*> addresses;
    // Ends one past a block's end (4 + 8 + 16 + 32 = 60): the last block holds one element.
    for (int64_t i = 0; i < 61; ++i) {
      addresses.push_back(&elements.emplace_back(i));
    }
    EXPECT_EQ(elements.size(), 61u);
    EXPECT_EQ(Counted::live - live_before, 61);
    for (int64_t i = 0; i < 61; ++i) {
      EXPECT_EQ(&elements[i], addresses[i]);
      EXPECT_EQ(elements[i].value, i);
    }
    EXPECT_EQ(elements.front().value, 0);
    EXPECT_EQ(elements.back().value, 60);
  }
  EXPECT_EQ(Counted::live, live_before);
}

// Note [A block table that never moves]: a replay reads what it planned while another thread
// goes on appending. Blocks of one element first, so that the reader runs across many new blocks.
TEST(StableVector, ElementsStayReadableOnAnotherThreadWhileItAppends) {
  StableVector<int64_t, 0> elements;
  std::atomic<size_t> published{0};
  constexpr size_t kCount = size_t{1} << 20;
  std::thread writer([&] {
    for (size_t i = 0; i < kCount; ++i) {
      elements.emplace_back(static_cast<int64_t>(i));
      published.store(i + 1, std::memory_order_release);
    }
  });
  size_t mismatches = 0;
  for (size_t seen = 0; seen < kCount;) {
    seen = published.load(std::memory_order_acquire);
    for (size_t i = seen / 2; i < seen; i += 1 + seen / 64) {
      mismatches += elements[i] != static_cast<int64_t>(i) ? 1 : 0;
    }
  }
  writer.join();
  EXPECT_EQ(mismatches, 0u);
}

TEST(ListArena, MovesEachRunInOnceAndKeepsEarlierRunsWhereTheyWere) {
  const int64_t live_before = Counted::live;
  {
    ListArena<Counted> arena;
    std::vector<c10::ArrayRef<Counted>> runs;
    std::vector<std::vector<int64_t>> expected;
    // Runs of growing length, the last longer than any chunk so far.
    for (int64_t n : {0, 3, 700, 400, 5000, 1}) {
      std::vector<Counted> run;
      std::vector<int64_t> values;
      for (int64_t i = 0; i < n; ++i) {
        run.emplace_back(n * 10000 + i);
        values.push_back(n * 10000 + i);
      }
      runs.push_back(arena.take(run));
      expected.push_back(values);
      for (const Counted& moved_from : run) {
        EXPECT_EQ(moved_from.value, -1);
      }
    }
    for (size_t r = 0; r < runs.size(); ++r) {
      ASSERT_EQ(runs[r].size(), expected[r].size());
      for (size_t i = 0; i < runs[r].size(); ++i) {
        EXPECT_EQ(runs[r][i].value, expected[r][i]);
      }
    }
    EXPECT_EQ(Counted::live - live_before, 0 + 3 + 700 + 400 + 5000 + 1);
  }
  EXPECT_EQ(Counted::live, live_before);
}

TEST(ListArena, KeepsARunConstructedInPlaceAndReusesTheRoomOfOneItsWriterDestroyed) {
  const int64_t live_before = Counted::live;
  {
    ListArena<Counted> arena;
    // A run its writer constructs in place and keeps (Note [A recording's own lists]).
    Counted* kept = arena.room_for(3);
    for (int64_t i = 0; i < 3; ++i) {
      new (kept + i) Counted(10 + i);
    }
    arena.keep(kept + 3);
    // A run its writer abandons: it destroys what it constructed and keeps nothing.
    Counted* abandoned = arena.room_for(2);
    EXPECT_EQ(abandoned, kept + 3);
    new (abandoned) Counted(99);
    std::destroy_n(abandoned, 1);
    // The next run starts where the abandoned one did, and a run longer than the chunk's room
    // starts a chunk of its own, leaving the kept run where it was.
    Counted* next = arena.room_for(2);
    EXPECT_EQ(next, abandoned);
    new (next) Counted(20);
    arena.keep(next + 1);
    Counted* long_run = arena.room_for(5000);
    for (int64_t i = 0; i < 5000; ++i) {
      new (long_run + i) Counted(i);
    }
    arena.keep(long_run + 5000);
    for (int64_t i = 0; i < 3; ++i) {
      EXPECT_EQ(kept[i].value, 10 + i);
    }
    EXPECT_EQ(next->value, 20);
    EXPECT_EQ(long_run[4999].value, 4999);
    EXPECT_EQ(Counted::live - live_before, 3 + 1 + 5000);
  }
  EXPECT_EQ(Counted::live, live_before);
}

int64_t storage_of(const at::Tensor& t) {
  const RecordedFake* rec = recorded(t);
  return rec->graph->values()[rec->value].storage;
}

// Note [Finding a fake's storage]: a view's storage is found through the table, which first indexes
// every storage appended with no lookup (the factories' before it).
TEST(OpGraph, FindsTheStorageOfAViewOfAnyEarlierFactoryOutput) {
  std::vector<at::Tensor> tensors = deferred_init([] {
    std::vector<at::Tensor> made;
    for (int i = 0; i < 40; ++i) {
      made.push_back(torch::zeros({4, 6}));
    }
    made.push_back(made[3].narrow(1, 0, 2));
    made.push_back(torch::ones({5}));
    made.push_back(made[41].view({5, 1}));
    made.push_back(made[0].t());
    return made;
  });
  const OpGraph& graph = *recorded(tensors[0])->graph;
  EXPECT_EQ(graph.storages().size(), 41u);
  EXPECT_EQ(storage_of(tensors[40]), storage_of(tensors[3]));
  EXPECT_EQ(storage_of(tensors[42]), storage_of(tensors[41]));
  EXPECT_EQ(storage_of(tensors[43]), storage_of(tensors[0]));
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(graph.storages()[storage_of(tensors[i])].creator,
              graph.values()[recorded(tensors[i])->value].node);
  }
}

// A write into a fake the graph did not record appends its storage with no creator; a later view
// of that fake finds that storage rather than making another.
TEST(OpGraph, AViewOfAForeignFakeItWroteIntoFindsTheStorageOfThatWrite) {
  at::Tensor foreign;
  {
    FakeMode mode;
    foreign = torch::empty({3, 2});
  }
  const at::Tensor view = deferred_init([&] {
    foreign.fill_(1.0);
    torch::zeros({2});  // a storage appended with no lookup
    return foreign.t();
  });
  const RecordedFake* rec = recorded(view);
  ASSERT_NE(rec, nullptr);
  const OpGraph& graph = *rec->graph;
  ASSERT_EQ(graph.storages().size(), 2u);
  const RecordedStorage& written = graph.storages()[storage_of(view)];
  EXPECT_EQ(written.creator, -1);
  // Written by fill_ only; the last node, t(), returned a view of it.
  EXPECT_EQ(written.writers.size(), 1u);
  EXPECT_EQ(graph.values()[rec->value].node, graph.next_node() - 1);
}

}  // namespace
}  // namespace torchdefer
