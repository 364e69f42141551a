#!/bin/sh
# msmoe-run from the command line: the embedded model's llama2.c sample, the dump format,
# --fp8-as-bf16, --fp8-as-cuda, --fuse-linear-norm, --prefetch-l2 and the default K/V prefetch, and the errors a user can
# trigger (each: non-zero exit and a message saying what was wrong).
# usage: test_msmoe_run.sh path/to/msmoe-run   (run from the repository root)
set -u
RUN=$1
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

expect_fail() { # name, expected message fragment, command...
    name=$1; frag=$2; shift 2
    if "$@" >"$tmp/out" 2>"$tmp/err"; then
        echo "FAIL $name: exited 0"; fails=$((fails + 1)); return
    fi
    if ! grep -q -- "$frag" "$tmp/err"; then
        echo "FAIL $name: message lacks '$frag': $(cat "$tmp/err")"; fails=$((fails + 1)); return
    fi
    echo "PASS $name: $(head -c 160 "$tmp/err")"
}

expect_fail missing_model_dir "/nonexistent" "$RUN" --model /nonexistent --prompt-ids 1,2 --max-new-tokens 2
expect_fail id_outside_vocab "outside the vocabulary" "$RUN" --model models/stories260k-moe --prompt-ids 1,512 --max-new-tokens 2
expect_fail empty_prompt "prompt is empty" "$RUN" --model models/stories260k-moe --prompt-ids "" --max-new-tokens 2
expect_fail bad_id_syntax "bad token id" "$RUN" --model models/stories260k-moe --prompt-ids 1,x --max-new-tokens 2
expect_fail tp_not_dividing "does not divide" "$RUN" --model models/stories260k-moe --prompt-ids 1 --tp 3
expect_fail context_too_long "context limit" "$RUN" --model models/stories260k-moe --prompt-ids 1 --max-new-tokens 100000
expect_fail cuda_without_gpu "CUDA" "$RUN" --model models/stories260k-moe --prompt-ids 1 --backend cuda

# the llama2.c sample, greedy, text out
out=$("$RUN" --model models/stories260k-moe --prompt "Once upon a time, there was a dragon" --text --max-new-tokens 30)
case "$out" in
*"The dragon was very small"*) echo "PASS dragon_text" ;;
*) echo "FAIL dragon_text: $out"; fails=$((fails + 1)) ;;
esac

# dump: a float32 .npy of [P + N - 1, vocab]
"$RUN" --model tests/data/mixtral --prompt-ids 3,4,5 --max-new-tokens 4 --dump-logits "$tmp/l.npy" >/dev/null
hdr=$(head -c 128 "$tmp/l.npy" | tr -d '\000' | tr -c '[:print:]' ' ')
case "$hdr" in
*"'descr': '<f4'"*"'shape': (6, 256)"*) echo "PASS dump_logits_shape" ;;
*) echo "FAIL dump_logits_shape: $hdr"; fails=$((fails + 1)) ;;
esac

# the schedule of Qwen2-MoE at TP=2: shared expert on aux, every ALLREDUCE on main
"$RUN" --model tests/data/qwen2moe-gqa --tp 2 --no-fuse-allreduce --dump-graph >"$tmp/g"
if grep -q "aux  ALLREDUCE" "$tmp/g" || ! grep -q "aux  LINEAR" "$tmp/g" || ! grep -q "main ALLREDUCE" "$tmp/g"; then
    echo "FAIL dump_graph"; fails=$((fails + 1))
else
    echo "PASS dump_graph"
fi

# the all-reduce fused with the residual add + norm at TP=2 by default; --no-fuse-allreduce-norm
# keeps the pair
"$RUN" --model tests/data/qwen2moe-gqa --tp 2 --dump-graph >"$tmp/g1"
"$RUN" --model tests/data/qwen2moe-gqa --tp 2 --no-fuse-allreduce-norm --dump-graph >"$tmp/g2"
if grep -q "main ALLREDUCE_ADD_RMSNORM" "$tmp/g1" && ! grep -q "ALLREDUCE " "$tmp/g1" &&
    grep -q "main ALLREDUCE " "$tmp/g2" && ! grep -q "ALLREDUCE_ADD_RMSNORM" "$tmp/g2"; then
    echo "PASS no_fuse_allreduce_norm"
else
    echo "FAIL no_fuse_allreduce_norm"; fails=$((fails + 1))
fi

# --fp8-as-bf16 reaches the CPU backend: an FP8 checkpoint's logits move (its weights are rounded
# to bf16 as the CUDA backend holds them), a bf16 checkpoint's stay bitwise the same
for m in qwen3moe-fp8 qwen3moe; do
    "$RUN" --model tests/data/$m --prompt-ids 18,156,56 --max-new-tokens 2 --dump-logits "$tmp/$m-f32.npy" >/dev/null
    "$RUN" --model tests/data/$m --prompt-ids 18,156,56 --max-new-tokens 2 --fp8-as-bf16 \
        --dump-logits "$tmp/$m-bf16.npy" >/dev/null
done
if cmp -s "$tmp/qwen3moe-fp8-f32.npy" "$tmp/qwen3moe-fp8-bf16.npy" || [ ! -s "$tmp/qwen3moe-fp8-bf16.npy" ]; then
    echo "FAIL fp8_as_bf16_moves_fp8_logits"; fails=$((fails + 1))
else
    echo "PASS fp8_as_bf16_moves_fp8_logits"
fi
if cmp -s "$tmp/qwen3moe-f32.npy" "$tmp/qwen3moe-bf16.npy"; then
    echo "PASS fp8_as_bf16_leaves_bf16_checkpoints"
else
    echo "FAIL fp8_as_bf16_leaves_bf16_checkpoints"; fails=$((fails + 1))
fi

# --fp8-as-cuda reaches the CPU backend and rounds only the weights the CUDA backend does not keep
# FP8: none of qwen3moe-fp8's at TP 1 (the logits stay bitwise the float32 oracle's), the expert
# slices of ranks 1 and 3 at TP 4 (column phases 8 and 24: the logits move)
m=qwen3moe-fp8
"$RUN" --model tests/data/$m --prompt-ids 18,156,56 --max-new-tokens 2 --fp8-as-cuda \
    --dump-logits "$tmp/$m-cuda1.npy" >/dev/null
"$RUN" --model tests/data/$m --prompt-ids 18,156,56 --max-new-tokens 2 --tp 4 --dump-logits "$tmp/$m-f32-4.npy" >/dev/null
"$RUN" --model tests/data/$m --prompt-ids 18,156,56 --max-new-tokens 2 --tp 4 --fp8-as-cuda \
    --dump-logits "$tmp/$m-cuda4.npy" >/dev/null
if cmp -s "$tmp/$m-f32.npy" "$tmp/$m-cuda1.npy" && [ -s "$tmp/$m-cuda4.npy" ] &&
    ! cmp -s "$tmp/$m-f32-4.npy" "$tmp/$m-cuda4.npy"; then
    echo "PASS fp8_as_cuda_rounds_only_the_weights_not_kept_fp8"
else
    echo "FAIL fp8_as_cuda_rounds_only_the_weights_not_kept_fp8"; fails=$((fails + 1))
fi

# flag_pair MODEL TAG FLAG...: MODEL's CPU logits of a 2-token decode after a 3-token prompt, and its
# graph dump, without (TAG0) and with (TAG1) the flags: $tmp/MODEL-TAG{0,1}.npy and .txt
flag_pair() {
    fm=$1 ft=$2
    shift 2
    "$RUN" --model tests/data/$fm --prompt-ids 18,156,56 --max-new-tokens 2 --dump-logits "$tmp/$fm-${ft}0.npy" >/dev/null
    "$RUN" --model tests/data/$fm --prompt-ids 18,156,56 --max-new-tokens 2 --dump-logits "$tmp/$fm-${ft}1.npy" \
        "$@" >/dev/null
    "$RUN" --model tests/data/$fm --prompt-ids 18 --dump-graph >"$tmp/$fm-${ft}0.txt" 2>&1
    "$RUN" --model tests/data/$fm --prompt-ids 18 --dump-graph "$@" >"$tmp/$fm-${ft}1.txt" 2>&1
}

# --fuse-linear-norm turns the pass on (the graph holds LINEAR_ADD_RMSNORM nodes, none without it)
# and leaves the CPU logits bitwise the same
m=glm4moe
flag_pair $m ln --fuse-linear-norm
if [ -s "$tmp/$m-ln1.npy" ] && cmp -s "$tmp/$m-ln0.npy" "$tmp/$m-ln1.npy" &&
    grep -q LINEAR_ADD_RMSNORM "$tmp/$m-ln1.txt" && ! grep -q LINEAR_ADD_RMSNORM "$tmp/$m-ln0.txt"; then
    echo "PASS fuse_linear_norm_fuses_and_keeps_the_logits"
else
    echo "FAIL fuse_linear_norm_fuses_and_keeps_the_logits"; fails=$((fails + 1))
fi

# --prefetch-l2 adds a PREFETCH on the aux stream to each of the 4 layers (none without it, none with
# --no-multi-stream) and leaves the CPU logits bitwise the same (PREFETCH_KV, on by default, aside)
m=qwen2moe-gqa
flag_pair $m pf --prefetch-l2
"$RUN" --model tests/data/$m --prompt-ids 18 --dump-graph --prefetch-l2 --no-multi-stream >"$tmp/$m-pf2.txt" 2>&1
if [ -s "$tmp/$m-pf1.npy" ] && cmp -s "$tmp/$m-pf0.npy" "$tmp/$m-pf1.npy" &&
    [ "$(grep -c ' aux  PREFETCH .*o_proj' "$tmp/$m-pf1.txt")" = 4 ] && ! grep -q 'PREFETCH ' "$tmp/$m-pf0.txt" &&
    ! grep -q PREFETCH "$tmp/$m-pf2.txt"; then
    echo "PASS prefetch_l2_adds_a_prefetch_a_layer_and_keeps_the_logits"
else
    echo "FAIL prefetch_l2_adds_a_prefetch_a_layer_and_keeps_the_logits"; fails=$((fails + 1))
fi

# The K/V cache rows' prefetch is on by default: a PREFETCH_KV on the aux stream in each of qwen3moe's
# 4 layers (no shared expert), none with --no-prefetch-kv, and the same CPU logits bitwise; in
# qwen2moe-gqa only its one layer without a shared expert on the aux stream has one
m=qwen3moe
flag_pair $m nokv --no-prefetch-kv
if [ -s "$tmp/$m-nokv1.npy" ] && cmp -s "$tmp/$m-nokv0.npy" "$tmp/$m-nokv1.npy" &&
    [ "$(grep -c ' aux  PREFETCH_KV ' "$tmp/$m-nokv0.txt")" = 4 ] && ! grep -q PREFETCH "$tmp/$m-nokv1.txt" &&
    [ "$(grep -c ' aux  PREFETCH_KV ' "$tmp/qwen2moe-gqa-pf0.txt")" = 1 ]; then
    echo "PASS prefetch_kv_by_default_where_no_shared_expert_and_keeps_the_logits"
else
    echo "FAIL prefetch_kv_by_default_where_no_shared_expert_and_keeps_the_logits"; fails=$((fails + 1))
fi

echo "$fails failed"
[ "$fails" -eq 0 ]
