# Checks that the LibTorch in use has the three dispatch keys torchdefer is built on
# (Note [Dispatch keys] in core/include/torchdefer/torch_compat.h).
include(CheckCXXSourceCompiles)

function(torchdefer_check_dispatch_keys)
  set(CMAKE_REQUIRED_INCLUDES ${TORCH_INCLUDE_DIRS})
  set(CMAKE_REQUIRED_FLAGS "${TORCH_CXX_FLAGS}")
  set(CMAKE_REQUIRED_QUIET ON)
  foreach(key Fake DeferredInit CustomRNGKeyId)
    check_cxx_source_compiles("
      #include <c10/core/DispatchKey.h>
      int main() { return static_cast<int>(c10::DispatchKey::${key}) == 0; }"
      TORCHDEFER_HAS_DISPATCH_KEY_${key})
    if(NOT TORCHDEFER_HAS_DISPATCH_KEY_${key})
      message(FATAL_ERROR
        "LibTorch ${Torch_VERSION} has no c10::DispatchKey::${key}, which torchdefer is built on. "
        "Choose the replacement key in core/include/torchdefer/torch_compat.h (DESIGN.md section "
        "4 names the candidates) and add it to this check.")
    endif()
  endforeach()
  message(STATUS "torchdefer: dispatch keys Fake, DeferredInit and CustomRNGKeyId found")
endfunction()
