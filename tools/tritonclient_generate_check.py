#!/usr/bin/env python3
"""tritonclient.grpc, unchanged, streaming a generative (decoupled) model of a
running caf-serving, as vLLM's and Triton's decoupled examples do (issue 34).
A manual check: the build and CTest never run it.

    build/tritonclient-venv/bin/python tools/tritonclient_generate_check.py \
        GRPC_HOST:PORT HTTP_HOST:PORT [MODEL]

with a server on a repository holding tests/generative/fixtures/tiny_gpt2
(MODEL defaults to tiny_gpt2). Checks: greedy text streamed over gRPC equals
the HTTP /generate answer for the same prompt; several requests on one stream;
the final flag and the empty final response (enable_empty_final_response);
an error for a bad request with the stream still usable; unary infer refused;
stop_stream(cancel_requests=True) frees the sequences (/metrics). Prints one
line per check; exits 1 when any fails.
"""
import json
import queue
import sys
import time
import traceback
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

GRPC, HTTP = sys.argv[1], sys.argv[2]
MODEL = sys.argv[3] if len(sys.argv) > 3 else "tiny_gpt2"
PROMPTS = ["the server", "  reposit", "| Reduce", "a b c"]
results = []


def check(name):
    def wrap(f):
        try:
            f()
            results.append((name, True))
            print(f"{name:60} PASS", flush=True)
        except Exception:
            results.append((name, False))
            print(f"{name:60} FAIL", flush=True)
            traceback.print_exc()
        return f
    return wrap


def inputs_for(prompt, stream=True, max_tokens=12):
    """vLLM's example client (samples/client.py): text_input, stream,
    sampling_parameters as JSON, exclude_input_in_output."""
    def tensor(name, dtype, value):
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(np.array([value], dtype=object if dtype == "BYTES" else bool))
        return t
    sampling = {"temperature": "0", "max_tokens": str(max_tokens), "ignore_eos": "true"}
    return [tensor("text_input", "BYTES", prompt.encode()),
            tensor("stream", "BOOL", stream),
            tensor("sampling_parameters", "BYTES", json.dumps(sampling).encode()),
            tensor("exclude_input_in_output", "BOOL", True)]


def http_generate(prompt, max_tokens=12):
    body = json.dumps({"text_input": prompt, "exclude_input_in_output": True,
                       "parameters": {"max_tokens": max_tokens, "temperature": 0,
                                      "ignore_eos": True}}).encode()
    req = urllib.request.Request(f"http://{HTTP}/v2/models/{MODEL}/generate", data=body,
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req).read())["text_output"]


def metric(name):
    text = urllib.request.urlopen(f"http://{HTTP}/metrics").read().decode()
    key = f'{name}{{model="{MODEL}",version="1"}} '
    at = text.find(key)
    return float(text[at + len(key):].split()[0]) if at >= 0 else None


def wait_metric(name, value, seconds=20):
    until = time.time() + seconds
    while time.time() < until:
        if metric(name) == value:
            return True
        time.sleep(0.05)
    return False


def stream_and_collect(client, requests, enable_empty_final=False):
    """Sends (id, inputs) on one stream; returns {id: (text, responses, errors,
    last_result)} once each has its final response."""
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    for rid, inputs in requests:
        client.async_stream_infer(MODEL, inputs, request_id=rid,
                                  enable_empty_final_response=enable_empty_final)
    out = {rid: ["", 0, [], None] for rid, _ in requests}
    finals = 0
    while finals < len(requests):
        result, error = answers.get(timeout=60)
        if error is not None:
            # tritonclient hands an error response over without its id.
            out.setdefault("<error>", ["", 0, [], None])[2].append(str(error))
            finals += 1
            continue
        resp = result.get_response()
        entry = out[resp.id]
        entry[1] += 1
        text = result.as_numpy("text_output")
        if text is not None:
            entry[0] += b"".join(text).decode()
        entry[3] = result
        if resp.parameters["triton_final_response"].bool_param:
            finals += 1
    client.stop_stream()
    return out


client = grpcclient.InferenceServerClient(GRPC)


@check("streamed greedy text equals the HTTP /generate answer")
def _():
    got = stream_and_collect(client, [("one", inputs_for(PROMPTS[0]))])
    assert got["one"][0] == http_generate(PROMPTS[0]), (got["one"][0], http_generate(PROMPTS[0]))
    assert got["one"][1] >= 2, got["one"][1]


@check("four requests on one stream, each its own text")
def _():
    got = stream_and_collect(client, [(f"r{i}", inputs_for(p)) for i, p in enumerate(PROMPTS)])
    for i, p in enumerate(PROMPTS):
        assert got[f"r{i}"][0] == http_generate(p), (p, got[f"r{i}"][0])


@check("enable_empty_final_response: an empty final response")
def _():
    got = stream_and_collect(client, [("e", inputs_for(PROMPTS[1]))], enable_empty_final=True)
    text, _, _, last = got["e"]
    assert text == http_generate(PROMPTS[1])
    assert last.as_numpy("text_output") is None
    assert last.get_response().parameters["triton_final_response"].bool_param


@check("stream false: one response with the whole text")
def _():
    got = stream_and_collect(client, [("w", inputs_for(PROMPTS[2], stream=False))])
    assert got["w"][1] == 1 and got["w"][0] == http_generate(PROMPTS[2])


@check("a bad request is an error; the stream goes on")
def _():
    bad = inputs_for(PROMPTS[0], max_tokens=0)
    got = stream_and_collect(client, [("bad", bad), ("good", inputs_for(PROMPTS[3]))])
    assert any("max_tokens" in e for e in got["<error>"][2]), got["<error>"]
    assert got["good"][0] == http_generate(PROMPTS[3])


@check("unary infer is refused as Triton refuses it")
def _():
    try:
        client.infer(MODEL, inputs_for(PROMPTS[0], stream=False))
    except InferenceServerException as e:
        assert "doesn't support models with decoupled" in e.message(), e.message()
        assert e.status() == "StatusCode.UNIMPLEMENTED", e.status()
        return
    raise AssertionError("unary infer answered")


@check("stop_stream(cancel_requests=True) frees the sequences")
def _():
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    for rid in ("long-1", "long-2"):
        client.async_stream_infer(MODEL, inputs_for("the", max_tokens=250), request_id=rid)
    answers.get(timeout=60)
    before = metric("caf_serving_generation_cancelled_total") or 0
    client.stop_stream(cancel_requests=True)
    assert wait_metric("caf_serving_generation_cancelled_total", before + 2)
    assert wait_metric("caf_serving_generation_kv_cache_blocks_used", 0)


failed = [n for n, ok in results if not ok]
print(f"{len(results) - len(failed)} of {len(results)} passed")
sys.exit(1 if failed else 0)
