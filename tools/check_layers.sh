#!/usr/bin/env bash
# check_layers.sh [ROOT] - the layer rules of docs/architecture.md, read
# from the #include lines of every C source and header under ROOT (the
# repository root by default).  Prints `file:line: <layer> may not include
# <file> (<layer>): <rule>` for each edge the architecture forbids and
# exits 1 if there is one; silent, exit 0, when the tree keeps them.
#
# Layers, each allowed to include itself and what its line names:
#   ir              (ir/: the IR and the base utilities)   nothing else
#   frontend        ir
#   codegen         ir
#   plan            ir codegen
#   passes          ir codegen plan
#   runtime/comm    ir plan
#   runtime/device  ir codegen
#   runtime/data    ir   (tokenizers, indexed datasets, sample indices)
#   runtime/cpu     ir plan runtime/comm
#   runtime/exec    ir codegen plan runtime/comm runtime/device runtime/cpu runtime/data
#   api             ir frontend codegen plan passes runtime/comm runtime/exec (the compile driver and
#                   the C API, docs/embedding.md; nothing includes it but tools/ and tests/)
#   include         nothing (tessera.h, the public header: no internal header may leak into it)
# tools/, tests/ and bench/ sit on top and may include anything.  An
# include resolves like the compiler's quoted form: next to the including
# file first, then from ROOT; one that resolves to neither (a generated
# header such as mdl_parser.h) is not checked.
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
root=${root%/}

declare -A allowed=(
  [ir]=""
  [frontend]="ir"
  [codegen]="ir"
  [plan]="ir codegen"
  [passes]="ir codegen plan"
  [runtime/comm]="ir plan"
  [runtime/device]="ir codegen"
  [runtime/data]="ir"
  [runtime/cpu]="ir plan runtime/comm"
  [runtime/exec]="ir codegen plan runtime/comm runtime/device runtime/cpu runtime/data"
  [api]="ir frontend codegen plan passes runtime/comm runtime/exec"
  [include]=""
)

# layer_of PATH (relative to root): the layer, or "" for tools/tests/...;
# runtime files outside the four folders are a layer of their own
# ("runtime"), which no rule allows anything.
layer_of() {
  case $1 in
    runtime/comm/*|runtime/device/*|runtime/cpu/*|runtime/data/*|runtime/exec/*) echo "${1%%/*}/$(echo "$1" | cut -d/ -f2)" ;;
    runtime/*) echo runtime ;;
    ir/*|frontend/*|codegen/*|plan/*|passes/*|api/*|include/*) echo "${1%%/*}" ;;
    *) echo "" ;;
  esac
}

# normalize PATH: resolves . and .. components (no symlinks).
normalize() {
  local IFS=/ out=() part
  for part in $1; do
    case $part in
      ""|.) ;;
      ..) [ ${#out[@]} -gt 0 ] && unset 'out[${#out[@]}-1]' ;;
      *) out+=("$part") ;;
    esac
  done
  (IFS=/; echo "${out[*]}")
}

status=0
cd "$root" || { echo "check_layers: no such directory: $root" >&2; exit 2; }
while IFS= read -r file; do
  from=$(layer_of "$file")
  [ -z "$from" ] && continue
  dir=$(dirname "$file")
  while IFS=: read -r line inc; do
    target=""
    if [ -f "$dir/$inc" ]; then target=$(normalize "$dir/$inc")
    elif [ -f "$inc" ]; then target=$(normalize "$inc")
    else continue
    fi
    to=$(layer_of "$target")
    [ -z "$to" ] && to="${target%%/*}"
    [ "$to" = "$from" ] && continue
    ok=0
    for a in ${allowed[$from]-}; do [ "$a" = "$to" ] && ok=1; done
    if [ $ok = 0 ]; then
      echo "$file:$line: $from may not include $target ($to): $from may use only ${allowed[$from]:-itself}"
      status=1
    fi
  done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file" | sed -E 's/^([0-9]+):[^"]*"([^"]*)".*/\1:\2/')
done < <(find ir frontend codegen plan passes runtime api include -type f \( -name '*.c' -o -name '*.h' -o -name '*.def' -o -name '*.y' -o -name '*.l' \) 2>/dev/null | sort)
exit $status
