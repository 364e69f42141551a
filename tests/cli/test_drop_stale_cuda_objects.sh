#!/bin/sh
# scripts/drop-stale-cuda-objects: a CUDA object older than the newest kernels/ or engine/ header is
# deleted, a newer one and non-CUDA objects are kept, a missing build directory is no error.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
mkdir -p "$d/p"
touch -d '2000-01-01' "$d/p/old.cu.o" "$d/p/old.c.o"
touch -d '2100-01-01' "$d/p/new.cu.o"
out=$("$root/scripts/drop-stale-cuda-objects" "$d")
fail=0
[ ! -e "$d/p/old.cu.o" ] || { echo "FAIL a CUDA object older than the headers was kept"; fail=1; }
[ -e "$d/p/new.cu.o" ] || { echo "FAIL a CUDA object newer than the headers was dropped"; fail=1; }
[ -e "$d/p/old.c.o" ] || { echo "FAIL a C object was dropped"; fail=1; }
case $out in *"1 CUDA objects"*) ;; *) echo "FAIL the message: $out"; fail=1 ;; esac
"$root/scripts/drop-stale-cuda-objects" "$d/missing" || { echo "FAIL a missing build directory is an error"; fail=1; }
[ $fail -eq 0 ] && echo "PASS drop-stale-cuda-objects"
exit $fail
