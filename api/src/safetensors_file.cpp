// Reading boxes of tensors out of one .safetensors file (safetensors_file.h).
#include "safetensors_file.h"

#include "json_value.h"

#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

namespace torchdefer::detail {
namespace {

// The format: an 8-byte little-endian header length N, N bytes of JSON mapping each tensor name
// to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the end of the
// header) plus an optional "__metadata__" of strings, then the raw little-endian bytes.
constexpr int64_t kMaxHeaderBytes = 100 << 20;

const std::map<std::string, c10::ScalarType>& dtype_names() {
  static const std::map<std::string, c10::ScalarType> names = {{"F64", c10::kDouble},
                                                               {"F32", c10::kFloat},
                                                               {"F16", c10::kHalf},
                                                               {"BF16", c10::kBFloat16},
                                                               {"I64", c10::kLong},
                                                               {"I32", c10::kInt},
                                                               {"I16", c10::kShort},
                                                               {"I8", c10::kChar},
                                                               {"U8", c10::kByte},
                                                               {"U16", c10::kUInt16},
                                                               {"U32", c10::kUInt32},
                                                               {"U64", c10::kUInt64},
                                                               {"BOOL", c10::kBool},
                                                               {"F8_E4M3", c10::kFloat8_e4m3fn},
                                                               {"F8_E5M2", c10::kFloat8_e5m2},
                                                               {"C64", c10::kComplexFloat}};
  return names;
}

// Row-major strides, in elements, of a tensor of `sizes`.
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * sizes[d + 1];
  }
  return strides;
}

// Note [Reading a box of a safetensors tensor]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A box of a row-major tensor is a sequence of contiguous runs of the file, in the order its
// elements have in the box's own contiguous layout: the innermost dimension the box does not
// cover whole, together with every dimension inside it, is one run; the dimensions outside it
// are iterated. A row shard (Shard(dim=0)) is thus one run, a column shard one run per row. Runs
// are read with pread: straight into the destination when it is a CPU tensor of the file's
// dtype, otherwise through one staging buffer of at most kMaxBufferBytes that is cast and copied
// to the destination (any dtype c10::canCast allows, any device) whenever it fills. Nothing is
// mapped, so no page of the file counts in the process's resident memory; the page cache holds
// what was read, as for any read. Peak memory is the destination plus that buffer.
template <typename Fn>
void for_each_run(const std::vector<int64_t>& sizes, const Box& box, int64_t element_size,
                  Fn&& run) {
  const auto n = static_cast<int64_t>(sizes.size());
  if (n == 0) {
    run(int64_t{0}, element_size);
    return;
  }
  for (const auto d : c10::irange(n)) {
    if (box.stop[d] == box.start[d]) {
      return;
    }
  }
  const std::vector<int64_t> strides = contiguous_strides(sizes);
  int64_t inner = n - 1;
  while (inner > 0 && box.start[inner] == 0 && box.stop[inner] == sizes[inner]) {
    --inner;
  }
  const int64_t run_bytes = (box.stop[inner] - box.start[inner]) * strides[inner] * element_size;
  std::vector<int64_t> index(box.start.begin(), box.start.begin() + inner);
  while (true) {
    int64_t element = box.start[inner] * strides[inner];
    for (const auto d : c10::irange(inner)) {
      element += index[d] * strides[d];
    }
    run(element * element_size, run_bytes);
    int64_t d = inner - 1;
    while (d >= 0 && ++index[d] == box.stop[d]) {
      index[d] = box.start[d];
      --d;
    }
    if (d < 0) {
      return;
    }
  }
}

// Note [Touching the destination just ahead of the read]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The destination is memory the call just allocated, so pread's copy faults in every one of its
// pages, and in this VM (freed memory returns to the host) that first touch, not the copy, is
// where the time goes. Faulting a step of kTouchStep bytes in at once with
// MADV_POPULATE_WRITE and then reading into it, step by step, took 0.86 s where one pread of
// each file took 1.01 s (the checkpoint benchmark's four files, 673 MB, into fresh anonymous
// memory, both ways alternating in one process over 5 rounds, load 7.5-8.3), and gained nothing
// with steps of 16 MB and more: the populated step is still in the cache when pread overwrites
// it. It touches only what pread writes next, so peak memory is unchanged. One populate of a
// whole file, a thread populating ahead, two threads each reading half of a file, and
// transparent huge pages were no faster, or slower. A kernel without MADV_POPULATE_WRITE
// (before 5.14) refuses the advice, and pread faults the pages in as before.
constexpr int64_t kTouchStep = int64_t{2} << 20;

void populate_for_write(char* begin, int64_t nbytes) {
  static const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(begin) + nbytes) / page * page;
  if (first < last) {
    ::madvise(reinterpret_cast<void*>(first), last - first, MADV_POPULATE_WRITE);
  }
}

}  // namespace

// Note [One staging buffer for a batch]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A read that casts stages the file's bytes in a buffer of up to kMaxBufferBytes. Allocated
// per tensor, each buffer would be fresh memory whose first touch costs more than the read
// (Note [Touching the destination just ahead of the read]), paid again for every tensor: a
// float32 checkpoint read into a bfloat16 model would fault in as many staging pages as the
// file has. The reads of one read_all share one buffer instead, so its pages are faulted in
// once. It is not zero-filled: pread overwrites every byte that is cast.
char* StagingBuffer::reserve(int64_t nbytes) {
  if (nbytes > size_) {
    data_.reset();
    data_.reset(new char[static_cast<size_t>(nbytes)]);
    size_ = nbytes;
  }
  return data_.get();
}

c10::ScalarType safetensors_dtype(const std::string& name, const std::string& what) {
  const auto it = dtype_names().find(name);
  TORCH_CHECK(it != dtype_names().end(), "torchdefer: ", what, " has dtype \"", name,
              "\", which torchdefer does not read (supported: F64, F32, F16, BF16, I64, I32, I16, "
              "I8, U8, U16, U32, U64, BOOL, F8_E4M3, F8_E5M2, C64)");
  return it->second;
}

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd_ >= 0, "torchdefer: cannot open the checkpoint file ", path_, ": ",
              std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int error = errno;
    ::close(fd_);
    TORCH_CHECK(false, "torchdefer: cannot stat ", path_, ": ", std::strerror(error));
  }
  file_size_ = st.st_size;
  try {
    parse_header();
  } catch (...) {
    ::close(fd_);
    throw;
  }
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
}

SafetensorsFile::~SafetensorsFile() { ::close(fd_); }

void SafetensorsFile::pread_exact(char* destination, int64_t nbytes, int64_t offset,
                                  const std::string& name) const {
  constexpr int64_t kMaxCall = int64_t{1} << 30;  // Linux transfers at most ~2 GiB per call
  while (nbytes > 0) {
    const ssize_t got = ::pread(fd_, destination, std::min(nbytes, kMaxCall), offset);
    if (got < 0 && errno == EINTR) {
      continue;
    }
    TORCH_CHECK(got > 0, "torchdefer: cannot read '", name, "' from ", path_, " at byte ", offset,
                ": ", got == 0 ? "the file ends early" : std::strerror(errno));
    destination += got;
    nbytes -= got;
    offset += got;
  }
}

void SafetensorsFile::parse_header() {
  TORCH_CHECK(file_size_ >= 8, "torchdefer: ", path_,
              " is not a safetensors file: it is shorter than the 8-byte header length");
  unsigned char length_bytes[8];
  pread_exact(reinterpret_cast<char*>(length_bytes), 8, 0, "the header length");
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) {
    length = (length << 8) | length_bytes[i];
  }
  TORCH_CHECK(length <= static_cast<uint64_t>(std::min(kMaxHeaderBytes, file_size_ - 8)),
              "torchdefer: ", path_, " is not a safetensors file: its header length ", length,
              " exceeds the file or 100 MB");
  std::string text(length, '\0');
  pread_exact(text.data(), static_cast<int64_t>(length), 8, "the header");
  const int64_t data_start = 8 + static_cast<int64_t>(length);
  const JsonValue header = JsonValue::parse(text, "the header of " + path_);
  for (const auto& [name, value] : header.as_object("the header of " + path_)) {
    if (name == "__metadata__") {
      continue;
    }
    const std::string what = "'" + name + "' in " + path_;
    const JsonValue* dtype = value.find("dtype");
    const JsonValue* shape = value.find("shape");
    const JsonValue* offsets = value.find("data_offsets");
    TORCH_CHECK(value.is_object() && dtype && shape && offsets, "torchdefer: ", what,
                " lacks dtype, shape or data_offsets");
    Entry entry;
    entry.meta.dtype = safetensors_dtype(dtype->as_string(what + "'s dtype"), what);
    int64_t numel = 1;
    for (const JsonValue& size : shape->as_array(what + "'s shape")) {
      const int64_t s = size.as_int(what + "'s shape");
      TORCH_CHECK(s >= 0, "torchdefer: ", what, " has a negative size");
      entry.meta.sizes.push_back(s);
      numel *= s;
    }
    const std::vector<JsonValue>& range = offsets->as_array(what + "'s data_offsets");
    TORCH_CHECK(range.size() == 2, "torchdefer: ", what, "'s data_offsets must be [begin, end]");
    const int64_t begin = range[0].as_int(what + "'s data_offsets");
    const int64_t end = range[1].as_int(what + "'s data_offsets");
    entry.offset = data_start + begin;
    entry.nbytes = end - begin;
    TORCH_CHECK(0 <= begin && begin <= end && entry.offset + entry.nbytes <= file_size_,
                "torchdefer: ", what, "'s bytes [", begin, ", ", end,
                ") lie outside the file (is it truncated?)");
    TORCH_CHECK(entry.nbytes == numel * static_cast<int64_t>(c10::elementSize(entry.meta.dtype)),
                "torchdefer: ", what, " holds ", entry.nbytes, " bytes, but its shape and dtype ",
                "need ", numel * static_cast<int64_t>(c10::elementSize(entry.meta.dtype)));
    entries_.emplace(name, std::move(entry));
  }
}

void SafetensorsFile::read(const std::string& name, const Box& box, const at::Tensor& out,
                           StagingBuffer& staging) const {
  const auto it = entries_.find(name);
  TORCH_CHECK(it != entries_.end(), "torchdefer: ", path_, " holds no tensor '", name, "'");
  const Entry& entry = it->second;
  TORCH_CHECK(box.start.size() == entry.meta.sizes.size() && out.is_contiguous() &&
                  out.sizes() == c10::IntArrayRef(box.sizes()),
              "torchdefer: reading '", name, "' needs a contiguous destination of the box's sizes");
  const auto element_size = static_cast<int64_t>(c10::elementSize(entry.meta.dtype));
  if (out.is_cpu() && out.scalar_type() == entry.meta.dtype) {
    char* destination = static_cast<char*>(out.data_ptr());
    for_each_run(entry.meta.sizes, box, element_size, [&](int64_t offset, int64_t nbytes) {
      for (int64_t done = 0; done < nbytes; done += kTouchStep) {
        const int64_t step = std::min(kTouchStep, nbytes - done);
        // Note [Touching the destination just ahead of the read]
        populate_for_write(destination, step);
        pread_exact(destination, step, entry.offset + offset + done, name);
        destination += step;
      }
    });
    return;
  }
  const int64_t capacity = std::min<int64_t>(static_cast<int64_t>(out.numel()) * element_size,
                                             kMaxBufferBytes / element_size * element_size);
  char* const buffer = staging.reserve(capacity);
  const at::Tensor flat = out.view(-1);
  int64_t used = 0;
  int64_t written = 0;  // elements of `out` filled
  const auto flush = [&] {
    const int64_t count = used / element_size;
    const at::Tensor staged =
        at::from_blob(buffer, {count}, at::TensorOptions().dtype(entry.meta.dtype));
    flat.narrow(0, written, count).copy_(staged);
    written += count;
    used = 0;
  };
  for_each_run(entry.meta.sizes, box, element_size, [&](int64_t offset, int64_t nbytes) {
    while (nbytes > 0) {
      const int64_t take = std::min(nbytes, capacity - used);
      pread_exact(buffer + used, take, entry.offset + offset, name);
      used += take;
      offset += take;
      nbytes -= take;
      if (used == capacity) {
        flush();
      }
    }
  });
  if (used > 0) {
    flush();
  }
}

}  // namespace torchdefer::detail
