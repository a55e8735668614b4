// torchdefer._C: the Python face of the C++ library. The pure-Python package (bindings/torchdefer)
// builds the user-facing API on these functions.
#include <torchdefer/extension.h>
#include <torchdefer/torchdefer.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/device_lazy_init.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace torchdefer {
namespace {

// Note [A scope dropped on another thread] (api/src/extension.cpp): a block entered and never
// exited is dropped by whichever thread releases it last, which cannot end another thread's scope.
void abandon(std::unique_ptr<RecordingScope> scope) { abandon_on_another_thread(std::move(scope)); }
void abandon(std::unique_ptr<FakeMode> mode) { (void)mode.release(); }

// A context manager around an RAII scope: entering makes it, exiting destroys it, on the thread
// that entered (Note [A scope dropped on another thread]). `what` names it in errors.
template <typename Scope>
class PyScope {
 public:
  PyScope(const char* what, std::function<std::unique_ptr<Scope>()> make)
      : what_(what), make_(std::move(make)) {}
  PyScope(const PyScope&) = delete;
  PyScope& operator=(const PyScope&) = delete;
  PyScope(PyScope&&) = default;
  PyScope& operator=(PyScope&&) = default;
  ~PyScope() {
    if (scope_ && std::this_thread::get_id() != owner_) {
      abandon(std::move(scope_));
    }
  }
  void enter() {
    TORCH_CHECK(!scope_, "torchdefer: this ", what_, " is already active");
    scope_ = make_();
    owner_ = std::this_thread::get_id();
  }
  void exit() { scope_.reset(); }

 private:
  const char* what_;
  std::function<std::unique_ptr<Scope>()> make_;
  std::unique_ptr<Scope> scope_;
  std::thread::id owner_;
};

using RecordingContext = PyScope<RecordingScope>;
using FakeModeContext = PyScope<FakeMode>;

// A checkpoint implemented in Python (a DCP directory, a mapping; bindings/torchdefer/
// _checkpoint.py): its tensors' shapes and dtypes, and a callable read(name, start, stop, out)
// that fills `out` with that box. Reads run without the GIL, so each call takes it, and so does
// dropping the callable.
class PythonCheckpoint final : public CheckpointReader {
 public:
  PythonCheckpoint(std::map<std::string, CheckpointTensor> tensors, py::function read,
                   py::object read_all)
      : tensors_(std::move(tensors)), read_(std::move(read)), read_all_(std::move(read_all)) {}
  ~PythonCheckpoint() override {
    py::gil_scoped_acquire gil;
    read_ = py::function();
    read_all_ = py::none();
  }

  const std::map<std::string, CheckpointTensor>& tensors() const override { return tensors_; }

  void read(const std::string& name, const Box& box, const at::Tensor& out) const override {
    py::gil_scoped_acquire gil;
    read_(name, box.start, box.stop, out);
  }

  // One call of the Python read_all with [(name, start, stop, out)], when there is one.
  void read_all(const std::vector<CheckpointRead>& reads) const override {
    py::gil_scoped_acquire gil;
    if (read_all_.is_none()) {
      CheckpointReader::read_all(reads);
      return;
    }
    py::list batch;
    for (const CheckpointRead& r : reads) {
      batch.append(py::make_tuple(r.name, r.box.start, r.box.stop, r.out));
    }
    read_all_(batch);
  }

 private:
  std::map<std::string, CheckpointTensor> tensors_;
  py::function read_;
  py::object read_all_;  // None, or a callable taking the batch
};

// Boxes by qualified name, as Python passes them: {name: (start, stop)}.
using NamedBoxes =
    std::unordered_map<std::string, std::pair<std::vector<int64_t>, std::vector<int64_t>>>;

// A Python progress callable as a MaterializeOptions::progress callback. The replay runs without
// the GIL, so each call takes it; the callable is held through a shared_ptr so that copies of
// the options never touch Python reference counts without the GIL. An exception it raises
// propagates out of the replay, which then leaves everything fake (Note [Progress]).
std::function<void(const MaterializeProgress&)> python_progress(py::function progress) {
  auto callable = std::make_shared<py::function>(std::move(progress));
  return [callable](const MaterializeProgress& p) {
    py::gil_scoped_acquire gil;
    (*callable)(p.done, p.total, p.op);
  };
}

MaterializeOptions make_options(std::optional<c10::Device> device, std::optional<std::string> rng,
                                std::optional<uint64_t> counter_seed, std::optional<Shard> shard,
                                std::optional<NamedBoxes> regions,
                                std::optional<py::function> progress) {
  MaterializeOptions options;
  if (device) {
    options.device(*device);
  }
  if (rng) {
    TORCH_CHECK(*rng == "torch" || *rng == "counter", "torchdefer: rng must be \"torch\" or ",
                "\"counter\", got \"", *rng, "\"");
    options.rng(*rng == "torch" ? RngMode::kTorch : RngMode::kCounter);
  }
  if (counter_seed) {
    options.counter_seed(*counter_seed);
  }
  if (shard) {
    options.shard(*shard);
  }
  if (regions) {
    options.region([boxes = std::move(*regions)](const std::string& name, c10::IntArrayRef) {
      const auto it = boxes.find(name);
      return it == boxes.end() ? std::nullopt
                               : std::optional<Box>(Box{it->second.first, it->second.second});
    });
  }
  if (progress) {
    options.progress(python_progress(std::move(*progress)));
  }
  return options;
}

py::dict stats_to_dict(const TensorStats& t) {
  py::dict d;
  d["name"] = t.name;
  d["global_shape"] = t.global_sizes;
  if (t.box) {
    d["box"] = py::make_tuple(t.box->start, t.box->stop);
  } else {
    d["box"] = py::none();
  }
  d["sliced"] = t.sliced;
  d["fallback"] = t.fallback;
  d["bytes_computed"] = t.bytes_computed;
  d["bytes_kept"] = t.bytes_kept;
  d["source"] = t.source;
  d["counter_scheme"] = t.counter_scheme;
  return d;
}

// Note [Swapping a Python generator]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A torch.Generator object holds its at::Generator by value, and every use of the object (a
// method, an op given it) reads that member. So following a generator (Note [Followed
// generators]) replaces the member with a FollowedGenerator of the same state: every Python
// reference to the object uses the followed generator from then on. The Python package does it
// for the generator of a trunc_normal_ it records, the sampler whose draws depend on its values;
// a generator already followed, the default one and other devices' are left as they are. A C++
// holder of the object's implementation from before the swap keeps the old one, which no longer
// moves with the object. An object torch maps its implementation to (pyobj(), set for the objects
// it wraps itself) is mapped to the new one. Only under the GIL, which every method of the object
// holds too.
void follow_python_generator(py::handle object) {
  TORCH_CHECK(THPGenerator_Check(object.ptr()), "torchdefer: expected a torch.Generator, got ",
              py::str(py::type::of(object)).cast<std::string>());
  auto* python = reinterpret_cast<THPGenerator*>(object.ptr());
  const at::Generator& generator = python->cdata;
  if (!generator.device().is_cpu() ||
      generator.unsafeGetGeneratorImpl() ==
          at::detail::getDefaultCPUGenerator().unsafeGetGeneratorImpl()) {
    return;
  }
  at::Generator followed = followed_generator_of(generator);
  if (generator.pyobj() == object.ptr()) {  // the object torch maps this implementation to
    generator.set_pyobj(nullptr);
    followed.set_pyobj(object.ptr());
  }
  python->cdata = std::move(followed);
}

}  // namespace
}  // namespace torchdefer

PYBIND11_MODULE(_C, m) {
  using namespace torchdefer;
  m.doc() = "torchdefer's C++ core; use the torchdefer package instead.";

  py::class_<RecordingContext>(m, "_RecordingScope")
      .def(py::init([](std::string name, bool exact_generator, bool cuda_generator) {
             return RecordingContext("context manager", [name, exact_generator, cuda_generator] {
               return std::make_unique<RecordingScope>(
                   name, DeferredInitOptions()
                             .exact_generator(exact_generator)
                             .cuda_draws(cuda_generator ? CudaDraws::kCudaGenerator
                                                        : CudaDraws::kCpuGenerator));
             });
           }),
           py::arg("name"), py::arg("exact_generator") = false, py::arg("cuda_generator") = false)
      .def("__enter__", &RecordingContext::enter)
      .def("__exit__", [](RecordingContext& self, py::args) { self.exit(); });

  m.def("_follow_generator", &follow_python_generator, py::arg("generator"),
        "Makes a CPU torch.Generator one that recordings follow (Note [Followed generators]).");

  m.def("_settle_default_generator", &settle_default_generator, py::arg("about_to_read") = true,
        "Applies this thread's recorded draws to the default CPU generator now.");

  m.def("_pay_cuda_generator_debts", &pay_cuda_generator_debts,
        py::call_guard<py::gil_scoped_release>(),
        "Leaves every CUDA generator recordings owe where eager construction has it now.");

  py::class_<FakeModeContext>(m, "_FakeMode")
      .def(py::init([](std::optional<c10::Device> device) {
        return FakeModeContext("fake_mode", [device] {
          return device ? std::make_unique<FakeMode>(*device) : std::make_unique<FakeMode>();
        });
      }))
      .def("__enter__", &FakeModeContext::enter)
      .def("__exit__", [](FakeModeContext& self, py::args) { self.exit(); });

  py::class_<Shard>(m, "Shard",
                    "Shard(rank, world_size, dim=0, padded=False): rank `rank` of `world_size` "
                    "slices every parameter along `dim` with torch.chunk semantics. Tensors with "
                    "no dimension `dim` stay whole; with padded=True each local tensor has the "
                    "chunk size along `dim`, zeros past the end (as FSDP2 pads).")
      .def(py::init<int64_t, int64_t, int64_t, bool>(), py::arg("rank"), py::arg("world_size"),
           py::arg("dim") = 0, py::arg("padded") = false)
      .def_readonly("rank", &Shard::rank)
      .def_readonly("world_size", &Shard::world_size)
      .def_readonly("dim", &Shard::dim)
      .def_readonly("padded", &Shard::padded)
      .def("__repr__", [](const Shard& s) {
        return "Shard(rank=" + std::to_string(s.rank) +
               ", world_size=" + std::to_string(s.world_size) + ", dim=" + std::to_string(s.dim) +
               ", padded=" + (s.padded ? "True" : "False") + ")";
      });

  m.def("is_fake", [](const at::Tensor& t) { return is_fake(t); });
  // Note [Inference mode while recording]: deferred_init refuses a returned module tensor eager
  // made as an inference tensor, looking only when a recording made one.
  m.def("_made_in_inference_mode", [](const at::Tensor& t) { return made_in_inference_mode(t); });
  m.def("_refuse_inference_tensor", [](const std::string& what) { refuse_inference_tensor(what); });
  m.def("_inference_tensors_made", [] { return inference_tensors_made(); });
  // A tensor that carries a fake's dispatch keys without being a fake: what `real.data = fake`
  // leaves behind (torch shallow-copies the fake's metadata into the real TensorImpl).
  m.def("_is_neither_real_nor_fake", [](const at::Tensor& t) { return has_fake_metadata_only(t); });
  // Whether torch's Python factories must initialize CUDA before creating a CUDA tensor; the
  // package clears it around the calls of a recording thread where CUDA is unavailable (Note [What
  // recording changes, and where] in bindings/torchdefer/_recording.py).
  m.def("_set_requires_cuda_init",
        [](bool required) { torch::utils::set_requires_device_init(at::kCUDA, required); });
  // (identity, nbytes) of a fake's storage, or None for a tensor that is not fake: what deepcopy
  // keys its storage copies by (bindings/torchdefer/_deepcopy.py).
  m.def("_fake_storage", [](const at::Tensor& t) -> py::object {
    const FakeStorage storage = fake_storage(t);
    if (storage.identity == nullptr) {
      return py::none();
    }
    return py::make_tuple(reinterpret_cast<std::uintptr_t>(storage.identity), storage.nbytes);
  });
  m.def("can_materialize", [](const at::Tensor& t) { return can_materialize(t); });
  m.def("describe", [](const at::Tensor& t) { return describe(t); });
  m.def("explain", [](const at::Tensor& t) { return explain(t); });
  // Without the GIL: a replay may wait for another thread's (Note [Replays that lend themselves the
  // default generator]), which may need it.
  m.def(
      "read_values", [](const at::Tensor& t) { return read_values(t); },
      py::call_guard<py::gil_scoped_release>());
  m.def("shard_info", [](const at::Tensor& t) -> py::object {
    const std::optional<ShardInfo> info = shard_info(t);
    if (!info) {
      return py::none();
    }
    py::dict d;
    d["global_shape"] = info->global_sizes;
    d["box"] = py::make_tuple(info->box.start, info->box.stop);
    d["padded"] = info->padded;
    return std::move(d);
  });
  py::class_<CheckpointReader, std::shared_ptr<CheckpointReader>>(m, "_CheckpointReader")
      .def("tensors", [](const CheckpointReader& reader) {
        py::dict d;
        for (const auto& [name, t] : reader.tensors()) {
          d[py::str(name)] = py::make_tuple(t.sizes, t.dtype);
        }
        return d;
      });
  m.def("_open_safetensors", &open_safetensors, py::arg("path"));
  m.def(
      "_python_checkpoint",
      [](const std::map<std::string, std::pair<std::vector<int64_t>, at::ScalarType>>& tensors,
         py::function read, py::object read_all) -> std::shared_ptr<CheckpointReader> {
        std::map<std::string, CheckpointTensor> meta;
        for (const auto& [name, t] : tensors) {
          meta.emplace(name, CheckpointTensor{t.first, t.second});
        }
        return std::make_shared<PythonCheckpoint>(std::move(meta), std::move(read),
                                                  std::move(read_all));
      },
      py::arg("tensors"), py::arg("read"), py::arg("read_all") = py::none());
  m.def(
      "materialize_named",
      [](const std::vector<std::tuple<std::string, at::Tensor, bool>>& entries,
         std::optional<c10::Device> device, std::optional<std::string> rng,
         std::optional<uint64_t> counter_seed, std::optional<Shard> shard,
         std::optional<NamedBoxes> regions, std::optional<py::function> progress,
         std::shared_ptr<CheckpointReader> checkpoint, const std::string& checkpoint_prefix,
         bool strict,
         const std::vector<std::tuple<std::string, at::Tensor, bool>>& module_entries) {
        std::vector<NamedTensor> tensors;
        for (const auto& [name, tensor, parameter] : entries) {
          tensors.push_back({name, tensor, parameter});
        }
        std::vector<NamedTensor> module_tensors;
        for (const auto& [name, tensor, parameter] : module_entries) {
          module_tensors.push_back({name, tensor, parameter});
        }
        MaterializeOptions options =
            make_options(device, rng, counter_seed, shard, std::move(regions), std::move(progress));
        if (checkpoint) {
          options.checkpoint(std::move(checkpoint), checkpoint_prefix).strict(strict);
        }
        MaterializeStats stats;
        {
          py::gil_scoped_release no_gil;
          stats = module_tensors.empty()
                      ? materialize_named_tensors(tensors, options)
                      : materialize_named_tensors(tensors, module_tensors, options);
        }
        py::list result;
        for (const TensorStats& t : stats.tensors) {
          result.append(stats_to_dict(t));
        }
        return result;
      },
      py::arg("entries"), py::arg("device") = py::none(), py::arg("rng") = py::none(),
      py::arg("counter_seed") = py::none(), py::arg("shard") = py::none(),
      py::arg("regions") = py::none(), py::arg("progress") = py::none(),
      py::arg("checkpoint") = nullptr, py::arg("checkpoint_prefix") = "", py::arg("strict") = true,
      py::arg("module_entries") = std::vector<std::tuple<std::string, at::Tensor, bool>>{});
  m.def("counter_fill_cpu_capability", [] { return counter_fill_cpu_capability(); });
  m.def("has_cuda_kernels", [] { return has_cuda_kernels(); });
  m.def("counter_scheme_version", [] { return counter_scheme_version(); });
}
