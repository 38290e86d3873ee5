#!/usr/bin/env python3
"""mpitron's text_generation_server driven by OpenAI's official Python client (`openai`), as a user
would: chat.completions.create (plain, stream=True with include_usage, n=2 with a seed, stop,
logprobs) and completions.create (plain, stream, n, stop), models.list, the error classes the client
raises for our error objects, and /health and /metrics over plain HTTP. Every answer is parsed by
the client's own pydantic models, so a field of the wrong shape fails here.

Run from the repository root with the reference venv (scripts/setup-reference-venv.sh) after
building the server (build-cpu/apps/text_generation_server and convert_checkpoint):
    /work/.venv-ref/bin/python tests/reference/openai_client_check.py [--build build-cpu]
        [--out tests/apps/ref/openai_client_transcript.json]
It converts tests/apps/ref/gpt2_tiny.safetensors to a checkpoint, starts the server with the chat
template of tests/apps/ref/gpt2_tiny_tokenizer_config.json, runs the checks, writes the transcript
(requests, the client's parsed answers without ids and times, and each check) and exits 1 when a
check fails. CI has no venv: tests/apps/test_openai_server.cpp sends the same requests over HTTP.
"""
import argparse
import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

import openai

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REF = os.path.join(ROOT, "tests", "apps", "ref")
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]

checks = []
transcript = []


def check(name, ok, detail=""):
    checks.append({"check": name, "ok": bool(ok), **({"detail": detail} if detail and not ok else {})})
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else f": {detail}"))


def record(call, request, answer):
    def strip(d):
        if isinstance(d, dict):
            return {k: strip(v) for k, v in d.items() if k not in ("id", "created", "system_fingerprint")}
        if isinstance(d, list):
            return [strip(x) for x in d]
        return d
    transcript.append({"call": call, "request": request, "answer": strip(answer)})


def start_server(build, tmp):
    ckpt = os.path.join(tmp, "ckpt")
    subprocess.run([os.path.join(build, "apps", "convert_checkpoint"), "--direction", "hf-to-mpitron",
                    "--input", os.path.join(REF, "gpt2_tiny.safetensors"),
                    "--hf-config", os.path.join(REF, "gpt2_tiny_config.json"), "--output", ckpt],
                   check=True, capture_output=True)
    log = open(os.path.join(tmp, "server.log"), "w+")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_CORETYPE="Prescott")
    proc = subprocess.Popen([os.path.join(build, "apps", "text_generation_server"), "--load", ckpt, "--port", "0",
                             "--inference-dynamic-batching", "--chat-template",
                             os.path.join(REF, "gpt2_tiny_tokenizer_config.json")],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    for _ in range(600):
        log.seek(0)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", log.read())
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            log.seek(0)
            sys.exit("server exited:\n" + log.read())
        time.sleep(0.1)
    proc.kill()
    sys.exit("server did not start")


def run_checks(port):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    models = client.models.list()
    model = models.data[0].id
    record("models.list", {}, models.model_dump())
    check("models.list: one model, OpenAI's list", len(models.data) == 1 and models.data[0].object == "model")

    # Plain chat, greedy.
    req = dict(model=model, messages=MESSAGES, max_tokens=8, temperature=0)
    plain = client.chat.completions.create(**req)
    record("chat.completions.create", req, plain.model_dump())
    text = plain.choices[0].message.content
    check("chat: a ChatCompletion with one assistant message",
          plain.object == "chat.completion" and plain.choices[0].message.role == "assistant" and isinstance(text, str))
    check("chat: finish_reason length after max_tokens", plain.choices[0].finish_reason == "length")
    check("chat: usage adds up", plain.usage.completion_tokens == 8 and
          plain.usage.total_tokens == plain.usage.prompt_tokens + 8 and plain.usage.prompt_tokens > 0)
    # The same prompt text through /v1/completions gives the same greedy text.
    rendered = "System: You are terse.\nUser: Name a colour.\nAssistant:"
    creq = dict(model=model, prompt=rendered, max_tokens=8, temperature=0)
    comp = client.completions.create(**creq)
    record("completions.create", creq, comp.model_dump())
    check("completions: the rendered chat prompt completes to the chat answer", comp.choices[0].text == text)
    check("completions: usage prompt_tokens equals chat's", comp.usage.prompt_tokens == plain.usage.prompt_tokens)

    # Streaming with usage.
    req = dict(model=model, messages=MESSAGES, max_tokens=8, temperature=0, stream=True,
               stream_options={"include_usage": True})
    chunks = list(client.chat.completions.create(**req))
    record("chat.completions.create(stream=True)", req, [c.model_dump() for c in chunks])
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    check("chat stream: first delta carries the role", chunks[0].choices[0].delta.role == "assistant")
    check("chat stream: deltas add up to the plain answer", content == text, f"{content!r} vs {text!r}")
    check("chat stream: one finish_reason", finishes == ["length"], str(finishes))
    check("chat stream: last chunk has the usage and no choices",
          chunks[-1].choices == [] and chunks[-1].usage is not None and
          chunks[-1].usage.completion_tokens == plain.usage.completion_tokens)

    # n with a seed: reproducible.
    req = dict(model=model, messages=MESSAGES, max_tokens=6, n=2, seed=7, temperature=1.0)
    a = client.chat.completions.create(**req)
    b = client.chat.completions.create(**req)
    record("chat.completions.create(n=2, seed=7)", req, a.model_dump())
    check("chat n=2: two choices, indices 0 and 1", [c.index for c in a.choices] == [0, 1])
    check("chat seed: the same request twice gives the same choices",
          [c.message.content for c in a.choices] == [c.message.content for c in b.choices])
    check("chat n=2: the choices differ", a.choices[0].message.content != a.choices[1].message.content)

    # stop: cut before it.
    stop = text[5:8]
    req = dict(model=model, messages=MESSAGES, max_tokens=8, temperature=0, stop=[stop])
    s = client.chat.completions.create(**req)
    record("chat.completions.create(stop)", req, s.model_dump())
    check("chat stop: text cut before the stop string, finish_reason stop",
          s.choices[0].message.content == text[:text.find(stop)] and s.choices[0].finish_reason == "stop",
          f"{s.choices[0].message.content!r} stop={stop!r}")
    req["stream"] = True
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**req) if c.choices)
    check("chat stop, streamed: the same text", streamed == text[:text.find(stop)], repr(streamed))

    # logprobs.
    req = dict(model=model, messages=MESSAGES, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2)
    lp = client.chat.completions.create(**req)
    record("chat.completions.create(logprobs)", req, lp.model_dump())
    content_lp = lp.choices[0].logprobs.content
    check("chat logprobs: one entry per token, two alternatives each, the chosen one first",
          len(content_lp) == 3 and all(len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token for e in content_lp))

    # completions: stream, n, stop.
    creq = dict(model=model, prompt=rendered, max_tokens=8, temperature=0, stream=True)
    cs = "".join(c.choices[0].text for c in client.completions.create(**creq))
    check("completions stream: the same text", cs == text)
    creq = dict(model=model, prompt=["a", "b"], max_tokens=3, n=2, seed=3)
    cn = client.completions.create(**creq)
    record("completions.create(n=2, two prompts)", creq, cn.model_dump())
    check("completions n=2 over two prompts: four choices", [c.index for c in cn.choices] == [0, 1, 2, 3])
    creq = dict(model=model, prompt=rendered, max_tokens=8, temperature=0, stop=stop)
    cst = client.completions.create(**creq)
    check("completions stop", cst.choices[0].text == text[:text.find(stop)] and cst.choices[0].finish_reason == "stop")

    # Errors as the client raises them.
    try:
        client.chat.completions.create(model="gpt-4", messages=MESSAGES)
        check("unknown model: NotFoundError", False, "no error")
    except openai.NotFoundError as e:
        record("chat.completions.create(model='gpt-4')", {"model": "gpt-4"}, e.body)
        check("unknown model: NotFoundError with code model_not_found", e.status_code == 404 and e.code == "model_not_found")
    try:
        client.chat.completions.create(model=model, messages=MESSAGES, n=0)
        check("n=0: BadRequestError", False, "no error")
    except openai.BadRequestError as e:
        record("chat.completions.create(n=0)", {"n": 0}, e.body)
        check("n=0: BadRequestError naming param n", e.status_code == 400 and e.param == "n")
    try:
        client.chat.completions.create(model=model, messages=[])
        check("empty messages: BadRequestError", False, "no error")
    except openai.BadRequestError as e:
        check("empty messages: BadRequestError naming messages", e.param == "messages")

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health") as h:
        check("GET /health: 200", h.status == 200)
    # A response is counted once it has gone out, on its connection's thread: wait for the last ones.
    for _ in range(100):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as m:
            body = m.read().decode()
        n_chat = re.search(r'mpitron_http_requests_total\{method="POST",path="/v1/chat/completions",status="200"\} (\d+)', body)
        if n_chat and int(n_chat.group(1)) >= 7:
            break
        time.sleep(0.05)
    check("GET /metrics: the 7 chat completions above counted", n_chat is not None and int(n_chat.group(1)) == 7,
          n_chat.group(0) if n_chat else body[:400])
    check("GET /metrics: TTFT histogram", "mpitron_time_to_first_token_seconds_count" in body)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build-cpu"))
    ap.add_argument("--out", default=os.path.join(REF, "openai_client_transcript.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_server(args.build, tmp)
        try:
            run_checks(port)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    failed = [c for c in checks if not c["ok"]]
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"openai": md.version("openai"), "checks": checks, "passed": len(checks) - len(failed),
                   "failed": len(failed), "transcript": transcript}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(checks) - len(failed)} of {len(checks)} checks passed -> {args.out}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
