// One `.safetensors` file: its header parsed when opened, any box of any of its tensors read
// with pread straight into the destination (Note [Reading a box of a safetensors tensor]).
#pragma once

#include <torchdefer/materialize.h>
#include <torchdefer/shard.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace torchdefer::detail {

// The staging buffer of the reads that cast (Note [One staging buffer for a batch]): grown to
// the largest size asked for, never beyond SafetensorsFile::kMaxBufferBytes, and kept.
class StagingBuffer {
 public:
  char* reserve(int64_t nbytes);

 private:
  std::unique_ptr<char[]> data_;
  int64_t size_ = 0;
};

class SafetensorsFile {
 public:
  // Where one tensor's bytes lie in the file.
  struct Entry {
    CheckpointTensor meta;
    int64_t offset = 0;  // absolute, in bytes
    int64_t nbytes = 0;
  };

  // Opens `path` and parses its header; throws c10::Error naming the file when it is not a
  // valid safetensors file (a truncated header, offsets outside the file, a size that does not
  // match the shape and dtype, an unknown dtype).
  explicit SafetensorsFile(std::string path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, Entry>& entries() const { return entries_; }
  // CheckpointReader::read for a tensor of this file; a read that casts stages through
  // `staging`, which the reads of one batch share.
  void read(const std::string& name, const Box& box, const at::Tensor& out,
            StagingBuffer& staging) const;

  // The largest staging buffer read() uses when it cannot read into `out` directly.
  static constexpr int64_t kMaxBufferBytes = 64 << 20;

 private:
  void parse_header();
  void pread_exact(char* destination, int64_t nbytes, int64_t offset,
                   const std::string& name) const;

  std::string path_;
  int fd_ = -1;
  int64_t file_size_ = 0;
  std::map<std::string, Entry> entries_;
};

// The safetensors dtype name ("BF16") of a ScalarType and back; the latter throws naming `what`.
c10::ScalarType safetensors_dtype(const std::string& name, const std::string& what);

}  // namespace torchdefer::detail
