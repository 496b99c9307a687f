#!/usr/bin/env bash
# gpu_kit.sh OUTDIR [--tar FILE] - a self-contained Tessera bundle for a
# machine that has none of our build's dependencies (a GPU machine on loan):
#   OUTDIR/bin/mcc, mrun, mprep         LLVM, libstdc++ and libgcc inside
#                                       (cmake -DTESSERA_KIT=ON)
#   OUTDIR/lib/                         every other shared library they load
#                                       except the C library's own (OpenBLAS,
#                                       the Open MPI libraries, ...); found
#                                       through RPATH $ORIGIN/../lib
#   OUTDIR/share/tessera/{stdlib,samples}  found relative to the binary
#   OUTDIR/tools/gpu_check.sh, OUTDIR/bench/torch_step.py, tests/oracle/models.py
#                                       the GPU check and its PyTorch reference
#   OUTDIR/MANIFEST                     commit, build machine, sizes
# With --tar FILE, also FILE: OUTDIR packed with xz (what travels; the
# check unpacks it).  The CUDA libraries (driver, NVRTC, cuBLASLt, NCCL) are
# not bundled: the runtime finds them on the GPU machine (docs/cuda.md,
# "Finding the CUDA libraries").  Multi-rank runs need an Open MPI install
# on that machine (mpirun); one rank needs none.
# TESSERA_KIT_BUILD: the build directory (default build-kit/).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="" tarf=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tar) tarf=${2:?--tar needs a file}; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "gpu_kit: unknown option '$1'" >&2; exit 2 ;;
    *) [ -z "$out" ] || { echo "gpu_kit: one OUTDIR only" >&2; exit 2; }; out=$1; shift ;;
  esac
done
[ -n "$out" ] || { echo "usage: tools/gpu_kit.sh OUTDIR [--tar FILE]" >&2; exit 2; }
case "$out" in /*) ;; *) out=$PWD/$out ;; esac
if [ -n "$tarf" ]; then case "$tarf" in /*) ;; *) tarf=$PWD/$tarf ;; esac; fi
build=${TESSERA_KIT_BUILD:-$root/build-kit}
jobs=$(nproc 2>/dev/null || echo 2)

# patchelf: the bundled libraries' own RUNPATHs (Open MPI's name
# /usr/lib/x86_64-linux-gnu/openmpi/lib) become $ORIGIN, or their
# dependencies would be looked for on the GPU machine's system paths only
if ! command -v patchelf >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends patchelf >/dev/null 2>&1 ||
      { echo "gpu_kit: apt-get install patchelf failed" >&2; exit 1; }
  else
    echo "gpu_kit: needs patchelf (apt-get install patchelf)" >&2; exit 1
  fi
fi

log=$(mktemp "${TMPDIR:-/tmp}/gpu_kit.XXXXXX")
trap 'rm -f "$log"' EXIT
step() {
  local label=$1; shift
  if ! "$@" >"$log" 2>&1 </dev/null; then
    echo "gpu_kit: $label failed:" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
}
step "cmake configure ($build)" cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTESSERA_KIT=ON
step "build (mcc, mrun, mprep)" cmake --build "$build" -j "$jobs" --target mcc mrun mprep
rm -rf "$out"
step "install into $out" cmake --install "$build" --prefix "$out" --strip

# The shared libraries the binaries load (ldd's closure), but the C
# library's own, which every Linux has and which must match its loader.
mkdir -p "$out/lib"
for b in "$out/bin/mcc" "$out/bin/mrun" "$out/bin/mprep"; do
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libresolv.so.*) continue ;;
  esac
  f="$out/lib/$(basename "$lib")"
  cp -L "$lib" "$f"
  strip --strip-unneeded "$f" 2>/dev/null || true
  if readelf -d "$f" | grep -q -E "R(UN)?PATH"; then patchelf --set-rpath '$ORIGIN' "$f"; fi
done
# nothing may still point at this machine's paths
for f in "$out"/bin/* "$out"/lib/*; do
  if readelf -d "$f" | grep -E "R(UN)?PATH" | grep -v -E '\[\$ORIGIN(/../lib)?\]' | grep -q .; then
    echo "gpu_kit: $f has an absolute RPATH:" >&2
    readelf -d "$f" | grep -E "R(UN)?PATH" >&2
    exit 1
  fi
done

# the check and its PyTorch reference, at the paths they have in the repository
mkdir -p "$out/tools" "$out/bench" "$out/tests/oracle"
cp "$root/tools/gpu_check.sh" "$out/tools/"
cp "$root/bench/torch_step.py" "$out/bench/"
cp "$root/tests/oracle/models.py" "$out/tests/oracle/"

{
  echo "tessera gpu kit"
  echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-unknown}"), glibc $(ldd --version | head -1 | awk '{print $NF}')"
  echo "files:"
  (cd "$out" && find . -type f ! -name MANIFEST -printf '%s %p\n' | sort -k2)
} > "$out/MANIFEST"

size=$(du -sb "$out" | cut -f1)
echo "gpu_kit: $out: $((size / 1048576)) MiB ($(find "$out" -type f | wc -l) files)"
if [ -n "$tarf" ]; then
  mkdir -p "$(dirname "$tarf")"
  tmp="$tarf.tmp.$$"
  tar -C "$(dirname "$out")" -cf - "$(basename "$out")" | xz -T0 -6 > "$tmp"
  mv -f "$tmp" "$tarf"
  echo "gpu_kit: $tarf: $(( $(stat -c %s "$tarf") / 1048576 )) MiB"
fi
