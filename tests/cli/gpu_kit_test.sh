#!/usr/bin/env bash
# gpu_kit_test.sh SRC WORK - issue 25's kit, as CI can check it without a GPU:
#   tools/gpu_kit.sh builds the bundle (its own build directory WORK/build)
#   and its .tar.xz, which must be at most 60 MiB (what travels to a GPU
#   machine); tools/kit_sandbox.sh runs the bundle in a root with only the C
#   library; tools/gpu_check.sh, run from the unpacked tarball, prints its
#   table with every GPU row "no GPU" and the CPU side of each tiny model
#   trained, and exits 0.
set -uo pipefail
src=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
TESSERA_KIT_BUILD=$work/build bash "$src/tools/gpu_kit.sh" "$work/kit" --tar "$work/kit.tar.xz" || fail "gpu_kit.sh"
bytes=$(stat -c %s "$work/kit.tar.xz")
echo "kit: $(du -sh "$work/kit" | cut -f1) unpacked, $((bytes / 1048576)) MiB as carried"
[ "$bytes" -le $((60 * 1048576)) ] || fail "the kit's tarball is $bytes bytes, over 60 MiB"
bash "$src/tools/kit_sandbox.sh" "$work/kit" || fail "kit_sandbox.sh"
# the check, from the tarball as a GPU machine gets it (no nvidia-smi here)
PATH=/usr/local/sbin:/usr/sbin:/sbin:/usr/local/bin:/usr/bin:/bin \
  bash "$work/kit/tools/gpu_check.sh" "$work/check" --kit "$work/kit.tar.xz" > "$work/table.md" 2> "$work/check.err" ||
  { cat "$work/check.err"; fail "gpu_check.sh exited non-zero"; }
cat "$work/table.md"
rows=$(grep -v "^| part | " "$work/table.md" | grep -c "^| [a-z0-9-]* | ")
nogpu=$(grep -c "^| [a-z0-9-]* | no GPU | " "$work/table.md")
[ "$rows" -ge 12 ] || fail "$rows rows in the table, want 12"
[ "$nogpu" = "$rows" ] || fail "$nogpu of $rows rows say 'no GPU'"
for m in gpt llama moe; do
  grep -q "^| train-$m | no GPU | CPU rank: 20 steps, loss [0-9.]* -> [0-9.]*" "$work/table.md" ||
    fail "train-$m: the CPU rank did not train"
done
for m in gpt bloom; do
  grep -q "^| generate-$m | no GPU | full-forward check: all 16 tokens equal" "$work/table.md" ||
    fail "generate-$m: the CPU rank's generation did not check"
done
grep -q "^| env | no GPU | nvidia-smi: not installed; kit [0-9a-f]\{7\}" "$work/table.md" || fail "env row"
echo "ok"
