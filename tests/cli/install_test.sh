#!/usr/bin/env bash
# install_test.sh CMAKE BUILD SRC WORK: `cmake --install BUILD --prefix
# WORK/p`, then the installed programs run from another directory and use
# the installed tree, not the source tree their build was made from:
#   - the installed mcc compiles the installed gpt sample;
#   - it reads the installed stdlib: a layer added only to the installed
#     nn.mdl compiles there, and the build tree's mcc refuses the same model;
#   - the installed mrun finds the installed Hugging Face maps and, with no
#     --data and no samples/ in the working directory, the installed corpus;
#   - the C API: a program (tests/cli/embed.c) built with `cc $(pkg-config
#     --cflags --libs tessera)` against the installed tessera.pc, its
#     library found through an rpath to pkg-config's libdir, run from
#     another directory, writes the same plan as the installed mcc (tp 2),
#     gets a broken model's diagnostic and a bad option's message as
#     strings, and reads the installed stdlib; the library exports only
#     the API (ts_*), its SONAME is libtessera.so.0.
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

# shellcheck disable=SC2086
"$P/bin/mcc" "$P/share/tessera/samples/gpt.mdl" $tiny --tp 2 -o mcc_tp2.plan || fail "the installed mcc at tp 2"

printf '\n# install_test: only in the installed copy\nfn install_probe(x: [..., embed]) {\n  return x\n}\n' >> "$P/share/tessera/stdlib/nn.mdl"
sed 's/x = nn.position_embedding(x)/x = nn.install_probe(nn.position_embedding(x))/' "$P/share/tessera/samples/gpt.mdl" > probe.mdl
grep -q install_probe probe.mdl || fail "the probe model was not made"
# shellcheck disable=SC2086
"$P/bin/mcc" probe.mdl $tiny -o probe.plan || fail "the installed mcc does not read the installed stdlib"
# shellcheck disable=SC2086
if "$build/mcc" probe.mdl $tiny -o probe2.plan 2>err.txt; then fail "the build tree's mcc compiled a layer only the installed stdlib has"; fi
grep -q install_probe err.txt || fail "the build tree's mcc failed for another reason: $(cat err.txt)"
echo "ok: the installed mcc reads the installed stdlib (the build tree's refuses nn.install_probe)"

# ---- the C API: header, library and pkg-config file ----
pc=$(find "$P" -name tessera.pc) || true
[ -n "$pc" ] || fail "no tessera.pc under $P"
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$pc")
cflags=$(pkg-config --cflags --libs tessera) || fail "pkg-config cannot read $pc"
libdir=$(pkg-config --variable=libdir tessera)
[ -f "$(pkg-config --variable=includedir tessera)/tessera.h" ] || fail "tessera.h is not in pkg-config's includedir"
[ "$(cd "$libdir" && pwd -P)" = "$(cd "$(dirname "$(ls "$P"/lib*/libtessera.so "$P"/lib/*/libtessera.so 2>/dev/null | head -1)")" && pwd -P)" ] ||
  fail "pkg-config's libdir $libdir is not where libtessera.so is"
san=""   # a sanitized build's library needs its runtime in the program
grep -q '^TESSERA_SANITIZE:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null && san="-fsanitize=address,undefined"
# shellcheck disable=SC2086
cc -std=c11 -Wall -Werror $san "$src/tests/cli/embed.c" -o embed $cflags -Wl,-rpath,"$libdir" ||
  fail "the embedding example does not build with: cc embed.c $cflags"
soname=$(objdump -p "$libdir/libtessera.so" | awk '/SONAME/ {print $2}')
[ "$soname" = libtessera.so.0 ] || fail "libtessera.so's SONAME is '$soname', not libtessera.so.0"
bad=$(nm -D --defined-only "$libdir/libtessera.so" | awk '$2 ~ /^[TDBR]$/ && $3 !~ /^ts_(session_|version|plan_format|status_name)/ {print $3}' | grep -v '^_' | head -5 || true)
[ -z "$bad" ] || fail "libtessera.so exports internal symbols: $bad"
out=$(./embed "$P/share/tessera/samples/gpt.mdl" api_tp2.plan probe.mdl 2>&1) || fail "the embedder: $out"
cmp -s api_tp2.plan mcc_tp2.plan || fail "the library's plan differs from the installed mcc's ($(cmp api_tp2.plan mcc_tp2.plan))"
grep -q "^ok: a broken model gives status compile" <<<"$out" || fail "the embedder's broken-model line: $out"
echo "ok: an embedder built with pkg-config writes the installed mcc's plan byte for byte ($(wc -c <api_tp2.plan) bytes), gets diagnostics as strings, finds the installed stdlib"
awk '/^## A complete example/ {on = 1} on && /^```c$/ {code = 1; next} code && /^```$/ {exit} code' "$src/docs/embedding.md" > doc_example.c
grep -q ts_session_write_plan doc_example.c || fail "no example found in docs/embedding.md"
# shellcheck disable=SC2086
cc -std=c11 -Wall -Werror $san doc_example.c -o doc_example $cflags || fail "docs/embedding.md's example does not build"
echo "ok: docs/embedding.md's complete example builds against the installed library"

out=$("$P/bin/mrun" g.plan --steps 1 --export hx 2>&1) || fail "mrun --export: $out"
grep -qF "($P/share/tessera/stdlib/hf/gpt2.map)" <<<"$out" || fail "mrun --export did not use the installed map: $out"
echo "ok: the installed mrun uses the installed Hugging Face maps"

printf 'tiny' > "$P/share/tessera/samples/data/kjv.txt"
if out=$("$P/bin/mrun" g.plan --steps 1 2>&1); then fail "mrun trained on a 4-byte corpus"; fi
grep -qF "corpus $P/share/tessera/samples/data/kjv.txt has 4 bytes" <<<"$out" || fail "mrun's default corpus is not the installed one: $out"
echo "ok: the installed mrun's default corpus is the installed one"

# last (it moves the tree): tessera.pc is relocatable, its paths follow the tree
mv "$P" "$P.moved"
[ "$(cd "$(PKG_CONFIG_PATH=${PKG_CONFIG_PATH/$P/$P.moved} pkg-config --variable=libdir tessera)" && pwd -P)" = "$(cd "$P.moved/${libdir#"$P"/}" && pwd -P)" ] ||
  fail "tessera.pc in a moved tree does not point into it"
mv "$P.moved" "$P"
echo "ok: tessera.pc follows its tree when it moves"
