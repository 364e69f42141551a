#!/bin/sh
# The installed unit file: systemd-analyze verify (ExecStart pointed at the built binary), its
# exposure score from `systemd-analyze security --offline=true` at 2.5 or better (issue 16), and
# what the hardening must not take away: Type=notify, the watchdog, the NVIDIA device nodes.
# Skips (exit 77) where systemd-analyze cannot run (no systemd in a container sandbox).
set -u
unit=$1; msmoed=$2
max_score=2.5
command -v systemd-analyze >/dev/null 2>&1 || { echo "systemd-analyze not installed: skip"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
sed "s|^ExecStart=[^ ]*|ExecStart=$(realpath "$msmoed")|" "$unit" > "$dir/msmoed.service"
for want in "^Type=notify" "^WatchdogSec=" "^DeviceAllow=/dev/nvidiactl rw" "^DeviceAllow=/dev/nvidia0 rw" \
            "^DeviceAllow=/dev/nvidia-uvm rw" "^DevicePolicy=closed"; do
  grep -q "$want" "$dir/msmoed.service" || { echo "msmoed.service lost '$want'"; exit 1; }
done
if grep -q "^PrivateDevices=yes" "$dir/msmoed.service"; then
  echo "msmoed.service: PrivateDevices=yes would hide /dev/nvidia*"; exit 1
fi
out=$(SYSTEMD_LOG_LEVEL=warning systemd-analyze verify --man=no "$dir/msmoed.service" 2>&1); rc=$?
echo "$out"
# Lines about other units, or about a missing systemd manager, are not our unit's problems.
ours=$(echo "$out" | grep "msmoed.service" || true)
if [ $rc -ne 0 ] && [ -z "$ours" ]; then
  echo "systemd-analyze could not run here: skip"; exit 77
fi
[ -z "$ours" ] || exit 1
# The exposure score (--offline needs systemd >= 250; older ones cannot rate a unit file).
sec=$(SYSTEMD_LOG_LEVEL=warning systemd-analyze security --offline=true --no-pager "$dir/msmoed.service" 2>&1)
score=$(echo "$sec" | sed -n 's/.*Overall exposure level for msmoed.service: \([0-9.]*\).*/\1/p')
if [ -z "$score" ]; then
  echo "systemd-analyze security --offline is not supported here: score not checked"; exit 0
fi
echo "exposure score: $score (at most $max_score)"
if ! awk "BEGIN { exit !($score <= $max_score) }"; then
  echo "$sec" | grep "✗"
  echo "msmoed.service scores $score, worse than $max_score"; exit 1
fi
exit 0
