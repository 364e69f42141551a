#!/bin/sh
# systemd-analyze verify on msmoed.service, with ExecStart pointed at the built binary.
# Skips (exit 77) where systemd-analyze cannot run (no systemd in a container sandbox).
set -u
unit=$1; msmoed=$2
command -v systemd-analyze >/dev/null 2>&1 || { echo "systemd-analyze not installed: skip"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
sed "s|^ExecStart=[^ ]*|ExecStart=$(realpath "$msmoed")|" "$unit" > "$dir/msmoed.service"
out=$(SYSTEMD_LOG_LEVEL=warning systemd-analyze verify --man=no "$dir/msmoed.service" 2>&1); rc=$?
echo "$out"
# Lines about other units, or about a missing systemd manager, are not our unit's problems.
ours=$(echo "$out" | grep "msmoed.service" || true)
if [ $rc -ne 0 ] && [ -z "$ours" ]; then
  echo "systemd-analyze could not run here: skip"; exit 77
fi
[ -z "$ours" ] || exit 1
exit 0
