#!/bin/sh
# mprep_test.sh MPREP SRC SCRATCH [TOKENIZER]: tests/idx/mprep_test.py under
# the Python that tools/setup.sh makes (.venv, or $TESSERA_VENV: numpy, and
# `tokenizers` for the BPE run), in a fresh SCRATCH directory.
venv=${TESSERA_VENV:-$2/.venv}
case $venv in /*) ;; *) venv=$2/$venv ;; esac
if ! [ -x "$venv/bin/python" ]; then
  echo "mprep_test: no $venv/bin/python: run tools/setup.sh" >&2
  exit 1
fi
rm -rf "$3" && mkdir -p "$3" || exit 1
PYTHONPATH=$2/tests/idx exec "$venv/bin/python" "$2/tests/idx/mprep_test.py" "$@"
