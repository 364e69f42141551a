"""The OpenAI-compatible HTTP API of msmoed (daemon/http.c, daemon/http_openai.c) on the embedded
model, through the official openai Python client and raw HTTP:
  - greedy completions and chat completions equal the socket API's output (the msmoe CLI);
  - batches of prompts, token-id prompts, n > 1, streaming (deltas add up, [DONE], usage);
  - logprobs and echo: prompt-token logprobs agree with the logprobs of generated tokens;
  - every kind of bad request answers 4xx with OpenAI's error object naming the field, and the
    daemon keeps serving; a stream cut by its client cancels the request and frees its KV blocks;
  - the API key, the connection cap and the read timeout (slowloris) of [http];
  - text work off the loop thread: /health answers while MiBs are being tokenized;
  - the connection guard of every listener (docs/adr/0007-hardening.md) on [http]: its
    connections count against server.max_connections, and one whose client takes none of its
    replies is closed after server.write_timeout_s;
  - an engine step that never returns: the step watchdog answers the HTTP request with an error
    and msmoed exits 1.
Run by tests/integration/test_http.sh (meson test http), stdlib unittest."""
import http.client
import json
import os
import select
import socket
import sys
import tempfile
import threading
import time
import unittest

import openai

sys.path.insert(0, os.path.dirname(__file__))
from msm_http_daemon import Daemon  # noqa: E402

PROMPTS = ["Once upon a time", "The little dog", "Lily and Tom went to the park.", "One day, a big"]
D = None


def setUpModule():
    global D
    D = Daemon()


def tearDownModule():
    rc = D.stop()
    assert rc == 0, f"msmoed exited with {rc}"


def client():
    return openai.OpenAI(base_url=D.base_url, api_key="unused", max_retries=0, timeout=60)


def socket_text(prompt, n):
    out = D.socket_generate(prompt, "--max-tokens", str(n), "--temperature", "0", "--no-echo")
    return out[:-1] if out.endswith("\n") else out


def socket_ids(prompt, n):
    out = D.socket_generate(prompt, "--max-tokens", str(n), "--temperature", "0", "--print-ids").strip()
    return [int(x) for x in out.split(",") if x]


class Routes(unittest.TestCase):
    def test_health_models_tokenizer(self):
        st, h = D.json("GET", "/health")
        self.assertEqual((st, h["status"]), (200, "ok"))
        models = client().models.list()
        self.assertEqual([m.id for m in models.data], ["stories260k-moe"])
        st, info = D.json("GET", "/tokenizer_info")
        self.assertEqual((st, info["bos_token"], info["eos_token"]), (200, "<s>", "<s>"))
        st, tok = D.json("POST", "/tokenize", {"prompt": "Once upon a time"})
        self.assertEqual(tok["tokens"][0], 1)
        self.assertEqual(tok["count"], len(tok["tokens"]))
        st, tok2 = D.json("POST", "/tokenize", {"prompt": "</s>", "add_special_tokens": False})
        self.assertEqual(tok2["tokens"], [2], "special tokens in the text are parsed, as Hugging Face does")
        st, det = D.json("POST", "/detokenize", {"tokens": tok["tokens"]})
        self.assertEqual((st, det["prompt"]), (200, "<s> Once upon a time"))

    def test_metrics(self):
        st, data, r = D.request("GET", "/metrics")
        self.assertEqual(st, 200)
        self.assertIn("text/plain", r.getheader("Content-Type"))
        self.assertIn(b"msmoed_tokens_generated_total", data)


class Completions(unittest.TestCase):
    def test_greedy_equals_the_socket_api(self):
        c = client()
        for p in PROMPTS:
            r = c.completions.create(model="stories260k-moe", prompt=p, max_tokens=40, temperature=0)
            self.assertEqual(r.choices[0].text, socket_text(p, 40), p)
            self.assertEqual(r.usage.completion_tokens, len(socket_ids(p, 40)))
            self.assertEqual(r.choices[0].finish_reason, "length")

    def test_batch_and_token_ids(self):
        ids = D.json("POST", "/tokenize", {"prompt": PROMPTS[1]})[1]["tokens"]
        r = client().completions.create(model="stories260k-moe", prompt=[PROMPTS[0], ids, PROMPTS[2]], max_tokens=16,
                                        temperature=0)
        self.assertEqual([ch.index for ch in r.choices], [0, 1, 2])
        self.assertEqual([ch.text for ch in r.choices], [socket_text(p, 16) for p in PROMPTS[:3]])
        r2 = client().completions.create(model="stories260k-moe", prompt=[ids, ids], max_tokens=8, temperature=0)
        self.assertEqual(r2.choices[0].text, r2.choices[1].text)

    def test_n_samples_are_seeded(self):
        kw = dict(model="stories260k-moe", prompt=PROMPTS[0], max_tokens=24, temperature=1.0, seed=7, n=3)
        a, b = client().completions.create(**kw), client().completions.create(**kw)
        self.assertEqual([c.text for c in a.choices], [c.text for c in b.choices], "same seed, same samples")
        self.assertEqual(len({c.text for c in a.choices}), 3, "n samples differ")

    def test_stop_strings(self):
        full = socket_text(PROMPTS[0], 40)
        r = client().completions.create(model="stories260k-moe", prompt=PROMPTS[0], max_tokens=40, temperature=0,
                                        stop=["Lily"])
        self.assertEqual(r.choices[0].text, full[:full.index("Lily")])
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_streaming_adds_up(self):
        c = client()
        for p in PROMPTS[:2]:
            deltas, finish = [], None
            for chunk in c.completions.create(model="stories260k-moe", prompt=p, max_tokens=30, temperature=0,
                                              stream=True):
                deltas.append(chunk.choices[0].text)
                finish = chunk.choices[0].finish_reason or finish
            self.assertEqual("".join(deltas), socket_text(p, 30))
            self.assertEqual(finish, "length")

    def test_raw_stream_ends_with_done_and_usage(self):
        st, data, r = D.request("POST", "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 5, "temperature": 0,
                                                            "stream": True, "stream_options": {"include_usage": True}})
        self.assertEqual(st, 200)
        self.assertIn("text/event-stream", r.getheader("Content-Type"))
        events = [e for e in data.decode().split("\n\n") if e]
        self.assertTrue(all(e.startswith("data: ") for e in events))
        self.assertEqual(events[-1], "data: [DONE]")
        usage = json.loads(events[-2][6:])
        self.assertEqual(usage["choices"], [])
        self.assertEqual(usage["usage"]["completion_tokens"], 5)

    def test_echo_logprobs_score_the_prompt(self):
        """lm-eval's loglikelihood request: echo, logprobs, the prompt's logprobs."""
        c = client()
        gen = c.completions.create(model="stories260k-moe", prompt=PROMPTS[0], max_tokens=3, temperature=0, logprobs=2)
        lp = gen.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 3)
        for tok, top in zip(lp.token_logprobs, lp.top_logprobs):
            self.assertAlmostEqual(tok, max(top.values()), places=6, msg="greedy: the chosen token is the top one")
        # The prompt extended by the generated tokens, scored: their logprobs as prompt tokens equal
        # their logprobs as generated tokens.
        ids = D.json("POST", "/tokenize", {"prompt": PROMPTS[0]})[1]["tokens"]
        gen_ids = socket_ids(PROMPTS[0], 3)
        for max_tokens in (0, 1):
            r = c.completions.create(model="stories260k-moe", prompt=ids + gen_ids, max_tokens=max_tokens,
                                     temperature=0, logprobs=1, echo=True)
            e = r.choices[0].logprobs
            self.assertEqual(len(e.token_logprobs), len(ids) + 3 + max_tokens)
            self.assertIsNone(e.token_logprobs[0])
            self.assertIsNone(e.top_logprobs[0])
            for i in range(3):
                self.assertAlmostEqual(e.token_logprobs[len(ids) + i], lp.token_logprobs[i], places=4)
            self.assertEqual(e.text_offset[0], 0)
            self.assertEqual("".join(e.tokens), r.choices[0].text)
            self.assertEqual(r.usage.completion_tokens, max_tokens)


class Chat(unittest.TestCase):
    MSGS = [{"role": "user", "content": "Tell me a story about a cat."}]

    def test_greedy_equals_the_socket_api_on_the_rendered_prompt(self):
        r = client().chat.completions.create(model="stories260k-moe", messages=self.MSGS, max_tokens=40, temperature=0)
        want = socket_text("[INST] Tell me a story about a cat. [/INST]", 40)
        self.assertEqual(r.choices[0].message.content, want)
        self.assertEqual(r.choices[0].message.role, "assistant")

    def test_streaming_and_logprobs(self):
        c = client()
        full = c.chat.completions.create(model="stories260k-moe", messages=self.MSGS, max_tokens=20, temperature=0,
                                         logprobs=True, top_logprobs=2)
        content = full.choices[0].logprobs.content
        self.assertEqual(len(content), 20)
        self.assertTrue(all(len(t.top_logprobs) == 2 for t in content))
        self.assertEqual("".join(t.token for t in content), full.choices[0].message.content)
        deltas = [ch.choices[0].delta.content or "" for ch in
                  c.chat.completions.create(model="stories260k-moe", messages=self.MSGS, max_tokens=20,
                                            temperature=0, stream=True)]
        self.assertEqual("".join(deltas), full.choices[0].message.content)

    def test_roles_must_alternate(self):
        with self.assertRaises(openai.BadRequestError) as cm:
            client().chat.completions.create(model="stories260k-moe", messages=[{"role": "assistant", "content": "x"}])
        self.assertIn("alternate", str(cm.exception))


class BadRequests(unittest.TestCase):
    def check(self, body, status, param=None, path="/v1/completions", raw=False):
        st, data, _ = D.request("POST", path, body if raw else json.dumps(body),
                                headers={"Content-Type": "application/json"})
        self.assertEqual(st, status, data)
        err = json.loads(data)["error"]
        self.assertTrue(err["message"])
        if param is not None:
            self.assertEqual(err["param"], param, err)
        return err

    def test_each_bad_request_is_answered_and_the_daemon_keeps_serving(self):
        self.check(b'{"prompt": "hi", ', 400, raw=True)                            # malformed JSON
        self.check({"prompt": 12}, 400, "prompt")                                  # wrong type
        self.check({"prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens")
        self.check({"prompt": "hi", "colour": "blue"}, 400, "colour")              # unknown field
        self.check(b'{"prompt": "\xff\xfe"}', 400, raw=True)                       # bad UTF-8
        self.check({"prompt": "hi", "n": 100}, 400, "n")
        self.check({"prompt": "hi", "best_of": 3}, 400, "best_of")
        self.check({"prompt": "hi", "logprobs": 21}, 400, "logprobs")
        self.check({"prompt": "hi", "max_tokens": -1}, 400, "max_tokens")
        self.check({"prompt": "hi", "model": "gpt-4o"}, 404, "model")
        self.check({"messages": "hi"}, 400, "messages", path="/v1/chat/completions")
        self.check({"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content",
                   path="/v1/chat/completions")
        self.check({"tokens": [1, 99999]}, 400, "tokens", path="/detokenize")
        s = socket.create_connection(("127.0.0.1", D.port))                       # huge body: refused
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{" % (9 << 20))
        s.settimeout(10)
        self.assertTrue(s.recv(4096).startswith(b"HTTP/1.1 413"))                 # before it is sent
        s.close()
        st, data, _ = D.request("GET", "/v1/completions")
        self.assertEqual(st, 405)
        st, data, _ = D.request("GET", "/nope")
        self.assertEqual((st, "error" in json.loads(data)), (404, True))
        st, data, _ = D.request("GET", "/health", headers={"X-Big": "x" * 20000})
        self.assertEqual(st, 431)                                                  # headers over the cap
        r = client().completions.create(model="stories260k-moe", prompt=PROMPTS[0], max_tokens=8, temperature=0)
        self.assertEqual(r.choices[0].text, socket_text(PROMPTS[0], 8))
        with self.assertRaises(openai.BadRequestError):
            client().completions.create(model="stories260k-moe", prompt="hi", max_tokens=-5)

    def test_a_stream_cut_by_the_client_cancels_and_frees_its_blocks(self):
        cancelled = D.metric('msmoed_requests_finished_total{reason="cancelled"}') or 0
        s = socket.create_connection(("127.0.0.1", D.port))
        body = json.dumps({"prompt": PROMPTS[0], "max_tokens": 450, "ignore_eos": True, "stream": True})
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        got = b""
        while got.count(b"data: ") < 3:
            got += s.recv(4096)
        s.close()
        deadline = time.time() + 20
        while time.time() < deadline:
            if (D.metric('msmoed_requests_finished_total{reason="cancelled"}') or 0) > cancelled and \
               D.metric("msmoed_kv_blocks_used") == 0:
                break
            time.sleep(0.05)
        self.assertGreater(D.metric('msmoed_requests_finished_total{reason="cancelled"}'), cancelled)
        self.assertEqual(D.metric("msmoed_kv_blocks_used"), 0)
        self.assertLess(D.metric("msmoed_tokens_generated_total"), 1e9)


class Limits(unittest.TestCase):
    """A second daemon: API key, connection cap 3, read timeout 600 ms."""

    @classmethod
    def setUpClass(cls):
        cls.keyfile = tempfile.NamedTemporaryFile("w", delete=False)
        cls.keyfile.write("s3cret-key\n")
        cls.keyfile.close()
        cls.d = Daemon(f"http.api_key_file={cls.keyfile.name}", "http.max_connections=3",
                       "http.read_timeout_ms=600", chat=False)

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()
        os.unlink(cls.keyfile.name)

    def test_api_key(self):
        body = {"prompt": "Once", "max_tokens": 2}
        self.assertEqual(self.d.request("POST", "/v1/completions", body)[0], 401)
        self.assertEqual(self.d.request("POST", "/v1/completions", body, {"Authorization": "Bearer wrong-key"})[0], 401)
        self.assertEqual(self.d.request("POST", "/v1/completions", body, {"Authorization": "Bearer s3cret-key"})[0], 200)
        self.assertEqual(self.d.request("GET", "/health")[0], 200, "probes need no key")
        with openai.OpenAI(base_url=self.d.base_url, api_key="s3cret-key", max_retries=0) as c:
            self.assertEqual(len(c.completions.create(model="stories260k-moe", prompt="Once", max_tokens=3).choices),
                             1)
        with self.assertRaises(openai.AuthenticationError), \
                openai.OpenAI(base_url=self.d.base_url, api_key="nope", max_retries=0) as c:
            c.models.list()

    def test_chat_without_a_template_answers_501(self):
        st, data, _ = self.d.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]},
                                     {"Authorization": "Bearer s3cret-key"})
        self.assertEqual(st, 501)
        self.assertIn("tokenizer_config.json", json.loads(data)["error"]["message"])

    def test_connection_cap_and_slowloris(self):
        # Keep-alive connections of earlier tests are gone (closed by http.read_timeout_ms at the
        # latest): one closing between the three below and the fourth would let the fourth in.
        time.sleep(0.8)
        idle = [socket.create_connection(("127.0.0.1", self.d.port)) for _ in range(3)]
        time.sleep(0.1)
        extra = socket.create_connection(("127.0.0.1", self.d.port))
        extra.settimeout(5)
        self.assertTrue(extra.recv(4096).startswith(b"HTTP/1.1 503"))
        extra.close()
        # A client that sends half a request and stalls is closed after http.read_timeout_ms.
        idle[0].sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        for s in idle:
            s.settimeout(5)
        t0 = time.time()
        self.assertEqual(idle[0].recv(4096), b"")
        self.assertLess(time.time() - t0, 3)
        for s in idle:
            s.close()
        time.sleep(0.2)
        self.assertEqual(self.d.request("GET", "/health")[0], 200, "connections are accepted again")


class TextOffTheLoop(unittest.TestCase):
    """Encoding runs on libuv's thread pool (docs/adr/0007-hardening.md): MiBs of text being
    tokenized do not hold up another client's /health, and a prompt that cannot fit the context is
    refused before it is encoded."""

    def test_tokenization_does_not_stall_other_clients(self):
        text = ("Once upon a time, there was a little dog. " * 25000)[:(1 << 20) - 64]
        t0 = time.time()
        st, data, _ = D.request("POST", "/tokenize", {"prompt": text})
        one = time.time() - t0
        self.assertEqual(st, 200, data[:200])
        done = []
        workers = [threading.Thread(target=lambda: done.append(D.request("POST", "/tokenize", {"prompt": text})[0]))
                   for _ in range(8)]
        for w in workers:
            w.start()
        worst = 0
        for _ in range(20):
            h0 = time.time()
            self.assertEqual(D.request("GET", "/health")[0], 200)
            worst = max(worst, time.time() - h0)
            time.sleep(0.02)
        for w in workers:
            w.join()
        self.assertEqual(done, [200] * 8)
        print(f"\ntokenizing 1 MiB: {one * 1000:.0f} ms; /health with 8 MiB being tokenized: worst "
              f"{worst * 1000:.1f} ms", file=sys.stderr)
        self.assertLess(worst, max(one / 2, 0.05), "/health waited behind tokenization")
        t0 = time.time()
        st, data, _ = D.request("POST", "/v1/completions", {"prompt": text, "max_tokens": 1})
        self.assertEqual(st, 400)
        self.assertIn("encodes to at least", json.loads(data)["error"]["message"])
        self.assertLess(time.time() - t0, max(one / 2, 0.05), "encoded before it was refused")


class Guard(unittest.TestCase):
    """A third daemon: server.max_connections 3 (over every listener), server.write_timeout_s 1."""

    @classmethod
    def setUpClass(cls):
        cls.d = Daemon("server.max_connections=3", "server.write_timeout_s=1", chat=False)

    @classmethod
    def tearDownClass(cls):
        rc = cls.d.stop()
        assert rc == 0, f"msmoed exited with {rc}"

    def held_and_one_more(self):
        """Three connections held open, and the answer to a fourth (b"" when it is not refused)."""
        held = [socket.create_connection(("127.0.0.1", self.d.port)) for _ in range(3)]
        time.sleep(0.1)
        extra = socket.create_connection(("127.0.0.1", self.d.port))
        extra.settimeout(1)
        try:
            answer = extra.recv(4096)
        except socket.timeout:
            answer = b""
        extra.close()
        return held, answer

    def test_http_connections_count_against_server_max_connections(self):
        # The connections of earlier requests may still be closing on a loaded machine (one closing
        # between the held three and the fourth lets the fourth in): try until all three are held
        # and the fourth is refused.
        deadline = time.time() + 10
        while True:
            held, answer = self.held_and_one_more()
            all_held = not select.select(held, [], [], 0)[0]  # a refused one would have its 503 to read
            if (all_held and answer.startswith(b"HTTP/1.1 503")) or time.time() > deadline:
                break
            for s in held:
                s.close()
            time.sleep(0.3)
        self.assertTrue(all_held)
        self.assertTrue(answer.startswith(b"HTTP/1.1 503"), answer)
        self.assertIn(b"server.max_connections", answer)
        # the socket API shares the limit: refused with a frame naming it
        u = socket.socket(socket.AF_UNIX)
        u.settimeout(5)
        u.connect(self.d.sock)
        self.assertIn(b"server.max_connections", u.recv(4096))
        u.close()
        for s in held:
            s.close()
        time.sleep(0.2)
        self.assertEqual(self.d.request("GET", "/health")[0], 200, "connections are accepted again")
        self.assertGreaterEqual(self.d.metric("msmoed_connections_refused_total"), 2)

    def test_a_client_that_takes_no_reply_is_closed_after_server_write_timeout_s(self):
        name = 'msmoed_connections_timed_out_total{reason="stalled"}'
        before = self.d.metric(name)
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", self.d.port))
        # pipelined requests whose answers (MBs in all) the client never reads
        s.settimeout(1)
        req = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 100
        try:
            for _ in range(40):
                s.sendall(req)
        except socket.timeout:
            pass  # the daemon's receive buffer is full: it is not reading them either
        t0 = time.time()
        while time.time() - t0 < 15 and self.d.metric(name) == before:
            time.sleep(0.1)
        self.assertEqual(self.d.metric(name), before + 1, "not closed after server.write_timeout_s")
        s.settimeout(5)
        try:
            while s.recv(65536):
                pass
        except ConnectionResetError:
            pass
        s.close()
        self.assertEqual(self.d.request("GET", "/health")[0], 200)


if __name__ == "__main__":
    unittest.main(verbosity=2)


class StuckStep(unittest.TestCase):
    """A fake engine whose step 3 never returns (MSMOED_TEST_FAULT=stall@3), deadline 100 ms: at
    2 x 100 ms + 5 s the step watchdog ends the HTTP request with INTERNAL (500, OpenAI's error
    object naming what is stuck), and msmoed exits 1."""

    def test_the_request_ends_and_the_daemon_exits_1(self):
        d = Daemon("engine.backend=fake", "engine.deadline_ms=100",
                   "engine.tokenizer=" + os.path.join(os.environ.get("MSM_SOURCE_ROOT", os.getcwd()),
                                                      "models", "stories260k-moe", "tokenizer.json"),
                   chat=False, env={"MSMOED_TEST_FAULT": "stall@3", "MSMOED_FAKE_STEP_US": "1000"})
        try:
            t0 = time.time()
            st, data, _ = d.request("POST", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 50},
                                    timeout=30)
            took = time.time() - t0
            self.assertEqual(st, 500, data)
            self.assertIn("has not returned", json.loads(data)["error"]["message"])
            self.assertLess(took, 20)
            self.assertEqual(d.proc.wait(timeout=30), 1, d.logtext())
        finally:
            d.stop()
