// RNG anchors: the default-generator states a recording's random ops are placed from in torch RNG
// mode, known when recorded or computed when first needed, and the generator owed to eager.
#pragma once

#include <torchdefer/op_graph.h>

#include <ATen/core/MT19937RNGEngine.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>

namespace torchdefer {

// Note [Lazy RNG anchors]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A random op whose number of draws depends on values (torchdefer::trunc_normal_, PyTorch 2.13's
// rejection sampler; the kernels whose draws plan_draws() cannot count from the shape) is recorded
// like any other op and never run at record time. It starts at a known place on the chain (an
// anchor plus an offset); the random ops after it are placed relative to a *lazy* anchor: the
// generator state right after the sampler. That state exists only once the sampler's values do,
// so the anchor is resolved when a torch-mode replay first needs it: a replay that runs the
// sampler on CPU anyway hands it the state that follows for free; otherwise the sampler runs once
// on a CPU scratch tensor of its own geometry from its start (Note [Torch-mode draw offsets]).
// Either way it happens once per anchor, under one process-wide lock, and is cached; and since
// every anchor is a pure function of the anchors before it, any subset of the recording
// materializes with eager's bits in any order. Counter mode places nothing on the chain and never
// resolves an anchor.
//
// An anchor names the anchor it continues from by pointer, never its graph: anchors form a chain
// back in time and cannot form a cycle, even across recordings (a recording that starts while an
// earlier one still owes the generator its draws continues from that earlier lazy anchor).
//
// The sampler is resolved with its recorded arguments; a value-dependent sampler that reads
// another fake of a recording (multinomial of recorded probabilities) cannot be resolved this way:
// it is never lazy, and runs on scratch from its inputs' values when recorded.
struct RngAnchor {
  // Known: a full state of the default CPU generator (get_state()).
  static std::shared_ptr<RngAnchor> known(at::Tensor state);
  // Known once `state` is ready, with nothing to compute: where a jump still being made leaves
  // the generator (Note [A recording that starts during a jump] in recorder/src/background_jump.h).
  static std::shared_ptr<RngAnchor> known_later(std::shared_future<at::Tensor> state);
  // Lazy: `offset` draws after `base`, and then `sampler` (if any) run on scratch. The anchors of
  // a generator given as argument `generator_argument` of the sampler (Note [Followed
  // generators]) are states of that generator: they are resolved on a private generator, never
  // the default one, and the anchor holds none of the sampler's generators.
  static std::shared_ptr<RngAnchor> after(std::shared_ptr<RngAnchor> base, uint64_t offset,
                                          std::optional<RecordedNode> sampler,
                                          const at::Tensor& sampler_target,
                                          int64_t generator_argument = -1);

  // The state, computed first if it is lazy (once, thread-safe).
  at::Tensor state();
  bool resolved() const;
  // A replay that ran the sampler on CPU offers the state that followed it.
  void offer(const at::Tensor& state);

  // What a lazy anchor waits for, for messages ("torchdefer::trunc_normal_ on float[4, 4]").
  std::string pending_samplers() const;

  // The counter-mode key of the random ops placed from this anchor on their own generator (Note
  // [Counter keys of explicit generators]), computed once and never resolving anything: for a
  // known anchor digest_generator_state() of its state, for a lazy one a digest of the anchor it
  // continues from, its offset and its sampler (operator, dtype and sizes).
  uint64_t digest();

 private:
  void forget_sampler() {
    sampler_.reset();
    sampler_arguments_.clear();
    sampler_inputs_.clear();
  }

  at::Tensor state_;
  std::optional<uint64_t> digest_;
  std::shared_future<at::Tensor> later_;
  void resolve(const at::Tensor& start);
  void forget_what_resolution_needed();
  at::Tensor resolve_on_own_generator(const at::Tensor& start);

  std::shared_ptr<RngAnchor> base_;
  uint64_t offset_ = 0;
  int64_t generator_argument_ = -1;
  // The sampler, a view of the two lists after it: the anchor owns what it read.
  std::optional<RecordedNode> sampler_;
  std::vector<c10::IValue> sampler_arguments_;
  std::vector<RecordedInput> sampler_inputs_;
  std::vector<int64_t> target_sizes_;
  std::vector<int64_t> target_strides_;
  c10::ScalarType target_dtype_ = c10::ScalarType::Undefined;
  std::string description_;
  // What the sampler is, with no device in it: part of a lazy anchor's digest, which must not
  // depend on where a rank recorded (Note [Counter keys of explicit generators]).
  std::string sampler_key_;
};

// A 64-bit digest (FNV-1a) of a CPU generator's full state (get_state()): the seed, the position
// in the stream, and nothing else.
uint64_t digest_generator_state(const at::Tensor& state);

// The digest of the position `offset` counted draws after an anchor of digest `anchor`: the
// anchor's own digest at offset 0.
uint64_t digest_position(uint64_t anchor, uint64_t offset);

namespace detail {

// Note [The generator after deferred_init]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Eager construction leaves the default CPU generator somewhere; code after deferred_init that
// draws (dropout masks, data order) should see the same numbers as after eager construction.
// When every recorded draw is counted from shapes, the recorder applies them with one jump at
// scope end, and the generator is exact at once for everyone who locks it, as all of PyTorch does:
// the jump is made on a worker thread that holds the generator's mutex from before deferred_init
// returns until the generator is where eager leaves it (Note [The jump in the background] in
// recorder/src/background_jump.h; exact_generator makes it on the caller's thread, for C++ code
// that reads the generator without its mutex). When the recording ends on a lazy anchor (Note
// [Lazy RNG anchors]), where eager leaves the generator is known only once that anchor is
// resolved, so the generator is *owed*: it stays where the recorder left it, marked as owed (Note
// [The owed generator's mark] in rng_anchors.cpp: a reseed to the same seed must not look like
// an untouched generator), and the debt (the anchor, the draws after it, and the marked engine)
// is paid the first time it can be, exactly as eager would leave it:
//  - when a torch-mode materialization or a value read resolves the anchor, at its end, if nobody
//    moved the generator since;
//  - before an unrecorded random op that the recorder sees (it computes the anchor then), and at
//    the start of the next recording, which continues the chain from the owed state instead.
// If the generator was moved meanwhile by a reseed, the debt is moot, as it would be in eager.
// If it was moved otherwise (someone drew from it), the numbers drawn differ from eager's, as do
// the values of random ops recorded after that draw (they are placed from the moved generator),
// and the debt can no longer be paid: torchdefer warns, naming the samplers, at the first point
// it sees that. Where that is not acceptable, deferred_init(..., exact_generator=True) resolves the
// anchors when the recording ends (eager's cost for those ops, on a scratch tensor) and leaves the
// generator exact at once.
//
// Random ops on a recording's fakes after its deferred_init returned (an init_weights() run after
// construction) are recorded in program order, as eager would draw them there: from the owed
// chain when the generator is owed (and still owed after them), else from the generator's state
// at that point, which they then move as eager does (a value-dependent one leaves it owed, unless
// the recording was made with exact_generator: then it is resolved right after it is recorded,
// at eager's cost for it, and the generator is exact at once). A value read among them resolves
// what it needs and pays the debt when its loan ends, as above.

// Lends the default CPU generator to a computation that moves it (a replay, a value read, an
// anchor's resolution): restores its state afterwards, and when the outermost loan on this thread
// ends, pays the owed generator if its anchor was resolved meanwhile.
class GeneratorLoan {
 public:
  GeneratorLoan();
  ~GeneratorLoan();
  GeneratorLoan(const GeneratorLoan&) = delete;
  GeneratorLoan& operator=(const GeneratorLoan&) = delete;

 private:
  at::Tensor saved_;
};

// The owed generator (Note [The generator after deferred_init]).
struct GeneratorDebt {
  std::shared_ptr<RngAnchor> anchor;
  uint64_t offset = 0;
  at::mt19937_data_pod expected{};  // the engine as the recorder left it
  std::string context;              // the recording that ended owing it
  std::string samplers;             // the ops it waits for, for the warning
  // The graph whose chain ended here and `anchor`'s index in it, so that the chain continues
  // in place when that graph records again.
  std::weak_ptr<OpGraph> graph;
  int64_t graph_anchor = -1;
};

// Replaces the owed generator (nullopt: nothing is owed).
void set_generator_debt(std::optional<GeneratorDebt> debt);
// Takes the owed generator if the default generator is still where the recorder left it; if it
// was moved, drops the debt (warning unless it was reseeded) and returns nullopt.
std::optional<GeneratorDebt> take_generator_debt();
// Resolves the owed generator's anchor now and pays it.
void pay_generator_debt_now();
// pay_generator_debt_now() when the recording whose chain ended owing the generator is one of
// `recordings` and nothing holds it any more (a torch-mode materialization left none of its fakes,
// or it ended with none): nothing of it will be materialized any more, so the samplers whose
// results nothing kept are resolved now (Note [Samplers nothing keeps]).
void pay_generator_debt_of_finished(c10::ArrayRef<std::weak_ptr<OpGraph>> recordings);

// Why a value-dependent sampler cannot be resolved from its recorded arguments (it reads values of
// fakes other than the tensor it fills), if it cannot.
std::optional<std::string> unresolvable_sampler(const RecordedNode& node);

// Runs random op `node` for real on CPU, the tensor it fills a scratch of `sizes`/`strides`/
// `dtype`, drawing from the default generator exactly as eager did (after unresolvable_sampler()
// said it can), or from `generator` given as its argument `generator_argument` when that is set.
void run_sampler_on_scratch(const RecordedNode& node, c10::IntArrayRef sizes,
                            c10::IntArrayRef strides, c10::ScalarType dtype,
                            int64_t generator_argument = -1, const at::Generator& generator = {});

// Whether `now` is the engine `expected` after nothing but a reseed (and draws after it).
bool reseeded(const at::mt19937_data_pod& now, const at::mt19937_data_pod& expected);
bool same_engine(const at::mt19937_data_pod& a, const at::mt19937_data_pod& b);

}  // namespace detail
}  // namespace torchdefer
