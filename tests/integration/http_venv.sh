#!/bin/sh
# The Python environment of the HTTP API tests: a venv in the build directory ($1/pyenv) with the
# official openai client and lm-evaluation-harness from PyPI, pinned. Created once (under a lock,
# since tests run in parallel), then reused; pip keeps no cache outside the build directory.
# Prints the venv's python.
set -eu
build=$1
venv=$build/pyenv
want="openai==3.57.0 lm-eval[api]==0.4.13"
exec 9>"$build/pyenv.lock"
flock 9
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.msm-pins" 2>/dev/null)" != "$want" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  start=$(date +%s)
  # shellcheck disable=SC2086
  PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/pip" install -q $want >&2
  echo "http_venv: installed $want in $(( $(date +%s) - start )) s" >&2
  echo "$want" > "$venv/.msm-pins"
fi
echo "$venv/bin/python"
