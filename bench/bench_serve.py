#!/usr/bin/env python3
"""bench_serve: text_generation_server under load, beside the one-at-a-time server and transformers.

One run, one machine, one model and one list of prompts:
  * the servers, each started fresh and driven by C concurrent HTTP clients (C = 1, 8, 32; each
    client sends its next request when its answer arrives; every request is Megatron's
    PUT /api {"prompts": [p], "tokens_to_generate": N, "top_k": 1}, which every version speaks):
      dynamic    text_generation_server --inference-dynamic-batching (this tree)
      static     text_generation_server without it: one request at a time (Megatron's static mode)
    (each request also asks for logprobs: their count is the number of tokens it generated)
      baseline   --baseline-server BIN: an older build (bench/build_baseline_server.sh makes the one
                 before the dynamic engine: its own HTTP loop, one request at a time)
    measured: generated tokens / wall time, p50 and p99 request latency, and (dynamic) the
    peak KV blocks against the pool from the server's exit line;
  * transformers' GPT2LMHeadModel.generate (greedy, max_new_tokens = min_new_tokens = N) on the
    same weights (convert_checkpoint --direction mpitron-to-hf) and prompts, in batches of B = 1,
    8, 32 (left padding): tokens / wall time, latency = the batch's time. Skipped with a note when
    torch or transformers is missing (--no-hf skips it).
The model is a GPT-2 of --layers/--hidden/--heads with the GPT-2 vocabulary, made by
pretrain_gpt --mock-data (one step at lr 1e-9: the initial weights) unless --load is given.

--shared-prefix N runs the prefix caching workload instead (issue #46): every request is a common
"system prompt" of N token ids and a distinct suffix of --suffix-tokens ids, sent by C clients to the
dynamic server without and with --inference-dynamic-batching-prefix-caching (eviction policy
--prefix-policy) as streamed POST /v1/completions (greedy, token-id prompts, logprobs): tokens/s,
time to first token (the first streamed chunk) p50/p99, request latency, the engine's prefix cache
line, and whether both servers streamed the same tokens and log-probabilities.

    python3 bench/bench_serve.py --build build-cpu --threads 1 --shared-prefix 512 --clients 16 \
        --positions 1024 --new-tokens 16 --requests 2 --no-hf

    python3 bench/bench_serve.py --build build-cpu --threads 2 --json bench_serve.json
    (on a machine whose cores other jobs share, --threads 1: OpenMP threads spin at the many small
    barriers of a decode step, and with the cores oversubscribed the spinning took ~75% of the
    dynamic server's time in perf and cut its throughput 5x)
    python3 bench/bench_serve.py --build build-cpu --baseline-server /tmp/old/text_generation_server
"""
import argparse
import json
import os
import queue
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run(cmd, env=None, check=True):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and p.returncode != 0:
        sys.exit(f"bench_serve: {' '.join(cmd)} failed:\n{p.stdout[-3000:]}")
    return p.stdout


def make_model(args, work):
    ck = os.path.join(work, "ckpt")
    run([os.path.join(args.build, "apps", "pretrain_gpt"), "--num-layers", str(args.layers), "--hidden-size",
         str(args.hidden), "--num-attention-heads", str(args.heads), "--seq-length", str(args.positions),
         "--max-position-embeddings", str(args.positions), "--micro-batch-size", "1", "--global-batch-size", "1",
         "--train-iters", "1", "--lr", "1e-9", "--mock-data", "--eval-iters", "0", "--save", ck, "--save-interval",
         "1", "--device", args.make_device], env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
    return ck


def prompts_from(path, n):
    text = open(path, encoding="utf-8").read().split("\n")
    lines = [l.strip() for l in text if len(l.strip()) > 20]
    return [lines[(i * 37) % len(lines)][: 40 + (i * 13) % 60] for i in range(n)]


class Server:
    def __init__(self, binary, load, extra, threads, work, name, source):
        self.log_path = os.path.join(work, f"server_{name}.log")
        self.logf = open(self.log_path, "w")
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        # The tokenizer files named: a binary's default path is its own source tree (gone for the baseline).
        gpt2 = os.path.join(source, "assets", "gpt2")
        self.p = subprocess.Popen([binary, "--load", load, "--port", "0", "--vocab-file",
                                   os.path.join(gpt2, "gpt2-vocab.json"), "--merge-file",
                                   os.path.join(gpt2, "gpt2-merges.txt")] + extra, stdout=self.logf,
                                  stderr=subprocess.STDOUT, env=env)
        self.port = None
        for _ in range(1200):
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(self.log_path).read())
            if m:
                self.port = int(m.group(1))
                break
            if self.p.poll() is not None:
                break
            time.sleep(0.1)
        if self.port is None:
            sys.exit(f"bench_serve: the server did not start:\n{open(self.log_path).read()[-3000:]}")

    def stop(self):
        self.p.terminate()
        self.p.wait(timeout=120)
        self.logf.close()
        return open(self.log_path).read()


def put_api(port, prompt, n):
    body = json.dumps({"prompts": [prompt], "tokens_to_generate": n, "top_k": 1, "logprobs": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api", data=body, method="PUT",
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=3600) as r:
        out = json.loads(r.read().decode())
    return time.perf_counter() - t0, out


def drive(port, prompts, n_new, clients):
    """C clients; each sends its next request when its answer arrives. Returns (wall, latencies, answers)."""
    q = queue.Queue()
    for i, p in enumerate(prompts):
        q.put((i, p))
    lat, answers, errors = [None] * len(prompts), [None] * len(prompts), []

    def client():
        while True:
            try:
                i, p = q.get_nowait()
            except queue.Empty:
                return
            try:
                lat[i], answers[i] = put_api(port, p, n_new)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(f"request {i}: {e}")

    t0 = time.perf_counter()
    ts = [threading.Thread(target=client) for _ in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        sys.exit("bench_serve: " + "; ".join(errors[:5]))
    return wall, lat, answers


def stream_completion(port, prompt_ids, n):
    """Streamed POST /v1/completions; returns (time to first chunk, latency, [(token, logprob)])."""
    # [[ids]]: one token-id prompt (a flat list longer than 128 ids is refused as "at most 128 prompts")
    body = json.dumps({"prompt": [prompt_ids], "max_tokens": n, "temperature": 0, "stream": True,
                       "logprobs": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, toks = None, []
    with urllib.request.urlopen(req, timeout=3600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ch = json.loads(line[6:])["choices"][0]
            if ch.get("logprobs"):
                if ttft is None:
                    ttft = time.perf_counter() - t0
                toks.append((ch["logprobs"]["tokens"][0], ch["logprobs"]["token_logprobs"][0]))
    return ttft, time.perf_counter() - t0, toks


def shared_prefix_bench(args, ck, work):
    """The prefix caching workload: a common system prompt, distinct short suffixes, C clients."""
    n_pre, n_suf = args.shared_prefix, args.suffix_tokens
    system = [(i * 7919 + 13) % 50000 for i in range(n_pre)]
    server_bin = os.path.join(args.build, "apps", "text_generation_server")
    rows, outs = [], {}
    for c in args.clients:
        prompts = [system + [(r * 131 + j * 17 + 101) % 50000 for j in range(n_suf)]
                   for r in range(max(16, c * args.requests))]
        for name, extra in (("dynamic", []), ("dynamic-prefix", ["--inference-dynamic-batching-prefix-caching",
                                                                 "--inference-dynamic-batching-prefix-caching-eviction-policy",
                                                                 args.prefix_policy])):
            flags = ["--inference-dynamic-batching", "--inference-dynamic-batching-max-requests", str(c),
                     "--inference-dynamic-batching-block-size", str(args.block_size)] + extra
            if args.kv_gb:
                flags += ["--inference-dynamic-batching-buffer-size-gb", str(args.kv_gb)]
            srv = Server(server_bin, ck, flags, args.threads, work, f"{name}_{c}", args.source)
            stream_completion(srv.port, [1, 2, 3], 2)  # warm up (shares nothing with the workload)
            q = queue.Queue()
            for i, p in enumerate(prompts):
                q.put((i, p))
            res, errors = [None] * len(prompts), []

            def client():
                while True:
                    try:
                        i, p = q.get_nowait()
                    except queue.Empty:
                        return
                    try:
                        res[i] = stream_completion(srv.port, p, args.new_tokens)
                    except urllib.error.HTTPError as e:
                        errors.append(f"request {i}: {e}: {e.read().decode()[:300]}")
                    except Exception as e:  # noqa: BLE001 - reported below
                        errors.append(f"request {i}: {e}")

            t0 = time.perf_counter()
            ts = [threading.Thread(target=client) for _ in range(c)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            wall = time.perf_counter() - t0
            text = srv.stop()
            if errors:
                sys.exit("bench_serve: " + "; ".join(errors[:5]))
            ntok = sum(len(r[2]) for r in res)
            ttft, lat = [r[0] for r in res], [r[1] for r in res]
            outs[(name, c)] = [r[2] for r in res]
            row = {"impl": f"server-{name}", "clients": c, "requests": len(prompts), "tokens": ntok,
                   "seconds": wall, "tokens_per_s": ntok / wall, "ttft_p50_s": pct(ttft, 50),
                   "ttft_p99_s": pct(ttft, 99), "p50_s": pct(lat, 50), "p99_s": pct(lat, 99)}
            m = re.findall(r"prefix cache \((\w+)\): (\d+) of (\d+) prompt blocks hit", text)
            if m:
                row.update(prefix_hits=int(m[-1][1]), prefix_queries=int(m[-1][2]))
            m = re.findall(r"\((\d+) prompt, (\d+) decode\)", text)
            if m:
                row.update(prompt_rows=int(m[-1][0]), decode_rows=int(m[-1][1]))
            rows.append(row)
            log(f"  {name} {c} clients: {row['tokens_per_s']:.1f} tokens/s, TTFT p50 {row['ttft_p50_s']:.2f} s "
                f"p99 {row['ttft_p99_s']:.2f} s")
    print(f"{'impl':22s} {'clients':>7s} {'requests':>8s} {'tokens/s':>9s} {'TTFT p50':>9s} {'TTFT p99':>9s}"
          f" {'p50 s':>7s} {'p99 s':>7s} {'prompt rows':>11s} {'hits/queries':>13s}")
    for r in rows:
        hq = f"{r['prefix_hits']}/{r['prefix_queries']}" if "prefix_hits" in r else ""
        print(f"{r['impl']:22s} {r['clients']:7d} {r['requests']:8d} {r['tokens_per_s']:9.1f} {r['ttft_p50_s']:9.2f} "
              f"{r['ttft_p99_s']:9.2f} {r['p50_s']:7.2f} {r['p99_s']:7.2f} {r.get('prompt_rows', ''):>11} {hq:>13s}")
    notes = []
    by = {(r["impl"], r["clients"]): r for r in rows}
    for c in args.clients:
        a, b = by[("server-dynamic", c)], by[("server-dynamic-prefix", c)]
        same = sum(x == y for x, y in zip(outs[("dynamic", c)], outs[("dynamic-prefix", c)]))
        notes.append(f"{c} clients: prefix caching / without {b['tokens_per_s'] / a['tokens_per_s']:.2f}x tokens/s, "
                     f"TTFT p50 {a['ttft_p50_s'] / b['ttft_p50_s']:.2f}x lower; streamed tokens and log-probabilities "
                     f"equal for {same} of {len(outs[('dynamic', c)])} requests")
    for n in notes:
        print(n)
    return rows, notes


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100.0 * (len(xs) - 1))))]


def hf_generate(args, ck, work, prompts, n_new):
    try:
        import torch
        from transformers import GPT2LMHeadModel, GPT2TokenizerFast
    except ImportError as e:
        return None, f"transformers not available ({e})"
    hf = os.path.join(work, "hf")
    os.makedirs(hf, exist_ok=True)
    run([os.path.join(args.build, "apps", "convert_checkpoint"), "--direction", "mpitron-to-hf", "--input", ck,
         "--output", os.path.join(hf, "model.safetensors"), "--hf-config-out", os.path.join(hf, "config.json")])
    torch.set_num_threads(args.threads)
    gpt2 = os.path.join(args.source, "assets", "gpt2")
    tok = GPT2TokenizerFast(os.path.join(gpt2, "gpt2-vocab.json"), os.path.join(gpt2, "gpt2-merges.txt"))
    tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model = GPT2LMHeadModel.from_pretrained(hf, torch_dtype=torch.float32).to(args.hf_device).eval()
    rows, texts = [], {}
    for b in args.clients:
        lat, ntok = [], 0
        t0 = time.perf_counter()
        for s in range(0, len(prompts[b]), b):
            batch = prompts[b][s:s + b]
            enc = tok(batch, return_tensors="pt", padding=True).to(args.hf_device)
            t1 = time.perf_counter()
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                                     pad_token_id=tok.eos_token_id)
            dt = time.perf_counter() - t1
            new = out[:, enc["input_ids"].shape[1]:]
            ntok += int(new.numel())
            lat += [dt] * len(batch)
            if b == 1:  # Megatron's /api answers the prompt and its continuation
                texts[batch[0]] = batch[0] + tok.decode(new[0].tolist())
        wall = time.perf_counter() - t0
        rows.append({"impl": "transformers", "clients": b, "requests": len(prompts[b]), "tokens": ntok,
                     "seconds": wall, "tokens_per_s": ntok / wall, "p50_s": pct(lat, 50), "p99_s": pct(lat, 99)})
        log(f"  transformers batch {b}: {ntok / wall:.1f} tokens/s")
    return rows, texts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="build tree with apps/ (default build)")
    ap.add_argument("--source", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--load", help="an existing checkpoint instead of the generated model")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--positions", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=32, help="tokens generated per request (default 32)")
    ap.add_argument("--clients", default="1,8,32", help="concurrent clients (default 1,8,32)")
    ap.add_argument("--requests", type=int, default=2, help="requests per client (at least 16 in all; default 2)")
    ap.add_argument("--threads", type=int, default=2, help="OMP / torch threads (default 2)")
    ap.add_argument("--servers", default="dynamic,static", help="which of dynamic,static to run")
    ap.add_argument("--baseline-server", help="an older text_generation_server binary to measure too")
    ap.add_argument("--kv-gb", type=float, default=0, help="--inference-dynamic-batching-buffer-size-gb (0: default)")
    ap.add_argument("--block-size", type=int, default=16, help="--inference-dynamic-batching-block-size (default 16)")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers")
    ap.add_argument("--hf-device", default="cpu", help="transformers' device (default cpu)")
    ap.add_argument("--make-device", default="cpu", help="pretrain_gpt --device for the generated model (default cpu)")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--shared-prefix", type=int, default=0,
                    help="the prefix caching workload: a common prompt of this many tokens (0: the usual workload)")
    ap.add_argument("--suffix-tokens", type=int, default=12, help="--shared-prefix: each request's own tokens (12)")
    ap.add_argument("--prefix-policy", default="lru", help="--shared-prefix: the eviction policy (default lru)")
    args = ap.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    work = tempfile.mkdtemp(prefix="bench_serve_")
    try:
        ck = args.load or make_model(args, work)
        if args.shared_prefix > 0:
            rows, notes = shared_prefix_bench(args, ck, work)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"rows": rows, "notes": notes, "shared_prefix": args.shared_prefix,
                               "suffix_tokens": args.suffix_tokens, "new_tokens": args.new_tokens,
                               "threads": args.threads}, f, indent=1)
            return
        corpus = os.path.join(args.source, "assets", "text", "tinyshakespeare.txt")
        prompts = {c: prompts_from(corpus, max(16, c * args.requests)) for c in args.clients}
        n_new = args.new_tokens
        server_bin = os.path.join(args.build, "apps", "text_generation_server")
        kinds = [("dynamic", server_bin, ["--inference-dynamic-batching", "--inference-dynamic-batching-max-requests",
                                          str(max(args.clients)), "--inference-dynamic-batching-block-size",
                                          str(args.block_size)] +
                  (["--inference-dynamic-batching-buffer-size-gb", str(args.kv_gb)] if args.kv_gb else []))]
        kinds += [("static", server_bin, [])]
        kinds = [k for k in kinds if k[0] in args.servers.split(",")]
        if args.baseline_server:
            kinds.append(("baseline", args.baseline_server, []))
        rows, greedy = [], {}
        for name, binary, extra in kinds:
            for c in args.clients:
                srv = Server(binary, ck, extra, args.threads, work, f"{name}_{c}", args.source)
                put_api(srv.port, "warm up", 2)
                wall, lat, answers = drive(srv.port, prompts[c], n_new, c)
                text = srv.stop()
                ntok = sum(len(a["logprobs"][0]) for a in answers)  # one log-probability per generated token
                for p, a in zip(prompts[c], answers):
                    greedy.setdefault(name, {})[p] = a["text"][0]
                row = {"impl": f"server-{name}", "clients": c, "requests": len(prompts[c]), "tokens": ntok,
                       "seconds": wall, "tokens_per_s": ntok / wall, "p50_s": pct(lat, 50), "p99_s": pct(lat, 99)}
                m = re.findall(r"KV blocks: peak (\d+) of (\d+) \((\d+) of (\d+) bytes per rank\).*?pauses (\d+)", text)
                if m:
                    pk, tot, pkb, totb, pauses = (int(x) for x in m[-1])
                    row.update(kv_peak_blocks=pk, kv_blocks=tot, kv_peak_bytes=pkb, kv_pool_bytes=totb, pauses=pauses)
                rows.append(row)
                log(f"  {name} {c} clients: {row['tokens_per_s']:.1f} tokens/s, p50 {row['p50_s']:.2f} s, "
                    f"p99 {row['p99_s']:.2f} s")
        notes = []
        # Every server's greedy text must be the same for the same prompt.
        names = list(greedy)
        for n in names[1:]:
            same = sum(greedy[n].get(p) == t for p, t in greedy[names[0]].items() if p in greedy[n])
            notes.append(f"greedy text of server-{n} equals server-{names[0]} for {same} of "
                         f"{len(set(greedy[n]) & set(greedy[names[0]]))} prompts")
        if not args.no_hf:
            try:
                hf_rows, why = hf_generate(args, ck, work, prompts, n_new)
            except Exception as e:  # noqa: BLE001 - the servers' rows still print
                hf_rows, why = None, f"{type(e).__name__}: {str(e)[:200]}"
            if hf_rows is None:
                notes.append(f"transformers skipped: {why}")
            else:
                rows += hf_rows
                for n in names:  # greedy text against transformers' (batch 1, no padding)
                    same = sum(greedy[n].get(p) == t for p, t in why.items())
                    notes.append(f"greedy text of server-{n} equals transformers' for {same} of {len(why)} prompts")
        print(f"{'impl':18s} {'clients':>7s} {'requests':>8s} {'tokens':>7s} {'tokens/s':>9s} {'p50 s':>7s} {'p99 s':>7s}"
              f" {'KV peak/pool':>16s} {'pauses':>6s}")
        for r in rows:
            kv = f"{r['kv_peak_blocks']}/{r['kv_blocks']}" if "kv_blocks" in r else ""
            print(f"{r['impl']:18s} {r['clients']:7d} {r['requests']:8d} {r['tokens']:7d} {r['tokens_per_s']:9.1f} "
                  f"{r['p50_s']:7.2f} {r['p99_s']:7.2f} {kv:>16s} {r.get('pauses', ''):>6}")
        by = {(r["impl"], r["clients"]): r["tokens_per_s"] for r in rows}
        for base in ("server-static", "server-baseline", "transformers"):
            for c in args.clients:
                if ("server-dynamic", c) in by and (base, c) in by:
                    notes.append(f"dynamic / {base} at {c} clients: {by[('server-dynamic', c)] / by[(base, c)]:.2f}x")
        for n in notes:
            print(n)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"rows": rows, "notes": notes, "model": {"layers": args.layers, "hidden": args.hidden,
                           "heads": args.heads, "positions": args.positions, "load": args.load},
                           "new_tokens": n_new, "threads": args.threads}, f, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
