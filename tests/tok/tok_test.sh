#!/bin/sh
# tok_test.sh SRC CMD TOOL WORK [ARG]: runs tok_test.py CMD in the interop
# environment that tools/setup.sh makes (.venv, or $TESSERA_VENV), where
# the PyPI `tokenizers` package is.
venv=${TESSERA_VENV:-$1/.venv}
case $venv in /*) ;; *) venv=$1/$venv ;; esac
if ! [ -x "$venv/bin/python" ]; then
  echo "tok_test: no $venv/bin/python: run tools/setup.sh (it installs tokenizers there)" >&2
  exit 1
fi
src=$1
shift
exec "$venv/bin/python" "$src/tests/tok/tok_test.py" "$@"
