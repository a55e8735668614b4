#!/bin/bash
# Builds torchdefer on a GPU machine and runs its tests and GPU benchmarks (docs/gpu.md).
#
#   bash scripts/gpu_check.sh fetch         # here, with apt: GoogleTest and Google Benchmark
#                                           # packages into .gpu/debs (for a machine without a
#                                           # package registry)
#   bash scripts/gpu_check.sh run [bench]   # there: build into build-gpu, run ctest, the GPU tests
#                                           # (tests/python/test_cuda.py) and, with `bench`, the
#                                           # GPU benchmarks; logs into $OUT (default build-gpu/logs)
set -uo pipefail
cd "$(dirname "$0")/.."

fetch() {
  mkdir -p .gpu/debs
  (cd .gpu/debs && apt-get download libgtest-dev libgmock-dev googletest libbenchmark-dev \
    libbenchmark1debian)
}

run() {
  local out=${OUT:-build-gpu/logs}
  mkdir -p "$out"
  for deb in .gpu/debs/*.deb; do
    [ -f "$deb" ] && dpkg -x "$deb" /
  done
  # The extension must use the C++ runtime of the Python process that loads it: a compiler newer
  # than that process's libstdc++ builds a library that crashes there (docs/gpu.md).
  if [ -x /usr/bin/g++ ]; then
    export CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
  fi
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > "$out/build.log" 2>&1 &&
    cmake --build build-gpu -j"$(nproc)" >> "$out/build.log" 2>&1 || {
    tail -40 "$out/build.log"
    return 1
  }
  export PYTHONPATH=$PWD/build-gpu/python
  ctest --test-dir build-gpu -j4 --timeout 240 > "$out/ctest.log" 2>&1
  tail -12 "$out/ctest.log"
  python3 -m pytest -q -rfE tests/python/test_cuda.py tests/python/test_cuda_draws.py 2>&1 |
    tee "$out/cuda.log" | tail -5
  if [ "${1:-}" = bench ]; then
    python3 -m bench.gpu_fill --mib 256 --reps 3 --dtypes f32,bf16 --json "$out/gpu_fill.json"
    python3 -m bench.harness.run --device cuda --world 64 --reps 1 --build-dir build-gpu \
      --out "$out/harness" --run 'py-deferred-shard=llama3-70b'
  fi
}

case "${1:-}" in
  fetch) fetch ;;
  run) shift; run "$@" ;;
  *) echo "usage: $0 fetch | run [bench]" >&2; exit 2 ;;
esac
