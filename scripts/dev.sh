#!/usr/bin/env bash
# The two README commands, and what they share:
#   bash scripts/dev.sh demo [demo flags]   install what is missing, build what the demo runs, run
#                                           the demo, then the default strategy comparison
#                                           (bench/harness) (Note [What the demo builds])
#   bash scripts/dev.sh test                install what is missing, build everything, run every
#                                           check and test
# Both are idempotent and quick when nothing changed: installs are skipped when present, the
# build is incremental and goes through ccache. Debian 12 with Python 3.11, run as root (or with
# the apt packages already installed).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
readonly BUILD_DIR=build
readonly WHEEL_DIR=build-wheel  # Note [The wheel in CI]
readonly APT_PACKAGES=(cmake g++ ninja-build ccache clang-format libgtest-dev libgmock-dev
                       libbenchmark-dev)
# torch is pinned in the same install as the rest, so that no package (lightning accepts any
# torch >= 2.1) can pull another torch. lightning: tests/python/test_integrations.py.
readonly PIP_PACKAGES=(torch==2.13.0 pytest==9.0.3 hypothesis==6.155.2 transformers==5.23.0
                       matplotlib==3.11.2 accelerate==1.15.0 lightning==2.6.6
                       scikit-build-core==1.1.2 ruff==0.17.6 mypy==2.4.1)
# ccache rewrites paths inside the checkout relative to the compiler's working directory, so that
# a build folder at the same depth as build/ compiles with build/'s commands (Note [The wheel in CI]).
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(pwd)}"

log() { printf '\033[1m[torchdefer] %s\033[0m\n' "$*"; }

install_apt_packages() {
  local missing=() packages=("${APT_PACKAGES[@]}")
  # The extension needs Python.h of the python3 that builds it; Debian's python3 ships it in
  # python3-dev, a python3 of its own (pyenv, a venv's base) ships it itself.
  python3 -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(
      os.path.join(sysconfig.get_paths()["include"], "Python.h")))' || packages+=(python3-dev)
  for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' ||
      missing+=("$package")
  done
  [ ${#missing[@]} -eq 0 ] && return
  log "apt: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

install_pip_packages() {
  if python3 - "${PIP_PACKAGES[@]}" <<'PY'
import sys
from importlib.metadata import version, PackageNotFoundError
for spec in sys.argv[1:]:
    name, wanted = spec.split("==")
    try:
        if version(name).split("+")[0] != wanted:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PY
  then
    return
  fi
  log "pip: installing ${PIP_PACKAGES[*]}"
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --disable-pip-version-check \
    "${PIP_PACKAGES[@]}"
}

# Note [What the demo builds]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A first run compiles from nothing, and the GoogleTest suite and the benchmarks are most of what
# there is to compile. So `demo` builds only what it runs, in the order it runs it: the library
# and the demo program (DEMO_TARGETS), runs the demo, and only then the Python extension and the C++
# strategy runner that the comparison needs (COMPARISON_TARGETS); its first result comes after the
# library is compiled, not after everything is. `test` builds everything. Each phase logs what it
# builds; ninja's [done/total] lines show the progress within it. docs/results.md has the time of
# a first run.
readonly DEMO_TARGETS=(torchdefer_demo)
readonly COMPARISON_TARGETS=(torchdefer_python torchdefer_bench_strategy)

configure() {
  if [ ! -f "$BUILD_DIR/build.ninja" ]; then
    log "configuring $BUILD_DIR/ (CMake, against the torch of $(command -v python3))"
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
  fi
}

# build [what it is] [target...]: every target when none is named.
build() {
  local what="${1:-everything}"
  shift || true
  local targets=()
  [ $# -eq 0 ] || targets=(--target "$@")
  configure
  log "building $what${*:+ (${*})}"
  cmake --build "$BUILD_DIR" -j "$(nproc)" "${targets[@]}"
  link_python_package
}

# Makes `import torchdefer` work from any directory: a .pth file in site-packages that points at
# this checkout's build/python (rewritten by every build, so it follows the checkout in use).
link_python_package() {
  local site
  site=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "$(pwd)/$BUILD_DIR/python" > "$site/torchdefer-dev.pth"
}

check_docs() {
  log "checking the docs (scripts/check_docs.py, tests/docs)"
  python3 scripts/check_docs.py
  python3 -m pytest -q -p no:cacheprovider tests/docs
}

check_format() {
  log "checking clang-format"
  local files
  mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
  clang-format --dry-run --Werror "${files[@]}"
}

# ruff lints the package; mypy checks its public modules against _C.pyi, in build/python, where
# the package is assembled (its _build_info.py is generated). Their settings: pyproject.toml.
check_python() {
  local root
  root=$(pwd)
  log "checking Python (ruff, mypy)"
  python3 -m ruff check --no-cache
  (cd "$BUILD_DIR/python" && python3 -m mypy --config-file "$root/pyproject.toml" \
    --cache-dir "$root/$BUILD_DIR/mypy-cache" torchdefer/__init__.py torchdefer/compat.py \
    torchdefer/distributed.py torchdefer/__main__.py)
}

run_cpp_tests() {
  log "C++ tests (ctest)"
  ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)"
}

# Note [The wheel in CI]
# ~~~~~~~~~~~~~~~~~~~~~~
# `test` also builds the wheel users build (`pip wheel --no-build-isolation .`), installs it into a
# fresh venv that sees the system's torch, and runs the Python suite against the installed package,
# so that what `pip install` ships is what the suite tests (build/python holds the same files; one
# run of the suite, against the installed package, keeps CI's time). The wheel is built in
# build-wheel/, a folder at the same depth as build/: with CCACHE_BASEDIR at the checkout, every
# compile command is build/'s, relative paths included, so each object comes from ccache and the
# wheel costs a configure and the links, not a second build. The venv's python runs with -I
# (no PYTHONPATH, no user site); the system site-packages it sees hold the torchdefer-dev.pth that
# build() writes, which appends build/python after the venv's own site-packages, so the suite
# first checks that `import torchdefer` is the installed copy.
test_wheel() {
  local root venv="$WHEEL_DIR/venv" wheel
  root=$(pwd)
  log "building the wheel (pip wheel --no-build-isolation .)"
  rm -rf "$WHEEL_DIR/dist" "$venv"
  # scikit-build-core would take the compiler from Python's sysconfig ("g++" for "c++"), and
  # ccache hashes the compiler's path: give it build/'s.
  CXX=$(sed -n 's/^CMAKE_CXX_COMPILER:FILEPATH=//p' "$BUILD_DIR/CMakeCache.txt") \
    python3 -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps \
    -Cbuild-dir="$WHEEL_DIR" -w "$WHEEL_DIR/dist" .
  wheel=$(echo "$WHEEL_DIR"/dist/torchdefer-*.whl)
  python3 -m venv --without-pip --system-site-packages "$venv"
  "$venv/bin/python" -I -m pip install -q --disable-pip-version-check --no-deps --no-index "$wheel"
  log "Python tests against the installed wheel ($venv)"
  (cd / && "$root/$venv/bin/python" -I -c '
import os, sys, torchdefer
where = os.path.realpath(torchdefer.__file__)
assert where.startswith(os.path.realpath(sys.prefix) + os.sep), f"torchdefer from {where}, not the venv"
print(f"torchdefer {torchdefer.__version__} from {os.path.dirname(where)}")')
  "$venv/bin/python" -I -m torchdefer
  # The benchmark harness's tests run the C++ benchmarks of build/.
  TORCHDEFER_BUILD_DIR="$root/$BUILD_DIR" "$venv/bin/python" -I -m pytest -q tests/python
}

main() {
  local command="${1:-}"
  shift || true
  case "$command" in
    demo)
      install_apt_packages
      install_pip_packages
      build "the library and the demo" "${DEMO_TARGETS[@]}"
      log "running the demo ($BUILD_DIR/bench/torchdefer_demo)"
      "$BUILD_DIR/bench/torchdefer_demo" "$@"
      build "what the strategy comparison runs" "${COMPARISON_TARGETS[@]}"
      log "comparing initialization strategies (python3 -m bench.harness.run)"
      python3 -m bench.harness.run --build-dir "$BUILD_DIR"
      ;;
    test)
      install_apt_packages
      install_pip_packages
      check_docs
      build
      check_format
      check_python
      run_cpp_tests
      test_wheel
      ;;
    *)
      echo "usage: bash scripts/dev.sh demo [demo flags] | test" >&2
      exit 2
      ;;
  esac
}

main "$@"
