#!/usr/bin/env bash
# setup.sh - installs what Tessera needs from Debian's packages (only what is
# missing), then configures and builds the project.
#   tools/setup.sh            -> release build in build/
#   tools/setup.sh --asan     -> also the ASan+UBSan (Debug) build in build-asan/
#
# Also the Python environment of the Hugging Face interop test: .venv (or
# $TESSERA_VENV), a virtual environment that sees Debian's python3-torch,
# with the PyPI packages pinned in tools/requirements-hf.txt.
#
# Idempotent (re-running does only the work that is left) and quiet on
# success: it prints nothing unless it has to install packages, and the
# output of apt, cmake and the compiler is shown only when a step fails.
# Needs no terminal (works with CI=true and stdin closed).  As a normal user
# it uses sudo for apt-get; as root it calls apt-get directly.
# TESSERA_BUILD_DIR / TESSERA_ASAN_DIR override the two build directories.
set -euo pipefail
cd "$(dirname "$0")/.."

asan=0
for a in "$@"; do
  case "$a" in
    --asan) asan=1 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "setup: unknown option '$a' (use --asan)" >&2; exit 2 ;;
  esac
done

# Build tools, libraries, the oracle's PyTorch (Debian's, used only from
# /usr/bin/python3), graphviz for `mcc --emit=dot`, the sanitizer runtime for
# clang, bible-kjv (the text of the bundled training corpus), and pkg-config (the
# C API's install test builds an embedder with it: tests/cli/install_test.sh).
PKGS="ca-certificates flex bison cmake make gcc g++ llvm-19-dev libopenblas-dev
      openmpi-bin libopenmpi-dev python3 python3-venv python3-torch python3-numpy graphviz
      libclang-rt-14-dev clang-14 bible-kjv patchelf bubblewrap xz-utils pkg-config"

log=$(mktemp "${TMPDIR:-/tmp}/tessera-setup.XXXXXX")
trap 'rm -f "$log"' EXIT

# run LABEL CMD...: runs CMD with its output captured; on failure shows it.
run() {
  local label=$1; shift
  if ! "$@" >"$log" 2>&1 </dev/null; then
    echo "setup: $label failed; the first errors, then the end of its output:" >&2
    grep -E -m 20 "error|Error|E: " "$log" >&2 || true
    echo "..." >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
}

missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing Debian packages:$missing"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup: not root and no sudo; install:$missing" >&2; exit 1; }
    SUDO="sudo -n"
  fi
  export DEBIAN_FRONTEND=noninteractive
  run "apt-get update" $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
  # shellcheck disable=SC2086  # word splitting of the package list is intended
  run "apt-get install" $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
      --no-install-recommends $missing
fi

# The interop test's environment: made once, reinstalled when the pins change.
venv=${TESSERA_VENV:-.venv}
if ! cmp -s tools/requirements-hf.txt "$venv/requirements-hf.txt" 2>/dev/null; then
  rm -rf "$venv"
  run "python3 -m venv ($venv)" /usr/bin/python3 -m venv --system-site-packages "$venv"
  run "pip install -r tools/requirements-hf.txt (PyPI)" "$venv/bin/pip" install -q --disable-pip-version-check \
      -r tools/requirements-hf.txt
  run "the interop environment imports transformers and torch" "$venv/bin/python" -c "import transformers, torch"
  cp tools/requirements-hf.txt "$venv/requirements-hf.txt"
fi

jobs=$(nproc 2>/dev/null || echo 2)

# build DIR TYPE [cmake options...]: configure (once) and build.
build() {
  local dir=$1 type=$2; shift 2
  run "cmake configure ($dir)" cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE="$type" "$@"
  run "build ($dir)" cmake --build "$dir" -j"$jobs"
}

build "${TESSERA_BUILD_DIR:-build}" Release
if [ "$asan" = 1 ]; then
  build "${TESSERA_ASAN_DIR:-build-asan}" Debug -DTESSERA_SANITIZE=ON
fi
