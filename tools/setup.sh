#!/usr/bin/env bash
# Installs what Tessera needs from Debian's packages (only what is missing),
# then configures and builds the project.  Idempotent; safe to re-run.
#   tools/setup.sh            -> release build in build/
#   tools/setup.sh --asan     -> also the sanitizer build in build-asan/
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS="flex bison cmake make gcc g++ llvm-19-dev libopenblas-dev openmpi-bin libopenmpi-dev
      python3-torch python3-numpy graphviz libclang-rt-14-dev clang-14 bible-kjv"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing:$missing"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
if [ "${1:-}" = "--asan" ]; then
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTESSERA_SANITIZE=ON >/dev/null
  cmake --build build-asan -j"$jobs"
fi
