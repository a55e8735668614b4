#!/usr/bin/env bash
# Real model libraries from PyPI against torchdefer, one command:
#   bash tests/reallibs/run.sh [pytest args]
# Creates (or reuses) a throwaway venv that sees the system's torch and transformers, installs
# the pinned libraries of requirements.txt there without ever replacing torch, builds torchdefer
# into build/ (TORCHDEFER_BUILD_DIR names another build folder) if it is not built, runs every case (eager vs torch mode, counter-mode shards) and
# prints a table per library with each failure's class (known_failures.py). Not part of
# scripts/dev.sh test: the installs are about 1.8 GB (triton, lightning, diffusers, ...).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
readonly VENV="${TORCHDEFER_REALLIBS_VENV:-/tmp/reallibs-venv}"
readonly HERE=tests/reallibs
readonly BUILD="${TORCHDEFER_BUILD_DIR:-build}"
# Installed without their dependencies: litgpt pins huggingface-hub<1.4 (see requirements.txt);
# mup requires torchvision and seaborn for its coordinate-check plots, and torchvision, which has
# no working build for this torch, would be imported by transformers and diffusers; ai2-olmo-core
# requires cached-path, which pins huggingface-hub<2.0 (their other dependencies are in
# requirements.txt).
readonly NO_DEPS=(litgpt==0.5.13 mup==1.0.0 ai2-olmo-core==3.0.0 cached-path==1.8.10)

log() { printf '\033[1m[reallibs] %s\033[0m\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV (sees the system site-packages)"
  python3 -m venv --system-site-packages "$VENV"
fi
constraints="$VENV/constraints.txt"
python3 - > "$constraints" <<'PY'
from importlib.metadata import version
for name in ("torch", "huggingface-hub", "transformers"):
    print(f"{name}=={version(name).split('+')[0]}")
PY
if ! "$VENV/bin/python" - "$HERE/requirements.txt" "${NO_DEPS[@]}" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
specs = [l.split("#")[0].strip() for l in open(sys.argv[1])] + sys.argv[2:]
for spec in filter(None, specs):
    name, wanted = spec.split("==")
    try:
        if version(name) != wanted:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PY
then
  log "installing $HERE/requirements.txt and ${NO_DEPS[*]} (torch stays $(head -1 "$constraints"))"
  export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
  "$VENV/bin/pip" install -q -c "$constraints" -r "$HERE/requirements.txt"
  "$VENV/bin/pip" install -q -c "$constraints" --no-deps "${NO_DEPS[@]}"
fi

if ! ls "$BUILD"/python/torchdefer/__init__.py "$BUILD"/python/torchdefer/_C*.so >/dev/null 2>&1; then
  log "building torchdefer into $BUILD/"
  [ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release
  cmake --build "$BUILD" -j "$(nproc)"
fi

report="$(mktemp -d)/reallibs.xml"
log "running $HERE (junit: $report)"
status=0
PYTHONPATH="$(cd "$BUILD" && pwd)/python" "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  --junitxml="$report" "$HERE" "$@" || status=$?
"$VENV/bin/python" "$HERE/report.py" "$report"
exit "$status"
