# Finds LibTorch. Without a Torch_DIR or CMAKE_PREFIX_PATH that already has it, asks the Python on
# PATH where its `torch` package keeps the CMake files (torch.utils.cmake_prefix_path), so a plain
# `cmake -B build` works wherever `pip install torch` did.
macro(torchdefer_find_torch)
  find_package(Torch QUIET)
  if(NOT Torch_FOUND)
    find_package(Python3 COMPONENTS Interpreter REQUIRED)
    set(_torchdefer_ask_torch "import torch.utils; print(torch.utils.cmake_prefix_path)")
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -c "${_torchdefer_ask_torch}"
      OUTPUT_VARIABLE _torchdefer_torch_prefix
      OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE _torchdefer_torch_result
      ERROR_QUIET)
    # Note [Finding torch from an isolated build]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # A plain `pip install .` builds in an isolated environment: pip runs the environment's own
    # interpreter with a PYTHONPATH whose sitecustomize hides the environment's site-packages, so
    # that only the build requirements are importable, and torch is not one of them on purpose
    # (pyproject.toml: an isolated torch would be another build, whose C++ ABI the extension
    # must not be compiled against). The same interpreter in isolated mode (-I: no PYTHON*
    # variables, no user site) sees the environment it installs into, with the torch the
    # extension will run with, which is the one to build against.
    if(NOT _torchdefer_torch_result EQUAL 0 AND SKBUILD)
      execute_process(
        COMMAND "${Python3_EXECUTABLE}" -I -c "${_torchdefer_ask_torch}"
        OUTPUT_VARIABLE _torchdefer_torch_prefix
        OUTPUT_STRIP_TRAILING_WHITESPACE
        RESULT_VARIABLE _torchdefer_torch_result
        ERROR_QUIET)
    endif()
    if(NOT _torchdefer_torch_result EQUAL 0)
      if(SKBUILD)
        message(FATAL_ERROR
          "torchdefer needs torch, and ${Python3_EXECUTABLE} cannot import it: install torch "
          "first (pip install torch==2.13.0), then `pip install .`.")
      endif()
      message(FATAL_ERROR
        "torchdefer needs LibTorch. Install PyTorch (pip install torch==2.13.0) or pass "
        "-DCMAKE_PREFIX_PATH=<libtorch>/share/cmake.")
    endif()
    list(APPEND CMAKE_PREFIX_PATH "${_torchdefer_torch_prefix}")
    find_package(Torch REQUIRED)
  endif()
  if(Torch_VERSION VERSION_LESS 2.11)
    message(WARNING "torchdefer is tested with LibTorch 2.11 and 2.13; found ${Torch_VERSION}.")
  endif()
  message(STATUS "torchdefer: LibTorch ${Torch_VERSION} from ${Torch_DIR}")
endmacro()
