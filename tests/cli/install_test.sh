#!/usr/bin/env bash
# install_test.sh CMAKE BUILD SRC WORK: `cmake --install BUILD --prefix
# WORK/p`, then the installed programs run from another directory and use
# the installed tree, not the source tree their build was made from:
#   - the installed mcc compiles the installed gpt sample;
#   - it reads the installed stdlib: a layer added only to the installed
#     nn.mdl compiles there, and the build tree's mcc refuses the same model;
#   - the installed mrun finds the installed Hugging Face maps and, with no
#     --data and no samples/ in the working directory, the installed corpus.
# (The source tree is not renamed: the suite may not touch it.  The second
# check is what renaming would show: a build that fell back to the source
# tree's stdlib would refuse the model.)
set -euo pipefail
cmake_bin=$1 build=$2 src=$3 work=$4
rm -rf "$work"
mkdir -p "$work/elsewhere"
"$cmake_bin" --install "$build" --prefix "$work/p" >/dev/null
P=$(cd "$work/p" && pwd -P)
tiny="-D layers=1 -D d_model=16 -D heads=2 -D seq_len=8 -D vocab=256 -D batch=2 -D micro_batch=1"
cd "$work/elsewhere"
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }

# shellcheck disable=SC2086
"$P/bin/mcc" "$P/share/tessera/samples/gpt.mdl" $tiny -o g.plan || fail "the installed mcc cannot compile the installed sample"
echo "ok: the installed mcc compiles the installed gpt sample"

# shellcheck disable=SC2086
out=$("$P/bin/mcc" "$P/share/tessera/samples/gpt.mdl" $tiny --report time --hw h200 2>&1) ||
  fail "the installed mcc has no hardware description h200: $out"
grep -qF "($P/share/tessera/hw/h200.hw)" <<<"$out" || fail "mcc --hw h200 did not read the installed description: $out"
echo "ok: the installed mcc reads the installed hardware descriptions"

printf '\n# install_test: only in the installed copy\nfn install_probe(x: [..., embed]) {\n  return x\n}\n' >> "$P/share/tessera/stdlib/nn.mdl"
sed 's/x = nn.position_embedding(x)/x = nn.install_probe(nn.position_embedding(x))/' "$P/share/tessera/samples/gpt.mdl" > probe.mdl
grep -q install_probe probe.mdl || fail "the probe model was not made"
# shellcheck disable=SC2086
"$P/bin/mcc" probe.mdl $tiny -o probe.plan || fail "the installed mcc does not read the installed stdlib"
# shellcheck disable=SC2086
if "$build/mcc" probe.mdl $tiny -o probe2.plan 2>err.txt; then fail "the build tree's mcc compiled a layer only the installed stdlib has"; fi
grep -q install_probe err.txt || fail "the build tree's mcc failed for another reason: $(cat err.txt)"
echo "ok: the installed mcc reads the installed stdlib (the build tree's refuses nn.install_probe)"

out=$("$P/bin/mrun" g.plan --steps 1 --export hx 2>&1) || fail "mrun --export: $out"
grep -qF "($P/share/tessera/stdlib/hf/gpt2.map)" <<<"$out" || fail "mrun --export did not use the installed map: $out"
echo "ok: the installed mrun uses the installed Hugging Face maps"

printf 'tiny' > "$P/share/tessera/samples/data/kjv.txt"
if out=$("$P/bin/mrun" g.plan --steps 1 2>&1); then fail "mrun trained on a 4-byte corpus"; fi
grep -qF "corpus $P/share/tessera/samples/data/kjv.txt has 4 bytes" <<<"$out" || fail "mrun's default corpus is not the installed one: $out"
echo "ok: the installed mrun's default corpus is the installed one"
