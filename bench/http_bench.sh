#!/usr/bin/env bash
# Runs bench/http_bench against a msmoed started here: the HTTP API's overhead against the socket
# API at STREAMS concurrent streams (results: bench/results/http-*.md).
#   bench/http_bench.sh [--set key=value ...]      extra settings go to msmoed
# Environment: BIN (directory with msmoed and http_bench; default build/daemon + build/bench, or
# gpu-run/bin where there is no build/, as on the GPU machine), STREAMS (64), MAX_TOKENS (256),
# ROUNDS (5), PORT (18100).
# On the GPU machine: `bench/http_bench.sh --set engine.backend=cuda --set engine.gpus=0`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${BIN:-}" ]; then msmoed=$BIN/msmoed bench=$BIN/http_bench
elif [ -x build/daemon/msmoed ]; then msmoed=build/daemon/msmoed bench=build/bench/http_bench
else
    msmoed=gpu-run/bin/msmoed bench=gpu-run/bin/http_bench
    export LD_LIBRARY_PATH=$PWD/gpu-run/lib:${LD_LIBRARY_PATH:-}
fi
port=${PORT:-18100} sock=/tmp/msm-http-bench.sock log=/tmp/msm-http-bench.log
"$msmoed" --set server.socket=$sock --set http.enabled=true --set http.port="$port" \
    --set log.level=warn "$@" > "$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do # up to 60 s to load (decode graphs are captured at start-up on CUDA)
    if (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null && [ -S $sock ]; then break; fi
    kill -0 $pid 2>/dev/null || { echo "msmoed exited:"; cat "$log"; exit 1; }
    sleep 0.1
done
echo "# msmoed $* ($(git rev-parse --short HEAD 2>/dev/null || echo unknown))"
"$bench" --socket $sock --http 127.0.0.1:"$port" --streams "${STREAMS:-64}" \
    --max-tokens "${MAX_TOKENS:-256}" --rounds "${ROUNDS:-5}"
