#!/bin/bash
# untouched.sh - the test suite writes only inside its build and temporary
# directories (tests/io/CMakeLists.txt runs it around the whole suite).
#
# usage: untouched.sh begin|check SRCDIR BUILDDIR STATEDIR
#   begin: records the source tree (path, size, mtime of every file; build
#          directories -- any holding a CMakeCache.txt -- BUILDDIR and .git
#          left out) and a stamp time
#   check: the same listing must come out again; no regular file appeared
#          in /dev; /dev/null, /dev/full, /dev/zero are still character
#          devices (one already damaged before the suite is reported, with
#          the command that repairs it, and not held against the suite)
set -u
mode=$1 SRC=$2 BUILD=$3 STATE=$4

listing() {
  # .git, the build trees, and .venv (tools/setup.sh's Python environment)
  local prune=(-path "$SRC/.git" -o -path "$BUILD" -o -path "$SRC/.venv")
  for d in "$SRC"/*/; do
    [ -f "$d/CMakeCache.txt" ] && prune+=(-o -path "${d%/}")
  done
  find "$SRC" \( "${prune[@]}" \) -prune -o \( -type f -o -type l \) -printf '%P %s %T@\n' | sort
}

# Prints the watched device nodes that are not character devices.
bad_devices() {
  for d in /dev/null /dev/full /dev/zero; do [ -c "$d" ] || echo "$d"; done
}

case $mode in
begin)
  rm -rf "$STATE" && mkdir -p "$STATE" || exit 1
  touch "$STATE/stamp" || exit 1
  listing > "$STATE/tree.before"
  bad_devices > "$STATE/dev.before"
  find /dev -xdev -type f 2>/dev/null > "$STATE/devfiles.before"
  while read -r d; do
    echo "warning: $d was already damaged before the suite (not a character device); as root," \
         "'rm $d && mknod -m 666 $d c 1 $(case $d in */null) echo 3 ;; */zero) echo 5 ;; *) echo 7 ;; esac)' repairs it" >&2
  done < "$STATE/dev.before"
  echo "recorded $(wc -l < "$STATE/tree.before") files of $SRC"
  ;;
check)
  [ -f "$STATE/stamp" ] || { echo "FAIL: no record from suite.untouched_begin" >&2; exit 1; }
  fail=0
  for d in $(bad_devices); do
    if ! grep -qx "$d" "$STATE/dev.before"; then
      echo "FAIL: $d is no longer a character device: $(ls -l "$d" 2>&1)" >&2
      fail=1
    fi
  done
  found=$(find /dev -xdev -type f -newer "$STATE/stamp" 2>/dev/null | grep -vxF -f "$STATE/devfiles.before")
  if [ -n "$found" ]; then
    echo "FAIL: regular files appeared in /dev during the suite:" >&2
    echo "$found" >&2
    fail=1
  fi
  listing > "$STATE/tree.after"
  if ! cmp -s "$STATE/tree.before" "$STATE/tree.after"; then
    echo "FAIL: the source tree changed during the suite (by a test, or by an edit made while it ran):" >&2
    diff "$STATE/tree.before" "$STATE/tree.after" | sed -n 's/^\([<>]\) \(.*\) [0-9]* [0-9.]*$/\1 \2/p' |
      sed 's/^</  before:/; s/^>/  after: /' | head -40 >&2
    fail=1
  fi
  [ $fail = 0 ] && echo "source tree ($(wc -l < "$STATE/tree.after") files) and /dev untouched"
  exit $fail
  ;;
*) echo "usage: untouched.sh begin|check SRCDIR BUILDDIR STATEDIR" >&2; exit 2 ;;
esac
