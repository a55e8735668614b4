// Uses the installed torchdefer the way an application would; exits non-zero if anything is off.
#include <torchdefer/torchdefer.h>

#include <ATen/ops/empty.h>

#include <iostream>

int main() {
  torchdefer::FakeMode fake(c10::Device(c10::kCUDA));
  const at::Tensor w = at::empty({8192, 8192});
  if (!torchdefer::is_fake(w) || !w.is_cuda()) {
    std::cerr << "expected a fake CUDA tensor, got " << torchdefer::describe(w) << "\n";
    return 1;
  }
  std::cout << "torchdefer " << TORCHDEFER_VERSION << ": " << torchdefer::describe(w) << "\n";
  return 0;
}
