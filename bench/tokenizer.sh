#!/usr/bin/env bash
# tokenizer.sh - encoding speed of the C tokenizer (runtime/data/
# tokenizer.c, through tests/tok/tok_tool) next to the PyPI `tokenizers`
# package (.venv, tools/setup.sh), one thread each, on the bundled corpus
# (samples/data/kjv.txt, 4.3 MB, encoded as one text), for each shipped
# tokenizer.  MB/s of text in, best of the runs in --seconds (default 3)
# for C, best of 3 for Python (Tokenizer.encode, RAYON_NUM_THREADS=1); ids
# are checked equal.  "C per line": one encode call per line, as a
# document-by-document preprocessor calls it (no word cache below 4 KB).
# Not a test.
#   bench/tokenizer.sh [--build DIR] [--seconds N] [--text FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
build=build secs=3 text=samples/data/kjv.txt
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=${2:?}; shift ;;
    --seconds) secs=${2:?}; shift ;;
    --text) text=${2:?}; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "tokenizer.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
tool=$build/tests/tok/tok_tool
py=${TESSERA_VENV:-.venv}/bin/python
[ -x "$tool" ] || { echo "tokenizer.sh: no $tool: build first (cmake --build $build)" >&2; exit 1; }
[ -x "$py" ] || { echo "tokenizer.sh: no $py: run tools/setup.sh" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
S=samples/tokenizer
echo "| tokenizer | ids | C MB/s | C per line MB/s | tokenizers $("$py" -c 'import tokenizers; print(tokenizers.__version__)') MB/s | C / Python |"
echo "|---|---:|---:|---:|---:|---:|"
for row in "GPT-2 style, tokenizer.json|$S/tokenizer.json|json" \
           "GPT-2 style, vocab.json + merges.txt|$S/vocab.json|pair" \
           "Llama 3 style, tokenizer.json|$S/llama3-style/tokenizer.json|json"; do
  IFS='|' read -r name file kind <<<"$row"
  c=$(taskset -c 0 "$tool" bench "$file" "$text" "$secs" | awk '{print $1}')
  cl=$(taskset -c 0 "$tool" bench-lines "$file" "$text" "$secs" | awk '{print $1}')
  "$tool" encode "$file" "$text" "$TMP/c.ids"
  read -r p n < <(taskset -c 0 "$py" - "$file" "$kind" "$text" "$TMP/c.ids" <<'PY'
import array, sys, time
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
path, kind, text_path, ids_path = sys.argv[1:]
if kind == "pair":
    tok = Tokenizer(models.BPE.from_file(path, path[:-len("vocab.json")] + "merges.txt"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
else:
    tok = Tokenizer.from_file(path)
data = open(text_path, "rb").read()
text = data.decode("utf-8", "replace")
best = 1e30
for _ in range(3):
    t = time.perf_counter()
    ids = tok.encode(text).ids
    best = min(best, time.perf_counter() - t)
c = array.array("i"); c.frombytes(open(ids_path, "rb").read())
if c.tolist() != ids:
    sys.exit("tokenizer.sh: the C ids differ from the package's for " + path)
print(f"{len(data) / best / 1e6:.1f} {len(ids)}")
PY
)
  echo "| $name | $n | $c | $cl | $p | $(awk -v a="$c" -v b="$p" 'BEGIN{printf "%.1fx", a/b}') |"
done
