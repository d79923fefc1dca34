#!/usr/bin/env python3
"""The official `openai` package against a running caf-serving (issue 34).

Run by scripts/generative-client-check, which makes the venv and starts the
server; by hand:

    python tools/generative_client_check.py --url http://127.0.0.1:8000/v1 \
        --model tiny_gpt2 [--tokenizer path/to/tokenizer.json]

Every call goes through the real client (its HTTP, SSE parsing, error
mapping and pydantic types); each check says what it compared. With
--tokenizer (and the `tokenizers` package) the prompt's token count is checked
against Hugging Face's tokenizer, an independent reference. Prints a table and
exits 1 when any check fails.
"""
import argparse
import sys
import traceback

import openai

PROMPT = "The scheduler admits a request when"
CHAT = [{"role": "user", "content": "What does the scheduler do?"}]
MAX_TOKENS = 16


class Checks:
    """Runs named checks, keeps (name, ok, detail) rows and prints them."""

    def __init__(self):
        self.rows = []

    def run(self, name, fn):
        try:
            detail = fn() or ""
            self.rows.append((name, True, detail))
        except AssertionError as e:
            self.rows.append((name, False, str(e) or "assertion failed"))
        except Exception as e:  # a client or server error is a failed check
            last = traceback.extract_tb(e.__traceback__)[-1]
            self.rows.append((name, False, f"{type(e).__name__}: {e} (line {last.lineno})"))

    def print_table(self):
        width = max(len(n) for n, _, _ in self.rows)
        for name, ok, detail in self.rows:
            print(f"{name:<{width}}  {'PASS' if ok else 'FAIL'}  {detail}"[:220])
        failed = sum(1 for _, ok, _ in self.rows if not ok)
        print(f"openai {openai.__version__} against caf-serving: "
              f"{len(self.rows) - failed} of {len(self.rows)} checks passed")
        return failed


def expect(cond, message):
    if not cond:
        raise AssertionError(message)


def check_usage(usage, max_tokens, finish_reason, prompt_tokens=None):
    """The counts add up, and a 'length' finish used every token allowed."""
    expect(usage is not None, "no usage in the answer")
    expect(usage.prompt_tokens > 0, f"prompt_tokens {usage.prompt_tokens}")
    expect(0 < usage.completion_tokens <= max_tokens,
           f"completion_tokens {usage.completion_tokens} not in 1..{max_tokens}")
    expect(usage.total_tokens == usage.prompt_tokens + usage.completion_tokens,
           f"total_tokens {usage.total_tokens} != {usage.prompt_tokens} + {usage.completion_tokens}")
    expect(finish_reason in ("stop", "length"), f"finish_reason {finish_reason!r}")
    if finish_reason == "length":
        expect(usage.completion_tokens == max_tokens,
               f"finish_reason 'length' after {usage.completion_tokens} of {max_tokens} tokens")
    if prompt_tokens is not None:
        expect(usage.prompt_tokens == prompt_tokens,
               f"prompt_tokens {usage.prompt_tokens}, but the tokenizers package counts {prompt_tokens}")


def same_usage(a, b):
    expect((a.prompt_tokens, a.completion_tokens, a.total_tokens)
           == (b.prompt_tokens, b.completion_tokens, b.total_tokens),
           f"usage differs: {a} vs {b}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="the server's OpenAI base URL, ending /v1")
    ap.add_argument("--model", required=True, help="a generative model the server serves")
    ap.add_argument("--tokenizer", help="the model's tokenizer.json, to count prompt tokens independently")
    args = ap.parse_args()

    client = openai.OpenAI(base_url=args.url, api_key="none", max_retries=0, timeout=120)
    model = args.model
    reference_prompt_tokens = None
    if args.tokenizer:
        try:
            from tokenizers import Tokenizer
            reference_prompt_tokens = len(Tokenizer.from_file(args.tokenizer)
                                          .encode(PROMPT, add_special_tokens=False).ids)
        except ImportError:
            print("(the tokenizers package is missing: prompt token counts are not checked)")
    checks = Checks()
    seen = {}

    # -- models ------------------------------------------------------------------
    def models_list():
        ids = [m.id for m in client.models.list()]
        expect(model in ids, f"{model!r} not in models.list(): {ids}")
        return f"{ids}"

    def models_retrieve():
        m = client.models.retrieve(model)
        expect(m.id == model and m.object == "model", f"got {m}")
        expect(isinstance(m.created, int) and m.owned_by, f"created/owned_by missing: {m}")
        return f"owned_by={m.owned_by!r}"

    def models_retrieve_404():
        try:
            client.models.retrieve("no-such-model")
        except openai.NotFoundError as e:
            expect(e.status_code == 404, f"status {e.status_code}")
            return f"NotFoundError: {e.message}"
        raise AssertionError("retrieving 'no-such-model' succeeded")

    checks.run("models.list", models_list)
    checks.run("models.retrieve", models_retrieve)
    checks.run("models.retrieve unknown -> 404", models_retrieve_404)

    # -- completions ---------------------------------------------------------------
    def completion():
        c = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
        expect(c.object == "text_completion" and c.model == model and c.id, f"header fields: {c}")
        expect(len(c.choices) == 1 and c.choices[0].index == 0, f"choices: {c.choices}")
        ch = c.choices[0]
        expect(ch.text, "empty text")
        check_usage(c.usage, MAX_TOKENS, ch.finish_reason, reference_prompt_tokens)
        seen["completion"] = c
        return f"{ch.finish_reason}, usage {c.usage.prompt_tokens}+{c.usage.completion_tokens}, {ch.text[:24]!r}"

    def completion_again():
        c = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
        expect(c.choices[0].text == seen["completion"].choices[0].text,
               "a second greedy completion differs from the first")
        return "greedy is reproducible"

    def completion_stream():
        chunks = list(client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
        expect(len(chunks) >= 2, f"{len(chunks)} chunks")
        usage_chunk = chunks[-1]
        expect(usage_chunk.usage is not None and not usage_chunk.choices,
               f"the last chunk is not a usage chunk: {usage_chunk}")
        for ch in chunks[:-1]:
            expect(ch.usage is None, f"usage before the last chunk: {ch}")
        text = "".join(ch.choices[0].text for ch in chunks[:-1] if ch.choices)
        finishes = [ch.choices[0].finish_reason for ch in chunks[:-1] if ch.choices and ch.choices[0].finish_reason]
        ref = seen["completion"]
        expect(text == ref.choices[0].text, f"streamed {text!r} != not streamed {ref.choices[0].text!r}")
        expect(finishes == [ref.choices[0].finish_reason], f"finish reasons {finishes}")
        same_usage(usage_chunk.usage, ref.usage)
        return f"{len(chunks)} chunks, text and usage equal to the unstreamed answer"

    def completion_stream_no_usage():
        chunks = list(client.completions.create(model=model, prompt=PROMPT, max_tokens=4,
                                                temperature=0, stream=True))
        expect(all(ch.usage is None for ch in chunks), "usage sent without include_usage")
        expect(all(ch.choices for ch in chunks), "a chunk without choices")
        return f"{len(chunks)} chunks, none with usage"

    checks.run("completions greedy", completion)
    checks.run("completions greedy again", completion_again)
    checks.run("completions stream + include_usage", completion_stream)
    checks.run("completions stream, no usage", completion_stream_no_usage)

    # -- chat completions ------------------------------------------------------------
    def chat():
        r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0)
        expect(r.object == "chat.completion" and r.model == model and r.id, f"header fields: {r}")
        ch = r.choices[0]
        expect(ch.message.role == "assistant", f"role {ch.message.role!r}")
        expect(ch.message.content, "empty content")
        check_usage(r.usage, MAX_TOKENS, ch.finish_reason)
        seen["chat"] = r
        return f"{ch.finish_reason}, usage {r.usage.prompt_tokens}+{r.usage.completion_tokens}, {ch.message.content[:24]!r}"

    def chat_stream():
        chunks = list(client.chat.completions.create(model=model, messages=CHAT, max_tokens=MAX_TOKENS,
                                                     temperature=0, stream=True,
                                                     stream_options={"include_usage": True}))
        expect(chunks and chunks[0].choices and chunks[0].choices[0].delta.role == "assistant",
               f"the first chunk does not carry role 'assistant': {chunks[:1]}")
        expect(all(ch.object == "chat.completion.chunk" for ch in chunks), "object is not chat.completion.chunk")
        expect(len({ch.id for ch in chunks}) == 1, "chunks of one answer carry different ids")
        usage_chunk = chunks[-1]
        expect(usage_chunk.usage is not None and not usage_chunk.choices,
               f"the last chunk is not a usage chunk: {usage_chunk}")
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        ref = seen["chat"]
        expect(text == ref.choices[0].message.content,
               f"streamed {text!r} != not streamed {ref.choices[0].message.content!r}")
        expect(finishes == [ref.choices[0].finish_reason], f"finish reasons {finishes}")
        same_usage(usage_chunk.usage, ref.usage)
        return f"{len(chunks)} chunks, text and usage equal to the unstreamed answer"

    def chat_stream_no_usage():
        chunks = list(client.chat.completions.create(model=model, messages=CHAT, max_tokens=4,
                                                     temperature=0, stream=True))
        expect(all(ch.usage is None for ch in chunks), "usage sent without include_usage")
        return f"{len(chunks)} chunks, none with usage"

    checks.run("chat greedy", chat)
    checks.run("chat stream + include_usage", chat_stream)
    checks.run("chat stream, no usage", chat_stream_no_usage)

    # -- seeded sampling -------------------------------------------------------------
    def sampled(seed, stream=False):
        kw = dict(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=1.0, top_p=1.0, seed=seed)
        if stream:
            return "".join(ch.choices[0].text for ch in client.completions.create(stream=True, **kw) if ch.choices)
        return client.completions.create(**kw).choices[0].text

    def seeded():
        a, b = sampled(1234), sampled(1234)
        expect(a == b, f"seed 1234 gave {a!r}, then {b!r}")
        others = {sampled(s) for s in (1, 2, 3)}
        expect(len(others | {a}) > 1, "four seeds gave the same text: the seed does not reach the sampler")
        return f"seed 1234 twice equal, {len(others | {a})} distinct texts over 4 seeds"

    def seeded_stream():
        a, b = sampled(99), sampled(99, stream=True)
        expect(a == b, f"seed 99: {a!r} not streamed, {b!r} streamed")
        return "seed 99 streamed == not streamed"

    def seeded_chat():
        kw = dict(model=model, messages=CHAT, max_tokens=MAX_TOKENS, temperature=1.0, seed=7)
        a = client.chat.completions.create(**kw).choices[0].message.content
        b = client.chat.completions.create(**kw).choices[0].message.content
        expect(a == b, f"seed 7 gave {a!r}, then {b!r}")
        return "seed 7 twice equal"

    checks.run("seeded sampling reproducible", seeded)
    checks.run("seeded sampling, streamed == not", seeded_stream)
    checks.run("seeded chat reproducible", seeded_chat)

    # -- errors ----------------------------------------------------------------------
    def bad_request(call, what):
        try:
            call()
        except openai.BadRequestError as e:
            expect(e.status_code == 400, f"status {e.status_code}")
            expect(e.message, "no message")
            return f"BadRequestError: {e.message[:90]}"
        raise AssertionError(f"{what} succeeded")

    checks.run("completions max_tokens=0 -> 400", lambda: bad_request(
        lambda: client.completions.create(model=model, prompt=PROMPT, max_tokens=0), "max_tokens=0"))
    checks.run("completions over the context -> 400", lambda: bad_request(
        lambda: client.completions.create(model=model, prompt=PROMPT, max_tokens=1_000_000), "max_tokens=1e6"))
    checks.run("chat without messages -> 400", lambda: bad_request(
        lambda: client.chat.completions.create(model=model, messages=[]), "messages=[]"))
    checks.run("chat stream, bad temperature -> 400", lambda: bad_request(
        lambda: list(client.chat.completions.create(model=model, messages=CHAT, temperature=-1, stream=True)),
        "temperature=-1"))

    def not_found(call):
        try:
            call()
        except openai.NotFoundError as e:
            expect(e.status_code == 404, f"status {e.status_code}")
            return f"NotFoundError: {e.message[:90]}"
        raise AssertionError("an unknown model was served")

    checks.run("completions unknown model -> 404", lambda: not_found(
        lambda: client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=4)))
    checks.run("chat stream unknown model -> 404", lambda: not_found(
        lambda: list(client.chat.completions.create(model="no-such-model", messages=CHAT, stream=True))))

    return 1 if checks.print_table() else 0


if __name__ == "__main__":
    sys.exit(main())
