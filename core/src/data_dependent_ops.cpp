#include <torchdefer/data_dependent_ops.h>

#include <torchdefer/fake_tensor_impl.h>

namespace torchdefer {

std::optional<c10::IValue> answer_without_values(std::string_view op,
                                                 c10::ArrayRef<at::Tensor> tensors) {
  if (op != "aten::equal" || tensors.size() != 2) {
    return std::nullopt;
  }
  const at::Tensor& a = tensors[0];
  const at::Tensor& b = tensors[1];
  const FakeTensorImpl* fa = fake_impl(a);
  const FakeTensorImpl* fb = fake_impl(b);
  const bool same_view = fa != nullptr && fb != nullptr &&
                         fa->storage_identity() == fb->storage_identity() &&
                         a.storage_offset() == b.storage_offset() && a.sizes() == b.sizes() &&
                         a.strides() == b.strides() && a.scalar_type() == b.scalar_type();
  return same_view ? std::optional<c10::IValue>(true) : std::nullopt;
}

}  // namespace torchdefer
