#!/usr/bin/env bash
# check_mrun.sh - an mrun for mcc --check's hostile cases (refusals.cases):
# copied next to a copy of mcc as "mrun", it runs the real $MRUN with the
# arguments mcc gives (PLAN --gpus N --steps K --metrics M --save-params P
# --quiet ...), then damages the parameter file P of the layout's run as
# $DAMAGE says:
#   garbage   P is not a parameter file
#   version   P's format version is 2
#   dtype     P's first parameter has dtype 9
set -u
"$MRUN" "$@" || exit
case "$1" in *layout.plan) ;; *) exit 0 ;; esac
p=${9:?}
case "${DAMAGE:-}" in
  garbage) echo garbage > "$p" ;;
  version) printf '\2' | dd of="$p" bs=1 seek=8 conv=notrunc 2>/dev/null ;;
  dtype) python3 -c 'import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack_from("<I", b, 16)[0]   # magic, version, count, then the first name length
b[20 + n] = 9
open(sys.argv[1], "wb").write(b)' "$p" ;;
esac
