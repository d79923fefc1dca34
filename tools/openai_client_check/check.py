#!/usr/bin/env python3
# Run from the repository root (needs `pip install openai`; the build never runs this):
#   g++ -std=c++17 -I libcaf_serving tools/openai_client_check/dump_bodies.cpp \
#     libcaf_serving/ingress/generate_codec.cpp libcaf_serving/core/json.cpp -o /tmp/dump_bodies
#   mkdir -p /tmp/bodies && /tmp/dump_bodies /tmp/bodies && python3 tools/openai_client_check/check.py /tmp/bodies
"""Checks the generate codec's OpenAI bodies with the official openai package:
each is served to the real client over a mock transport, and validated strictly
against the package's pydantic types."""
import json, pathlib, sys
try:
    import httpx2 as httpx  # openai 3.x
except ImportError:
    import httpx
import openai
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk

d = pathlib.Path(sys.argv[1])
def body(n): return (d / n).read_bytes()

routes = {}
def handler(request):
    status, name, ctype = routes[request.url.path]
    return httpx.Response(status, content=body(name), headers={"content-type": ctype})
client = openai.OpenAI(api_key="x", base_url="http://test/v1", max_retries=0,
                       http_client=httpx.Client(transport=httpx.MockTransport(handler)))
J, S = "application/json", "text/event-stream"

# Strict validation of every object.
Completion.model_validate(json.loads(body("completion.json")), strict=False)
for n in ("chat.json", "chat_plain.json"):
    ChatCompletion.model_validate(json.loads(body(n)))
Model.model_validate(json.loads(body("model.json")))
for n in ("chat_stream.sse",):
    for line in body(n).decode().split("\n\n"):
        if line.startswith("data: ") and line != "data: [DONE]":
            ChatCompletionChunk.model_validate(json.loads(line[6:]))
# The package's Completion type (which streamed completions reuse) makes
# finish_reason non-null, though OpenAI's and vLLM's streams send null until
# the last chunk: only that one is validated strictly.
for line in body("completion_stream.sse").decode().split("\n\n"):
    if line.startswith("data: ") and line != "data: [DONE]":
        obj = json.loads(line[6:])
        if obj["choices"][0]["finish_reason"] is not None:
            Completion.model_validate(obj)

# The real client.
routes["/v1/completions"] = (200, "completion.json", J)
c = client.completions.create(model="m", prompt="x")
assert c.choices[0].text == "Hi \ufffd\ufffd" and c.usage.total_tokens == 5
assert c.choices[0].logprobs.token_logprobs[1] == -9999.0 and c.choices[0].logprobs.text_offset == [0, 2]
routes["/v1/chat/completions"] = (200, "chat.json", J)
r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason == "stop"
assert r.choices[0].logprobs.content[0].top_logprobs[1].token == "Hello"
routes["/v1/chat/completions"] = (200, "chat_stream.sse", S)
chunks = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                             stream=True, stream_options={"include_usage": True}))
assert len(chunks) == 4 and chunks[0].choices[0].delta.role == "assistant"
assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "Hi"
assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 4
routes["/v1/completions"] = (200, "completion_stream.sse", S)
parts = list(client.completions.create(model="m", prompt="x", stream=True))
assert "".join(p.choices[0].text for p in parts) == "Hi there" and parts[-1].choices[0].finish_reason == "length"
routes["/v1/models"] = (200, "models.json", J)
models = list(client.models.list())
assert models[0].id == "m" and models[0].owned_by == "caf-serving"
routes["/v1/models/m"] = (200, "model.json", J)
assert client.models.retrieve("m").created == 1686935002
routes["/v1/completions"] = (400, "error400.json", J)
try:
    client.completions.create(model="m", prompt="x", max_tokens=0); raise SystemExit("no error")
except openai.BadRequestError as e:
    assert e.code is None and e.type == "invalid_request_error" and "max_tokens" in e.message, e
routes["/v1/completions"] = (404, "error404.json", J)
try:
    client.completions.create(model="x", prompt="x"); raise SystemExit("no error")
except openai.NotFoundError as e:
    assert e.code == "model_not_found"
routes["/v1/chat/completions"] = (200, "chat_stream_error.sse", S)
try:
    for _ in client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True):
        pass
    raise SystemExit("no error")
except openai.APIError as e:
    assert "unloaded" in e.message
print("openai", openai.__version__, ": every body accepted")
