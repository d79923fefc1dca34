"""tritonclient.grpc, unchanged, against a running caf-serving (scripts/triton-grpc-client-check).

    python tritonclient_grpc_check.py HOST:PORT [DESCRIPTOR_SET]

The calls Triton's gRPC examples make (health and metadata, infer, async
infer, streaming, string infer, explicit typed contents through the raw stub,
compression, classification, system shared memory, statistics, model control),
each checked against the answer it must give. DESCRIPTOR_SET (protoc
--descriptor_set_out of schemas/grpc_service.proto) is compared field by field
with the descriptor tritonclient ships: package, names, numbers, types.
Prints one line per check; exits 1 when any fails.
"""
import queue
import sys
import traceback

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

URL = sys.argv[1]
DESCRIPTORS = sys.argv[2] if len(sys.argv) > 2 else None
results = []


def check(name):
    def wrap(f):
        try:
            f()
            results.append((name, True))
            print(f"{name:52} PASS", flush=True)
        except Exception:
            results.append((name, False))
            print(f"{name:52} FAIL", flush=True)
            traceback.print_exc()
        return f
    return wrap


def simple_inputs(a, b):
    inputs = [grpcclient.InferInput("INPUT0", list(a.shape), "INT32"),
              grpcclient.InferInput("INPUT1", list(b.shape), "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


client = grpcclient.InferenceServerClient(URL)
A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


@check("protocol: descriptor matches tritonclient's")
def _():
    if DESCRIPTORS is None:
        print("    (no descriptor set given; not compared)")
        return
    from google.protobuf import descriptor_pb2
    theirs = descriptor_pb2.FileDescriptorProto()
    service_pb2.DESCRIPTOR.CopyToProto(theirs)
    fds = descriptor_pb2.FileDescriptorSet()
    with open(DESCRIPTORS, "rb") as f:
        fds.ParseFromString(f.read())
    ours = [f for f in fds.file if f.name == "grpc_service.proto"][0]
    assert ours.package == theirs.package == "inference", (ours.package, theirs.package)

    def fields(file):
        out = {}

        def walk(messages, prefix):
            for m in messages:
                for fd in m.field:
                    # The engine's ModelConfig lives in package caf_serving.config;
                    # the wire carries no package name.
                    out[prefix + m.name + "." + fd.name] = (
                        fd.number, fd.type, fd.label,
                        fd.type_name.replace(".caf_serving.config.", ".inference."))
                walk(m.nested_type, prefix + m.name + ".")
        walk(file.message_type, "")
        for s in file.service:
            for m in s.method:
                out["rpc " + s.name + "." + m.name] = (
                    m.input_type, m.output_type, m.client_streaming, m.server_streaming)
        return out
    a, b = fields(theirs), fields(ours)
    missing = sorted(set(a) - set(b))
    different = sorted(k for k in a if k in b and a[k] != b[k])
    assert not missing and not different, (missing, different)


@check("health: live, ready, model ready")
def _():
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("simple")
    assert not client.is_model_ready("no_such_model")


@check("metadata: server, model, config")
def _():
    meta = client.get_server_metadata()
    assert meta.name == "triton", meta
    m = client.get_model_metadata("simple")
    assert [i.name for i in m.inputs] == ["INPUT0", "INPUT1"], m
    assert list(m.inputs[0].shape) == [-1, 16], m
    config = client.get_model_config("simple").config
    assert config.max_batch_size == 8, config
    as_json = client.get_model_config("simple", as_json=True)
    assert as_json["config"]["name"] == "simple", as_json


@check("infer: sync, outputs asked for")
def _():
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    r = client.infer("simple", simple_inputs(A, B), outputs=outputs, request_id="7")
    assert r.get_response().id == "7"
    assert np.array_equal(r.as_numpy("OUTPUT0"), A + B)
    assert np.array_equal(r.as_numpy("OUTPUT1"), A - B)


@check("infer: async, 8 in flight")
def _():
    done = queue.Queue()
    for i in range(8):
        client.async_infer("simple", simple_inputs(A + i, B),
                           callback=lambda result, error, i=i: done.put((i, result, error)))
    for _ in range(8):
        i, result, error = done.get(timeout=30)
        assert error is None, error
        assert np.array_equal(result.as_numpy("OUTPUT0"), A + i + B)


@check("streaming: answers in order, an error in its place")
def _():
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i in range(10):
            model = "no_such_model" if i == 4 else "simple"
            client.async_stream_infer(model, simple_inputs(A * i, B), request_id=str(i))
        for i in range(10):
            result, error = answers.get(timeout=30)
            if i == 4:
                assert error is not None and "no_such_model" in str(error), error
                continue
            assert error is None, error
            assert result.get_response().id == str(i)
            assert np.array_equal(result.as_numpy("OUTPUT0"), A * i + B)
    finally:
        client.stop_stream()


@check("string infer: BYTES tensors")
def _():
    a = np.array([str(x).encode() for x in range(16)], dtype=np.object_).reshape(1, 16)
    b = np.array([b"1"] * 16, dtype=np.object_).reshape(1, 16)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "BYTES"),
              grpcclient.InferInput("INPUT1", [1, 16], "BYTES")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    r = client.infer("simple_string", inputs)
    got = [int(x) for x in r.as_numpy("OUTPUT0").reshape(-1)]
    assert got == [x + 1 for x in range(16)], got


@check("explicit typed contents through the raw stub")
def _():
    import grpc
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(URL))
    req = service_pb2.ModelInferRequest(model_name="simple")
    for name, values in (("INPUT0", A), ("INPUT1", B)):
        t = req.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        t.contents.int_contents[:] = values.reshape(-1).tolist()
    reply = stub.ModelInfer(req)
    out = np.frombuffer(reply.raw_output_contents[0], dtype=np.int32)
    assert np.array_equal(out, (A + B).reshape(-1))


@check("compression: gzip and deflate requests")
def _():
    for algorithm in ("gzip", "deflate"):
        r = client.infer("simple", simple_inputs(A, B), compression_algorithm=algorithm)
        assert np.array_equal(r.as_numpy("OUTPUT0"), A + B)


@check("classification: top 2 of OUTPUT0")
def _():
    out = grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)
    r = client.infer("simple", simple_inputs(A, B), outputs=[out])
    top = r.as_numpy("OUTPUT0").reshape(-1)
    assert top[0].decode().split(":")[:2] == ["18", "15"], top


@check("errors: unknown model NOT_FOUND, bad shape INVALID_ARGUMENT")
def _():
    try:
        client.infer("no_such_model", simple_inputs(A, B))
        raise AssertionError("no error")
    except InferenceServerException as e:
        assert "NOT_FOUND" in str(e.status()), e.status()
    try:
        client.infer("simple", simple_inputs(A[:, :8].copy(), B[:, :8].copy()))
        raise AssertionError("no error")
    except InferenceServerException as e:
        assert "INVALID_ARGUMENT" in str(e.status()) and "INPUT0" in e.message(), e


@check("system shared memory: register, infer, unregister")
def _():
    import tritonclient.utils.shared_memory as shm
    size = 64
    handle_in = shm.create_shared_memory_region("in", "/caf_grpc_check_in", size * 2)
    handle_out = shm.create_shared_memory_region("out", "/caf_grpc_check_out", size)
    try:
        shm.set_shared_memory_region(handle_in, [A, B])
        client.unregister_system_shared_memory()
        client.register_system_shared_memory("in", "/caf_grpc_check_in", size * 2)
        client.register_system_shared_memory("out", "/caf_grpc_check_out", size)
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
                  grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory("in", size)
        inputs[1].set_shared_memory("in", size, offset=size)
        out = grpcclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("out", size)
        r = client.infer("simple", inputs, outputs=[out])
        o = r.get_output("OUTPUT0")
        got = shm.get_contents_as_numpy(handle_out, np.int32, [1, 16])
        assert np.array_equal(got, A + B), got
        assert len(client.get_system_shared_memory_status().regions) == 2
        client.unregister_system_shared_memory()
    finally:
        shm.destroy_shared_memory_region(handle_in)
        shm.destroy_shared_memory_region(handle_out)


@check("statistics")
def _():
    s = client.get_inference_statistics("simple").model_stats[0]
    assert s.inference_stats.success.count > 0, s


@check("model control: index, unload, load")
def _():
    index = {m.name: m.state for m in client.get_model_repository_index().models}
    assert index.get("simple") == "READY", index
    client.unload_model("simple")
    assert not client.is_model_ready("simple")
    client.load_model("simple")
    assert client.is_model_ready("simple")
    r = client.infer("simple", simple_inputs(A, B))
    assert np.array_equal(r.as_numpy("OUTPUT0"), A + B)


failed = [n for n, ok in results if not ok]
print(f"tritonclient.grpc against caf-serving: {len(results) - len(failed)} of {len(results)} passed")
sys.exit(1 if failed else 0)
