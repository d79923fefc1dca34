"""The OpenAI-compatible front of bench/generate's Python servers (genai_server.py,
transformers_server.py; issue 35): POST /v1/completions, streamed (server-sent events, one
chunk per token, `usage` in a last chunk) or not, prompts as text or token-id arrays,
`max_tokens`, `ignore_eos`; GET /v1/models and /health. A batcher runs the requests: it
has `jobs` (a queue.Queue of Job), `context` (the longest prompt plus output it takes) and
`encode(text)` (token ids).

A batcher answers each Job through `Job.put`: ("token", text) per token, then
("done", tokens, finish_reason), or ("error", message).
"""
import asyncio
import json
import time

from aiohttp import web


class Job:
    def __init__(self, ids, max_tokens, ignore_eos, loop, transport):
        self.ids = ids
        self.max_tokens = max_tokens
        self.ignore_eos = ignore_eos
        self.loop = loop
        self.transport = transport
        self.out = asyncio.Queue()
        self.cancelled = False

    def put(self, item):
        self.loop.call_soon_threadsafe(self.out.put_nowait, item)

    def gone(self):
        """Cancelled, or its client's connection closing: the batcher thread asks before a
        batch and at every step. It reads the transport's state itself because the event
        loop's own look (next_item) waits for the GIL, which a long prefill call can hold
        for seconds (onnxruntime-genai's append_tokens at a batch of 32 long prompts)."""
        t = self.transport
        return self.cancelled or t is None or t.is_closing()


async def next_item(job, request):
    """The job's next item; a client that has gone (its connection closing) cancels the job,
    so that a request the load generator gave up on leaves the queue (or the running batch)
    instead of being computed for nobody. aiohttp does not cancel a handler when its client
    goes, so the connection is looked at every half second while waiting."""
    while True:
        try:
            return await asyncio.wait_for(job.out.get(), 0.5)
        except asyncio.TimeoutError:
            transport = request.transport
            if transport is None or transport.is_closing():
                job.cancelled = True
                raise ConnectionResetError("the client closed the connection")


def chunk(cid, created, model, text, finish=None):
    return {"id": cid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None,
                         "finish_reason": finish}]}


def make_app(batcher, name):
    counter = [0]

    async def completions(request):
        body = await request.json()
        prompt = body.get("prompt", "")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = [int(t) for t in batcher.encode(prompt)]
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            return web.json_response({"error": {"message": "empty prompt"}}, status=400)
        max_tokens = int(body.get("max_tokens", 16))
        if len(ids) + max_tokens > batcher.context:
            return web.json_response({"error": {"message": "prompt plus max_tokens over the "
                                                f"context of {batcher.context}"}}, status=400)
        job = Job(ids, max_tokens, bool(body.get("ignore_eos", False)),
                  asyncio.get_running_loop(), request.transport)
        batcher.jobs.put(job)
        counter[0] += 1
        cid, created = f"cmpl-{counter[0]}", int(time.time())
        usage = lambda n: {"prompt_tokens": len(ids), "completion_tokens": n,
                           "total_tokens": len(ids) + n}
        if not body.get("stream", False):
            text = []
            while True:
                item = await next_item(job, request)
                if item[0] == "token":
                    text.append(item[1])
                elif item[0] == "error":
                    return web.json_response({"error": {"message": item[1]}}, status=500)
                else:
                    out = chunk(cid, created, name, "".join(text), item[2])
                    out["usage"] = usage(item[1])
                    return web.json_response(out)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        try:
            while True:
                item = await next_item(job, request)
                if item[0] == "token":
                    await resp.write(b"data: " + json.dumps(chunk(cid, created, name, item[1]))
                                     .encode() + b"\n\n")
                elif item[0] == "error":
                    await resp.write(b"data: " + json.dumps({"error": {"message": item[1]}})
                                     .encode() + b"\n\n")
                    break
                else:
                    await resp.write(b"data: " + json.dumps(chunk(cid, created, name, "",
                                                                  item[2])).encode() + b"\n\n")
                    last = {"id": cid, "object": "text_completion", "created": created,
                            "model": name, "choices": [], "usage": usage(item[1])}
                    await resp.write(b"data: " + json.dumps(last).encode() + b"\n\n")
                    break
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:  # the client went: the batcher drops the job
            job.cancelled = True
            return resp
        except asyncio.CancelledError:
            job.cancelled = True
            raise
        return resp

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": name, "object": "model"}]})

    async def health(request):
        return web.json_response({"status": "ok"})

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app
