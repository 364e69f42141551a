"""lm-evaluation-harness (lm-eval from PyPI) as an external client of msmoed's HTTP API, against
msmoe-eval over the socket API on the same items of data/eval, item by item, on the embedded model:
  - GSM8K, generate_until (--model local-completions, text prompts): the generated text and the
    extracted answer of every item equal msmoe-eval's (greedy);
  - MMLU, loglikelihood (local-completions with tokenizer_backend=remote: lm-eval tokenizes through
    /tokenize and scores with echo + logprobs): the chosen letter and the letters' logprobs equal
    msmoe-eval's (the logprob of the letter's token after "Answer:").
The tasks are custom YAMLs over JSONL files written here from data/eval with msmoe-eval's prompts
(checked against the prompt hashes in its report); no hub access. Prints the agreement numbers."""
import glob
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from msm_http_daemon import SOURCE, Daemon  # noqa: E402

EVAL = os.environ["MSMOE_EVAL"]
DATA = os.path.join(SOURCE, "data", "eval")
N_GSM8K, N_MMLU, SHOTS = 24, 32, 1
GSM8K_STOPS = ["Q:", "</s>", "<|im_end|>"]
MAX_TOKENS = 64


def fnv(s):
    h = 0xcbf29ce484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def gsm8k_items():
    shots = [json.loads(line) for line in open(os.path.join(DATA, "gsm8k", "fewshot.jsonl"))][:SHOTS]
    head = "".join(f"Q: {s['question']}\nA: {s['target']}\n\n" for s in shots)
    tests = [json.loads(line) for line in open(os.path.join(DATA, "gsm8k", "test.jsonl"))][:N_GSM8K]
    return [{"prompt": head + f"Q: {t['question']}\nA:", "reference": t["answer"].split("####")[-1].strip()}
            for t in tests]


def mmlu_items():
    import csv
    subjects = [line.split("\t")[0] for line in open(os.path.join(DATA, "mmlu", "subjects.tsv")).read().splitlines()[1:]]
    items = []
    for subj in subjects:
        dev = list(csv.reader(open(os.path.join(DATA, "mmlu", "dev", f"{subj}_dev.csv"), newline="")))[:SHOTS]
        test = list(csv.reader(open(os.path.join(DATA, "mmlu", "test", f"{subj}_test.csv"), newline="")))

        def block(row, answer):
            s = row[0] + "".join(f"\n{'ABCD'[k]}. {row[1 + k]}" for k in range(4)) + "\nAnswer:"
            return s + (f" {row[5]}\n\n" if answer else "")
        head = f"The following are multiple choice questions (with answers) about {subj.replace('_', ' ')}.\n\n"
        head += "".join(block(r, True) for r in dev)
        for r in test:
            if len(items) == N_MMLU:
                return items
            items.append({"prompt": head + block(r, False), "answer_idx": "ABCD".index(r[5])})
    return items


def run(args, **kw):
    t0 = time.time()
    p = subprocess.run(args, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        with open(os.path.join(tempfile.gettempdir(), "msm_lm_eval_failure.log"), "w") as f:
            f.write(p.stdout + p.stderr)
        raise AssertionError(f"{args[0]} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}")
    return p, time.time() - t0


class LmEval(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon("scheduler.max_queue=256", chat=False)
        cls.tmp = tempfile.mkdtemp(prefix="msm_lmeval_")

    @classmethod
    def tearDownClass(cls):
        assert cls.d.stop() == 0

    def msmoe_eval(self, task, *args):
        out = os.path.join(self.tmp, f"{task}.json")
        run([EVAL, task, "--socket", self.d.sock, "--quiet", "--shots", str(SHOTS), "--concurrency", "8",
             "--output", out, *args])
        return json.load(open(out))["items"]

    def lm_eval(self, task, items, yaml, model_args):
        data = os.path.join(self.tmp, f"{task}.jsonl")
        with open(data, "w") as f:
            for it in items:
                f.write(json.dumps(it) + "\n")
        tasks = os.path.join(self.tmp, "tasks")
        os.makedirs(tasks, exist_ok=True)
        with open(os.path.join(tasks, f"{task}.yaml"), "w") as f:
            f.write(yaml.replace("DATA_FILE", data))
        out = os.path.join(self.tmp, f"out_{task}")
        env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        _, secs = run([sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args",
                       f"base_url={self.d.base_url}/completions,model=stories260k-moe,num_concurrent=8,max_retries=1,"
                       + model_args, "--tasks", task, "--include_path", tasks, "--output_path", out, "--log_samples",
                       "--batch_size", "1"], env=env, timeout=900)
        files = glob.glob(os.path.join(out, "**", f"samples_{task}_*.jsonl"), recursive=True)
        self.assertEqual(len(files), 1, files)
        samples = sorted((json.loads(line) for line in open(files[0])), key=lambda s: s["doc_id"])
        self.assertEqual(len(samples), len(items))
        return samples, secs

    def test_gsm8k_generate_until_agrees_with_msmoe_eval(self):
        items = gsm8k_items()
        ref = self.msmoe_eval("gsm8k", "--limit", str(N_GSM8K), "--max-tokens", str(MAX_TOKENS))
        self.assertEqual([fnv(it["prompt"]) for it in items], [r["prompt_hash"] for r in ref],
                         "the prompts written here are msmoe-eval's")
        yaml = f"""task: gsm8k_msm
dataset_path: json
dataset_kwargs:
  data_files:
    test: DATA_FILE
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{reference}}}}"
generation_kwargs:
  until: {json.dumps(GSM8K_STOPS)}
  max_gen_toks: {MAX_TOKENS}
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
"""
        samples, secs = self.lm_eval("gsm8k_msm", items, yaml, "tokenizer_backend=None,tokenized_requests=False")
        same_text = sum(s["resps"][0][0] == r["output"] for s, r in zip(samples, ref))
        for s, r in zip(samples, ref):
            self.assertEqual(s["resps"][0][0], r["output"], f"{r['id']}: lm-eval and msmoe-eval differ")
        print(f"\nGSM8K ({N_GSM8K} items, {SHOTS}-shot, greedy, max {MAX_TOKENS} tokens): lm-eval text equal to "
              f"msmoe-eval on {same_text}/{len(ref)} items; lm-eval took {secs:.1f} s", file=sys.stderr)

    def test_mmlu_loglikelihood_agrees_with_msmoe_eval(self):
        items = mmlu_items()
        ref = self.msmoe_eval("mmlu", "--limit", str(N_MMLU))
        self.assertEqual([fnv(it["prompt"]) for it in items], [r["prompt_hash"] for r in ref])
        # msmoe-eval scores the token that carries each letter after "Answer:"; lm-eval is given
        # continuations that are exactly those tokens.
        tok = lambda text: self.d.json("POST", "/tokenize", {"prompt": text, "add_special_tokens": False})[1]["tokens"]
        base = tok("Answer:")
        choices = []
        for x in "ABCD":
            added = tok(f"Answer: {x}")[len(base):]
            choices.append(f" {x}" if len(added) == 1 else x)
            ctx = tok("<s>" + items[0]["prompt"])
            self.assertEqual(tok("<s>" + items[0]["prompt"] + choices[-1])[len(ctx):], added[-1:], x)
        yaml = f"""task: mmlu_msm
dataset_path: json
dataset_kwargs:
  data_files:
    test: DATA_FILE
test_split: test
output_type: multiple_choice
doc_to_text: "<s>{{{{prompt}}}}"
doc_to_choice: {json.dumps(choices)}
doc_to_target: answer_idx
target_delimiter: ""
metric_list:
  - metric: acc
"""
        samples, secs = self.lm_eval("mmlu_msm", items, yaml, "tokenizer_backend=remote,tokenized_requests=True")
        agree = scored = 0
        for s, r in zip(samples, ref):
            lls = [float(resp[0][0]) for resp in s["resps"]]
            pick = "ABCD"[max(range(4), key=lambda k: (lls[k], -k))]
            for k, x in enumerate("ABCD"):
                want = r["letter_logprobs"][x]
                want = float(want) if want is not None else -math.inf
                if math.isfinite(want):
                    self.assertAlmostEqual(lls[k], want, places=4, msg=f"{r['id']} {x}")
            if r["answer"] is not None:
                scored += 1
                agree += pick == r["answer"]
                self.assertEqual(pick, r["answer"], r["id"])
        print(f"\nMMLU ({N_MMLU} items, {SHOTS}-shot, loglikelihood): lm-eval's letter equal to msmoe-eval's on "
              f"{agree}/{scored} items msmoe-eval could score ({len(ref) - scored} had no letter in its top-20); "
              f"lm-eval took {secs:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
