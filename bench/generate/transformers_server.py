#!/usr/bin/env python3
"""transformers' `generate` behind an OpenAI-compatible streaming server: the floor arm
(`transformers`) of bench/generate/run (issue 35). The HTTP side is openai_server.py's
(POST /v1/completions streamed or not, token-id or text prompts, `max_tokens`,
`ignore_eos`, greedy).

Batching: static batches, as `generate` takes them. The requests waiting when the model is
free (up to --max-batch) become one batch, their prompts left-padded with the pad token
(the attention mask keeps the padding out, and `generate` derives the positions from it),
decoded together by one `model.generate(...)` call until the longest request is done; a
streamer hands every step's tokens to their requests, and each request's stream ends at its
own max_tokens (or at EOS without ignore_eos). Requests that arrive meanwhile wait for the
next batch. Greedy, fp32, the KV cache transformers makes by default (DynamicCache),
torch.set_num_threads(--threads), OMP_WAIT_POLICY=PASSIVE unless set (see below).

    transformers_server.py HF_MODEL_DIR --port P [--max-batch 64] [--threads 2] [--name NAME]
"""
import argparse
import logging
import os
import queue
import threading
import time

# libgomp's threads spin between parallel regions by default; on this shared 2-vCPU machine,
# with other processes runnable, a 2-thread decoding step of the quick GPT-2 took 288 ms
# spinning and 20 ms passive (batch 1, 64 tokens). Set before torch loads libgomp.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import transformers  # noqa: E402
from aiohttp import web  # noqa: E402

from openai_server import make_app  # noqa: E402


class BatchStreamer(transformers.generation.streamers.BaseStreamer):
    """Receives each decoding step's tokens ([batch]) from `generate` and streams them to the
    batch's requests; the first `put` is the prompt, which is not streamed."""

    def __init__(self, batch, tokenizer, eos):
        self.batch, self.tokenizer, self.eos = batch, tokenizer, eos
        self.produced = [0] * len(batch)
        self.live = set(range(len(batch)))
        self.prompt_seen = False

    def put(self, value):
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        tokens = value.reshape(-1).tolist()
        for r in list(self.live):
            j = self.batch[r]
            t = int(tokens[r])
            self.produced[r] += 1
            finished = self.produced[r] >= j.max_tokens or (not j.ignore_eos and t in self.eos)
            j.put(("token", self.tokenizer.decode([t])))
            if finished or j.gone():
                j.put(("done", self.produced[r],
                       "length" if self.produced[r] >= j.max_tokens else "stop"))
                self.live.discard(r)
        # Let the event loop thread write the chunks now, not at Python's switch interval.
        time.sleep(0)

    def end(self):
        for r in self.live:
            self.batch[r].put(("done", self.produced[r], "length"))
        self.live.clear()


class StopWhenNoneLive(transformers.StoppingCriteria):
    """Ends `generate` once every request of the batch has ended (or been cancelled)."""

    def __init__(self, streamer):
        self.streamer = streamer

    def __call__(self, input_ids, scores, **kwargs):
        done = not self.streamer.live
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool)


class Batcher(threading.Thread):
    """Runs static batches on one thread: torch does the parallel work inside."""

    def __init__(self, model_dir, max_batch):
        super().__init__(daemon=True)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32).eval()
        cfg = self.model.generation_config
        eos = cfg.eos_token_id if cfg.eos_token_id is not None else 0
        self.eos = set(eos if isinstance(eos, list) else [eos])
        pad = cfg.pad_token_id if cfg.pad_token_id is not None else min(self.eos)
        self.pad = int(pad[0] if isinstance(pad, list) else pad)
        self.context = int(getattr(self.model.config, "max_position_embeddings", 0)
                           or getattr(self.model.config, "n_positions", 1024))
        self.max_batch = max_batch
        self.jobs = queue.Queue()

    def encode(self, text):
        return self.tokenizer.encode(text, add_special_tokens=False)

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
        longest = max(len(j.ids) for j in batch)
        steps = max(j.max_tokens for j in batch)
        ids = torch.full((len(batch), longest), self.pad, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for r, j in enumerate(batch):
            ids[r, longest - len(j.ids):] = torch.tensor(j.ids)
            mask[r, longest - len(j.ids):] = 1
        streamer = BatchStreamer(batch, self.tokenizer, self.eos)
        # ignore_eos everywhere: EOS is masked until the longest request is done; else a
        # sequence that meets EOS is padded on while the others go on.
        min_new = steps if all(j.ignore_eos for j in batch) else 0
        with torch.inference_mode():
            self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps,
                                min_new_tokens=min_new, do_sample=False,
                                pad_token_id=self.pad, streamer=streamer,
                                stopping_criteria=[StopWhenNoneLive(streamer)])
        streamer.end()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", help="a save_pretrained folder with its tokenizer")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--name", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    name = a.name or a.model_dir.rstrip("/").split("/")[-1]
    logging.basicConfig(level=logging.WARNING)
    batcher = Batcher(a.model_dir, a.max_batch)
    batcher.start()
    print(f"transformers_server: {name} from {a.model_dir} on port {a.port}, static batches "
          f"of up to {a.max_batch}, transformers {transformers.__version__}, torch "
          f"{torch.__version__}, {a.threads} threads", flush=True)
    web.run_app(make_app(batcher, name), host="127.0.0.1", port=a.port, print=None,
                access_log=None)


if __name__ == "__main__":
    main()
