#!/bin/sh
# msmoe-eval end to end: the real msmoed on the embedded model (stories260k-moe, CPU) on a
# temporary socket; `gsm8k --limit 5` and `mmlu --limit 5` write reports whose 5 records have
# their fields filled (scores near zero / chance are expected: the pipeline is what is tested);
# two runs at different --concurrency compare at 100% agreement (greedy decoding); the errors a
# user can trigger exit non-zero with a message.
# The embedded model's context is 512 tokens, so the runs use fewer shots than the defaults.
# The text path (prompt_text, stop strings) is tested first with --prompt-ids (tokenized here)
# and then with text; a daemon that refuses text prompts makes the test exit 77 (skipped) after
# the --prompt-ids part has passed.
# usage: test_eval.sh path/to/msmoed path/to/msmoe-eval   (run from the repository root)
set -u
MSMOED=$1
EVAL=$2
fails=0
tmp=$(mktemp -d /tmp/msmoe-eval-it.XXXXXX)
pid=
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        wait "$pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL $*"; fails=$((fails + 1)); }

"$MSMOED" --set server.socket="$tmp/s.sock" --set log.level=warn \
    --set engine.model="$(pwd)/models/stories260k-moe" >"$tmp/daemon.log" 2>&1 &
pid=$!
i=0
while [ ! -S "$tmp/s.sock" ]; do
    i=$((i + 1))
    if [ $i -gt 300 ] || ! kill -0 "$pid" 2>/dev/null; then
        echo "FAIL msmoed did not start: $(cat "$tmp/daemon.log")"
        exit 1
    fi
    sleep 0.1
done
S="--socket $tmp/s.sock --quiet"

# A report has n records, each with its fields filled, and no request failed.
check_report() { # file, task, n
    python3 - "$1" "$2" "$3" <<'EOF'
import json, sys
path, task, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = json.load(open(path))
assert r["task"] == task, r["task"]
assert r["model_info"]["architecture"], "model_info"
items = r["items"]
assert len(items) == n, f"{len(items)} records, want {n}"
for it in items:
    for k in ("id", "prompt_hash", "output", "output_ids", "answer", "reference", "correct", "finish_reason"):
        assert k in it, f"{it['id']}: no {k}"
    assert "error" not in it, f"{it['id']}: {it['error']}"
    assert it["output_ids"], f"{it['id']}: no output ids"
    assert it["reference"], it["id"]
    if task == "mmlu":
        assert it["reference"] in "ABCD" and it.get("subject"), it["id"]
        assert set(it["letter_logprobs"]) == set("ABCD"), it["id"]
        assert it["answer"] in (None, "A", "B", "C", "D"), it["id"]
    else:
        assert it["finish_reason"] in ("stop", "length", "eos"), it["id"]
        assert it["output"] or it["finish_reason"] != "length", f"{it['id']}: empty output"
assert r["summary"]["n"] == n
EOF
}

# run NAME [msmoe-eval args...]: one evaluation; its stderr is kept in $tmp/NAME.err.
run() {
    name=$1
    shift
    "$EVAL" "$@" --output "$tmp/$name.json" >"$tmp/$name.out" 2>"$tmp/$name.err"
}

pipeline() { # mode ("ids" or "text"), extra args
    mode=$1
    shift
    G="gsm8k $S --limit 5 --shots 0 --max-tokens 48 $*"
    M="mmlu $S --limit 5 --shots 1 --subjects abstract_algebra $*"
    if ! run "g1$mode" $G --concurrency 4; then
        if [ "$mode" = text ] && grep -q "need a tokenizer\|prompt_text\|prompt_ids is empty" "$tmp/g1$mode.err"; then
            echo "SKIP text prompts: the daemon does not accept them yet: $(grep -m1 refused "$tmp/g1$mode.err")"
            return 77
        fi
        fail "gsm8k_$mode: $(cat "$tmp/g1$mode.err")"
        return 1
    fi
    check_report "$tmp/g1$mode.json" gsm8k 5 && echo "PASS gsm8k_${mode}_report: $(cat "$tmp/g1$mode.out")" ||
        fail "gsm8k_${mode}_report"
    run "m1$mode" $M --concurrency 5 || fail "mmlu_$mode: $(cat "$tmp/m1$mode.err")"
    check_report "$tmp/m1$mode.json" mmlu 5 && echo "PASS mmlu_${mode}_report: $(cat "$tmp/m1$mode.out")" ||
        fail "mmlu_${mode}_report"
    # The same items one at a time over two connections: greedy decoding gives the same tokens.
    run "g2$mode" $G --concurrency 1 --connections 2 || fail "gsm8k_${mode}_c1: $(cat "$tmp/g2$mode.err")"
    run "m2$mode" $M --concurrency 1 || fail "mmlu_${mode}_c1: $(cat "$tmp/m2$mode.err")"
    for t in g m; do
        if "$EVAL" compare "$tmp/${t}1$mode.json" "$tmp/${t}2$mode.json" --min-agreement 1 >"$tmp/cmp" 2>&1 &&
            grep -q "agreement: 100.00% (5/5" "$tmp/cmp" && grep -q "identical outputs: 5/5" "$tmp/cmp"; then
            echo "PASS compare_${t}_$mode: $(grep agreement "$tmp/cmp")"
        else
            fail "compare_${t}_$mode: $(cat "$tmp/cmp")"
        fi
    done
    return 0
}

pipeline ids --prompt-ids

# Errors a user can trigger: a clear message and a non-zero exit.
expect_fail() { # name, exit code, message fragment, command...
    name=$1; code=$2; frag=$3; shift 3
    "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ $rc -ne "$code" ]; then fail "$name: exit $rc, want $code: $(cat "$tmp/err")"; return; fi
    if ! grep -q -- "$frag" "$tmp/err"; then fail "$name: message lacks '$frag': $(cat "$tmp/err")"; return; fi
    echo "PASS $name: $(head -c 160 "$tmp/err")"
}
expect_fail unreachable 3 "cannot connect" "$EVAL" gsm8k --socket "$tmp/nonexistent.sock" --limit 1
expect_fail bad_subject 2 "no subject \"astrology\"" "$EVAL" mmlu $S --subjects astrology
expect_fail bad_data_dir 2 "/nonexistent/gsm8k/fewshot.jsonl" "$EVAL" gsm8k $S --data /nonexistent
expect_fail bad_report 2 "daemon.log" "$EVAL" compare "$tmp/g1ids.json" "$tmp/daemon.log"
echo '{"task": "gsm8k", "items": [' >"$tmp/trunc.json"
expect_fail truncated_report 2 "trunc.json" "$EVAL" compare "$tmp/g1ids.json" "$tmp/trunc.json"
expect_fail task_mismatch 2 "mmlu report" "$EVAL" compare "$tmp/g1ids.json" "$tmp/m1ids.json"
# Agreement below the minimum: a different max-tokens changes the outputs of the GSM8K items.
"$EVAL" gsm8k $S --limit 5 --shots 0 --max-tokens 3 --prompt-ids --output "$tmp/short.json" 2>/dev/null
"$EVAL" compare "$tmp/g1ids.json" "$tmp/short.json" --min-agreement 1 >"$tmp/cmp" 2>&1
rc=$?
if grep -q "identical outputs: 0/5" "$tmp/cmp" && { [ $rc -eq 1 ] || grep -q "agreement: 100.00%" "$tmp/cmp"; }; then
    echo "PASS compare_differing_outputs: exit $rc, $(grep agreement "$tmp/cmp")"
else
    fail "compare_differing_outputs: exit $rc: $(cat "$tmp/cmp")"
fi

pipeline text
text=$?

kill -TERM "$pid"
wait "$pid"
drc=$?
pid=
[ $drc -eq 0 ] || fail "msmoed exited with $drc after SIGTERM"
echo "$fails failed"
[ "$fails" -eq 0 ] || exit 1
[ $text -eq 77 ] && exit 77
exit 0
