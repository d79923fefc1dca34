#!/usr/bin/env python3
"""A small OpenAI-compatible server over onnxruntime-genai, the third arm of
bench/generate/run (issue 35): POST /v1/completions, streamed (server-sent events, one
chunk per token, `usage` in a last chunk) or not, prompts as text or token-id arrays,
`max_tokens`, `ignore_eos` (and `min_tokens`), greedy decoding. GET /v1/models and
/health answer too.

Batching: onnxruntime-genai 0.18's continuous-batching Engine needs a paged KV cache
(`engine.dynamic_batching`), which its CPU model files do not have ("Paged cache input
must have rank four and a static physical head width"; with the axis made static it fails
every request with ENGINE_EXECUTION_FAILURE), and its static scheduler ran 4 sequences a
step whatever `engine.static_batching.max_batch_size` said. So this server forms static
batches itself with the Generator API, the documented way to batch: the requests waiting
when the generator is free (up to --max-batch, 32: the Generator refuses a larger
batch_size with "batch_size (63) must be in [1, 32]") become one batch, their prompts left-padded
with the pad token, decoded together until the longest is done; each request's stream ends
at its own max_tokens. Requests that arrive meanwhile wait for the next batch.

    genai_server.py MODEL_DIR --port P [--max-batch 32] [--name NAME]
"""
import argparse
import json
import logging
import queue
import threading
import time

import numpy as np
import onnxruntime_genai as og
from aiohttp import web

from openai_server import make_app


class Batcher(threading.Thread):
    """Runs static batches on one thread: onnxruntime does the parallel work inside."""

    def __init__(self, model_dir, max_batch):
        super().__init__(daemon=True)
        self.model = og.Model(model_dir)
        self.tokenizer = og.Tokenizer(self.model)
        cfg = json.load(open(f"{model_dir}/genai_config.json"))["model"]
        self.pad = int(cfg.get("pad_token_id", 0))
        eos = cfg.get("eos_token_id", 0)
        self.eos = set(eos if isinstance(eos, list) else [eos])
        self.context = int(cfg["context_length"])
        self.max_batch = max_batch
        self.jobs = queue.Queue()

    def encode(self, text):
        return self.tokenizer.encode(text)

    def run(self):
        while True:
            batch = [self.jobs.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self.jobs.get_nowait())
                except queue.Empty:
                    break
            batch = [j for j in batch if not j.gone()]
            if batch:
                try:
                    self.run_batch(batch)
                except Exception as e:  # the requests fail; the server goes on
                    logging.exception("batch of %d failed", len(batch))
                    for j in batch:
                        j.put(("error", str(e)))

    def run_batch(self, batch):
        longest_prompt = max(len(j.ids) for j in batch)
        steps = max(j.max_tokens for j in batch)
        params = og.GeneratorParams(self.model)
        length = min(self.context, longest_prompt + steps)
        # ignore_eos: the minimum length keeps EOS from ending a sequence (genai masks it).
        options = dict(max_length=length, do_sample=False, batch_size=len(batch))
        if all(j.ignore_eos for j in batch):
            options["min_length"] = length
        params.set_search_options(**options)
        gen = og.Generator(self.model, params)
        ids = np.full((len(batch), longest_prompt), self.pad, dtype=np.int32)
        for r, j in enumerate(batch):
            ids[r, longest_prompt - len(j.ids):] = j.ids
        gen.append_tokens(ids)
        streams = [self.tokenizer.create_stream() for _ in batch]
        produced = [0] * len(batch)
        live = set(range(len(batch)))
        while live and not gen.is_done():
            gen.generate_next_token()
            tokens = gen.get_next_tokens()
            # The binding keeps the GIL through a step: without a yield here the event loop
            # that writes the chunks runs only at Python's switch interval, and tokens leave
            # in bursts (seen: TPOT 0.0 and TTFT 171 ms at concurrency 1).
            time.sleep(0)
            for r in list(live):
                j = batch[r]
                t = int(tokens[r])
                produced[r] += 1
                finished = produced[r] >= j.max_tokens or (not j.ignore_eos and t in self.eos)
                j.put(("token", streams[r].decode(t)))
                if finished or j.gone():
                    j.put(("done", produced[r], "length" if produced[r] >= j.max_tokens
                           else "stop"))
                    live.discard(r)
        for r in live:
            batch[r].put(("done", produced[r], "length"))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--port", type=int, required=True)
    # onnxruntime-genai 0.18 refuses more: "batch_size (63) must be in [1, 32]".
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--name", default=None)
    a = ap.parse_args()
    name = a.name or a.model_dir.rstrip("/").split("/")[-1]
    logging.basicConfig(level=logging.WARNING)
    batcher = Batcher(a.model_dir, a.max_batch)
    batcher.start()
    print(f"genai_server: {name} from {a.model_dir} on port {a.port}, static batches of up "
          f"to {a.max_batch}", flush=True)
    web.run_app(make_app(batcher, name), host="127.0.0.1", port=a.port, print=None,
                access_log=None)


if __name__ == "__main__":
    main()
