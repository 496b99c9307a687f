#!/usr/bin/env bash
# kit_sandbox.sh KITDIR - proves a bundle made by tools/gpu_kit.sh runs on a
# machine that has none of our build's dependencies (issue 25, deliverable
# 2): inside a root filesystem holding only the C library (the dynamic
# loader, libc.so.6, libm.so.6) and the bundle at /kit (read-only) - no
# shell, no LLVM, no OpenBLAS, no Open MPI, no CUDA, no python3:
#   1. every library the binaries load resolves inside /kit or to the C library;
#   2. `mrun --selftest` says there is no GPU driver (exit 1, the one line);
#   3. mcc compiles the bundled tiny gpt sample (the stdlib found relative to
#      the binary), and mrun trains it 3 steps on a CPU rank from the bundled
#      corpus;
#   4. `mcc --target sm_90` fails with the one-line "NVRTC was not found
#      (... looked in ...)" message, not a crash.
# The sandbox is bubblewrap's when it can make one, else chroot (root;
# KIT_SANDBOX=chroot forces it).
# Exit 0 when all hold; each failure says which.
set -uo pipefail
kit=${1:?usage: tools/kit_sandbox.sh KITDIR}
kit=$(cd "$kit" && pwd) || exit 2
[ -x "$kit/bin/mrun" ] && [ -x "$kit/bin/mcc" ] || { echo "kit_sandbox: no bin/mcc, bin/mrun in $kit" >&2; exit 2; }
root=$(mktemp -d "${TMPDIR:-/tmp}/kit_root.XXXXXX")
cleanup() {
  mountpoint -q "$root/kit" 2>/dev/null && umount "$root/kit"
  mountpoint -q "$root/proc" 2>/dev/null && umount "$root/proc"
  rm -rf "$root"
}
trap cleanup EXIT

# the C library only, at the paths the binaries' interpreter and RPATH-less
# lookups use on x86-64 Debian / Ubuntu
ld=$(readelf -l "$kit/bin/mrun" | sed -n 's/.*interpreter: \(.*\)]/\1/p')
mkdir -p "$root$(dirname "$ld")" "$root/lib/x86_64-linux-gnu" "$root/tmp" "$root/kit" "$root/dev" "$root/proc"
cp -L "$ld" "$root$ld"
for l in libc.so.6 libm.so.6; do
  src=$(ldd "$kit/bin/mrun" | awk -v l="$l" '$1 == l {print $3}')
  [ -n "$src" ] || { echo "kit_sandbox: mrun does not load $l?" >&2; exit 1; }
  cp -L "$src" "$root/lib/x86_64-linux-gnu/$l"
done
echo "kit_sandbox: root $root: $(find "$root" -type f | wc -l) files ($(du -sh "$root" | cut -f1)): $(cd "$root" && find . -type f | sort | tr '\n' ' ')"

# sandbox CMD...: runs CMD inside the root with an environment of HOME,
# TMPDIR and what $extra holds (VAR=VALUE words)
extra=""
if [ "${KIT_SANDBOX:-}" != chroot ] &&
   bwrap --bind "$root" / --ro-bind "$kit" /kit --dev /dev --proc /proc --tmpfs /tmp --clearenv /kit/bin/mrun --help \
     >/dev/null 2>&1; then
  how=bubblewrap
  sandbox() {
    local set=() v
    for v in $extra; do set+=(--setenv "${v%%=*}" "${v#*=}"); done
    bwrap --bind "$root" / --ro-bind "$kit" /kit --dev /dev --proc /proc --tmpfs /tmp --clearenv \
      --setenv HOME /tmp --setenv TMPDIR /tmp "${set[@]}" "$@"
  }
elif [ "$(id -u)" = 0 ] && mount --bind "$kit" "$root/kit" 2>/dev/null && mount -o remount,bind,ro "$root/kit" 2>/dev/null &&
     mount -t proc proc "$root/proc" 2>/dev/null; then   # the loader reads $ORIGIN from /proc/self/exe
  how=chroot
  chroot=$(command -v chroot)
  # shellcheck disable=SC2086  # $extra is VAR=VALUE words
  sandbox() { env -i HOME=/tmp TMPDIR=/tmp $extra "$chroot" "$root" "$@"; }
else
  echo "kit_sandbox: cannot make a sandbox here (bubblewrap failed and chroot needs root and bind mounts)" >&2
  exit 1
fi
echo "kit_sandbox: sandbox by $how"
fails=0
fail() { echo "kit_sandbox: FAIL: $*" >&2; fails=$((fails + 1)); }

# 1. the libraries (the dynamic loader's own listing, inside the root)
for b in mcc mrun; do
  extra=LD_TRACE_LOADED_OBJECTS=1
  libs=$(sandbox "/kit/bin/$b" 2>&1) || fail "$b: the loader's listing failed: $libs"
  extra=""
  bad=$(echo "$libs" | grep "=>" | grep -v -E "=> /kit/bin/\.\./lib/|=> /lib/x86_64-linux-gnu/lib[cm]\.so\.6 ")
  [ -z "$bad" ] || fail "$b loads libraries from outside the bundle: $bad"
  echo "$libs" | grep -q "not found" && fail "$b: $(echo "$libs" | grep "not found" | tr -s ' \t' ' ')"
done

# 2. no driver: the one line, exit 1
out=$(sandbox /kit/bin/mrun --selftest 2>&1); rc=$?
[ $rc = 1 ] && echo "$out" | grep -q "^mrun --selftest: no GPU driver found (libcuda.so.1): nothing to test" ||
  fail "mrun --selftest: exit $rc, said: $out"

# 3. compile and train the tiny sample (the plan in the root's top folder:
# bubblewrap gives each call a /tmp of its own)
out=$(sandbox /kit/bin/mcc /kit/share/tessera/samples/gpt.mdl -D layers=2 -D d_model=64 -D heads=4 -D seq_len=64 \
        -D vocab=256 -D batch=8 -D micro_batch=4 -o /tiny.plan 2>&1) || fail "mcc: $out"
out=$(sandbox /kit/bin/mrun /tiny.plan --steps 3 2>&1); rc=$?
if [ $rc = 0 ] && echo "$out" | grep -q "^mrun: trained 3 steps: loss" && echo "$out" | grep -q "using 1 CPU rank"; then
  echo "kit_sandbox: $(echo "$out" | grep "^mrun: trained")"
else fail "mrun training: exit $rc, said: $out"; fi

# 4. NVRTC missing: a one-line error saying where it looked
out=$(sandbox /kit/bin/mcc /kit/share/tessera/samples/gpt.mdl -D layers=1 -D d_model=64 -D heads=4 -D seq_len=64 \
        -D vocab=256 -D batch=2 -D micro_batch=2 --target sm_90 -o /t.plan 2>&1); rc=$?
[ $rc != 0 ] && [ "$(echo "$out" | wc -l)" = 1 ] && echo "$out" | grep -q "NVRTC was not found (libnvrtc.so.13: not found (looked in LD_LIBRARY_PATH" ||
  fail "mcc --target sm_90 without NVRTC: exit $rc, said: $out"

[ $fails = 0 ] && echo "kit_sandbox: ok: the bundle runs with only the C library beside it"
exit $((fails > 0))
