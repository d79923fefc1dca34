#!/usr/bin/env python3
"""Triton's qa/L0_http/generate_endpoint_test.py against caf-serving (issue 34).

Run by scripts/triton-generate-endpoint-test, which starts the server with the
stand-in model; by hand:

    python tools/triton_generate_endpoint_check.py --test .../qa/L0_http/generate_endpoint_test.py \
        --common .../qa/common --port 8000

Triton's test talks to `mock_llm`, a Python-backend model that echoes its
PROMPT input as its TEXT output (REPETITION times when STREAM is true; DELAY,
FAIL_LAST and OUTPUT_0_DIM change what it sends). The stand-in is the
generative test model named mock_llm, whose inputs are those of Triton's vLLM
backend. So a working copy of the test is run with two changes, nothing else:
its URL's port, and the mock's tensor names mapped to the vLLM backend's
(PROMPT -> text_input, STREAM -> stream, TEXT -> text_output).

Each test is then one of:
  PASS  it passed;
  N/A   it tests the mock's Python behaviour, not the endpoint: it is run, and
        its outcome is shown, but it counts neither way; a test that is only
        partly the mock's counts as N/A only when it failed at the mock's part
        (a failure that matches the reason's pattern), every check before that
        having passed;
  FAIL  any other failure.
Exit 1 when any test FAILs.
"""
import argparse
import importlib.util
import os
import re
import sys
import tempfile
import unittest

RENAMES = [("PROMPT", "text_input"), ("STREAM", "stream"), ("TEXT", "text_output")]

ECHO = r"^AssertionError: 'hello world' != "
ECHO_REASON = ("mock_llm echoes PROMPT as TEXT (REPETITION times); a decoder continues the "
               "prompt with generated text")

# test -> (kind, reason, failure patterns that mean "the mock's part").
#   applicable: the endpoint's behaviour, whatever model serves it;
#   partly: endpoint checks, then the mock's behaviour (patterns say which failures are the mock's);
#   mock: the mock's behaviour only.
CLASSES = {
    "test_generate": ("partly", ECHO_REASON, [ECHO]),
    "test_generate_with_all_inputs": (
        "mock", "input_ids is mock_llm's optional INT32 input; the stand-in declares vLLM's inputs, "
        "so input_ids is a request parameter, and an array parameter is a 400 in Triton too", []),
    "test_request_id": ("partly", ECHO_REASON, [ECHO]),
    "test_generate_stream": ("partly", ECHO_REASON, [ECHO]),
    "test_streaming": ("mock", "DELAY makes mock_llm sleep 2 s before each response", []),
    "test_missing_inputs": (
        "partly", "mock_llm has 2 required inputs of 3 (PROMPT and STREAM); vLLM's backend has 1 "
        "of 7 (text_input), so the counts in Triton's message differ and a lone prompt is valid",
        [r"expected number of inputs between 2 and 3 but got (\d)' not found in \"expected "
         r"number of inputs between 1 and 7 but got \1 inputs",
         r"Expected failure, success for \{'text_input': 'hello'\}"]),
    "test_invalid_input_types": ("applicable", "", []),
    "test_json_dtype_size_expansion_exceeds_limit_error": ("applicable", "", []),
    "test_duplicate_inputs": ("applicable", "", []),
    "test_generate_stream_response_error": (
        "partly", "FAIL_LAST makes mock_llm end with the error 'An Error Occurred'; " + ECHO_REASON,
        [ECHO]),
    "test_race_condition": ("applicable", "", []),
    "test_one_response": ("applicable", "", []),
    "test_zero_response": ("applicable", "", []),
    "test_many_response": ("applicable", "", []),
    "test_complex_schema": ("applicable", "", []),
    "test_close_connection_during_streaming": ("applicable", "", []),
    "test_parameters": ("partly", ECHO_REASON, [ECHO]),
    "test_0_dimension_output": ("mock", "OUTPUT_0_DIM makes mock_llm answer an empty TEXT tensor", []),
}


def working_copy(test_path, port, into):
    """The test with its port and the mock's tensor names changed; nothing else."""
    with open(test_path, encoding="utf-8") as f:
        text = f.read()
    text = text.replace("localhost:8000", f"localhost:{port}")
    for old, new in RENAMES:
        text = text.replace(f'"{old}"', f'"{new}"').replace(f"'{old}'", f"'{new}'")
    path = os.path.join(into, "generate_endpoint_test.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def last_error_line(trace):
    """The exception's line of a traceback ("AssertionError: ..."), printable."""
    lines = [l for l in trace.strip().splitlines()
             if re.match(r"[A-Za-z_][\w.]*(Error|Exception)\b", l)]
    line = lines[-1] if lines else trace.strip().splitlines()[-1]
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in line)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--test", required=True, help="Triton's qa/L0_http/generate_endpoint_test.py")
    ap.add_argument("--common", required=True, help="Triton's qa/common (its test_util.py)")
    ap.add_argument("--port", required=True, type=int, help="caf-serving's HTTP port")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="generate-endpoint-test-")
    path = working_copy(args.test, args.port, work)
    sys.path.insert(0, os.path.abspath(args.common))
    os.chdir(work)  # TestResultCollector writes test_results.txt here
    spec = importlib.util.spec_from_file_location("generate_endpoint_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    case = module.GenerateEndpointTest

    names = unittest.TestLoader().getTestCaseNames(case)
    unknown = [n for n in names if n not in CLASSES]
    rows = []
    for name in names:
        result = unittest.TestResult()
        unittest.TestSuite([case(name)]).run(result)
        problems = result.errors + result.failures
        outcome = "passed" if not problems else last_error_line(problems[0][1])
        kind, reason, patterns = CLASSES.get(name, ("applicable", "not classified: a test new to this file", []))
        if kind == "mock":
            verdict = "N/A"
            detail = f"{reason} (ran: {outcome})"
        elif not problems:
            verdict, detail = "PASS", ""
        elif kind == "partly" and any(re.search(p, outcome) for p in patterns):
            verdict = "N/A"
            detail = f"endpoint checks passed, then the mock's part: {reason} (ran: {outcome})"
        else:
            verdict, detail = "FAIL", outcome
        rows.append((name, verdict, detail))

    width = max(len(n) for n, _, _ in rows)
    for name, verdict, detail in rows:
        print(f"{name:<{width}}  {verdict:<4}  {detail}"[:400])
    count = {v: sum(1 for _, x, _ in rows if x == v) for v in ("PASS", "FAIL", "N/A")}
    print(f"Triton's generate_endpoint_test.py against caf-serving: {count['PASS']} passed, "
          f"{count['FAIL']} failed, {count['N/A']} not applicable, of {len(rows)}")
    if unknown:
        print(f"tests not classified here (taken as applicable): {unknown}")
    return 1 if count["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
