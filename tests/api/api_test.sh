#!/usr/bin/env bash
# api_test.sh MCC API_TEST SAMPLE WORK: the build's mcc writes the plan of
# SAMPLE at toy size and tp 2; api_test (api_test.c) compiles the same
# through the C API and compares, byte for byte, among its other checks.
set -euo pipefail
mcc=$1 api_test=$2 sample=$3 work=$4
rm -rf "$work"
mkdir -p "$work"
"$mcc" "$sample" -D layers=1 -D d_model=16 -D heads=2 -D seq_len=8 -D vocab=256 -D batch=2 -D micro_batch=1 \
  --tp 2 -o "$work/mcc.plan"
"$api_test" "$sample" "$work/mcc.plan" "$work"
