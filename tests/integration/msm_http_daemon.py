"""Helpers of the HTTP API tests: start msmoed on the embedded model with [http] on a free port
(and a Unix socket for the socket API), wait for /health, stop it with SIGTERM."""
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

SOURCE = os.environ.get("MSM_SOURCE_ROOT", os.getcwd())
MSMOED = os.environ["MSMOED"]
MSMOE = os.environ.get("MSMOE", "")
MODEL = os.path.join(SOURCE, "models", "stories260k-moe")

# The test copy of the embedded model gets a chat template (the shipped model has none): Mixtral
# v0.1's [INST] template, whose <s> and </s> the stories260K tokenizer has.
MIXTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
    "are supported!') }}{% endif %}{% endfor %}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chat_model_copy(tmp):
    """models/stories260k-moe with a tokenizer_config.json holding a chat template (a test copy)."""
    d = os.path.join(tmp, "stories260k-moe")
    os.makedirs(d)
    for f in os.listdir(MODEL):
        os.symlink(os.path.join(MODEL, f), os.path.join(d, f))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "chat_template": MIXTRAL_TEMPLATE}, f)
    return d


class Daemon:
    def __init__(self, *sets, model=None, chat=True, env=None):
        self.tmp = tempfile.mkdtemp(prefix="msm_http_")
        self.port = free_port()
        self.sock = os.path.join(self.tmp, "msmoed.sock")
        self.log = open(os.path.join(self.tmp, "msmoed.log"), "w+")
        if model is None and chat:
            model = chat_model_copy(self.tmp)
        args = [MSMOED, "--set", f"server.socket={self.sock}", "--set", "http.enabled=true",
                "--set", f"http.port={self.port}", "--set", "http.model_name=stories260k-moe"]
        if model:
            args += ["--set", f"engine.model={model}"]
        for s in sets:
            args += ["--set", s]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("msmoed exited during start-up:\n" + self.logtext())
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("msmoed did not become healthy:\n" + self.logtext())

    def logtext(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    @property
    def base_url(self):
        return f"http://127.0.0.1:{self.port}/v1"

    def request(self, method, path, body=None, headers=None, timeout=60):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, r.read(), r
        finally:
            c.close()

    def json(self, method, path, body=None, headers=None):
        st, data, _ = self.request(method, path, body, headers)
        return st, json.loads(data)

    def metric(self, name):
        """The unlabelled sample of a metric (the node's total), or the labelled one when name has labels."""
        st, data, _ = self.request("GET", "/metrics")
        for line in data.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return None

    def socket_generate(self, *args):
        """The socket API through the msmoe CLI (the reference the HTTP answers must equal)."""
        out = subprocess.run([MSMOE, "--socket", self.sock, "generate", *args], check=True,
                             capture_output=True, text=True, timeout=120)
        return out.stdout

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait()
        else:
            rc = self.proc.returncode
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        return rc
