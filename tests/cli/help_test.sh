#!/usr/bin/env bash
# help_test.sh MCC MRUN SRC: every option the programs parse (the "--..."
# strings of mcc's option table, api/options.c, which the C API reads too,
# and of mcc's and mrun's parse_args) appears in their --help, as a whole
# word.
set -uo pipefail
mcc=$1 mrun=$2 src=$3
missing=0
flags_of() { grep -o '"--[a-z0-9-]\+' | tr -d '"' | sort -u; }
check() {   # PROGRAM-NAME HELP-TEXT FLAG...
  local name=$1 help=$2; shift 2
  for f in "$@"; do
    if ! grep -qE -- "(^|[^a-z0-9-])${f}($|[^a-z0-9-])" <<<"$help"; then
      echo "help_test: $name parses $f but its --help does not list it"
      missing=$((missing + 1))
    fi
  done
}
mh=$("$mcc" --help 2>&1)
rh=$("$mrun" --help 2>&1)
# shellcheck disable=SC2046
check mcc "$mh" $(awk '/^static int parse_args\(/,/^}/' "$src/tools/mcc.c" | flags_of) \
                $(awk '/api_options\[\] = \{/,/^};/' "$src/api/options.c" | flags_of)
# shellcheck disable=SC2046
check mrun "$rh" $(awk '/^static int parse_args\(/,/^}/' "$src/tools/mrun.c" | flags_of)
n=$( (awk '/^static int parse_args\(/,/^}/' "$src/tools/mcc.c"; awk '/api_options\[\] = \{/,/^};/' "$src/api/options.c"; awk '/^static int parse_args\(/,/^}/' "$src/tools/mrun.c") | flags_of | wc -l)
[ "$n" -gt 60 ] || { echo "help_test: found only $n flags in the sources: the extraction is broken"; exit 1; }
[ "$missing" = 0 ] || exit 1
echo "help_test: every parsed flag is in --help"
