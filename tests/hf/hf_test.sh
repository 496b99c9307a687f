#!/bin/sh
# hf_test.sh MCC MRUN SRC [SCRIPT]: runs tests/hf/SCRIPT (default
# hf_test.py) in the interop environment that tools/setup.sh makes (.venv,
# or $TESSERA_VENV), in the current directory.
venv=${TESSERA_VENV:-$3/.venv}
case $venv in /*) ;; *) venv=$3/$venv ;; esac
if ! [ -x "$venv/bin/python" ]; then
  echo "hf_test: no $venv/bin/python: run tools/setup.sh (it installs transformers there)" >&2
  exit 1
fi
exec "$venv/bin/python" "$3/tests/hf/${4:-hf_test.py}" "$1" "$2" "$3"
