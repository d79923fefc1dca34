#!/usr/bin/env python3
"""Fixtures for the ONNX backend's tensor types and external data, built with onnx.helper
alone (no torch); ONNX Runtime computes the references. tools/export_onnx_models.py calls
write() from its `fixtures` set; run alone to refresh just these:

    python3 tools/onnx_type_fixtures.py [OUT]    # default tests/onnx/fixtures

Layout as export_onnx_models.py's: <out>/models/<name>/{config.pbtxt,1/model.onnx} and
<out>/reference/<name>/{manifest.txt,*.bin}. A STRING tensor's .bin is Triton's BYTES
serialization (each element a 4-byte little-endian length, then its bytes); FLOAT16 and
BFLOAT16 tensors hold their 2-byte bit patterns.
"""
import pathlib
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

TRITON = {TensorProto.FLOAT: "TYPE_FP32", TensorProto.FLOAT16: "TYPE_FP16",
          TensorProto.BFLOAT16: "TYPE_BF16", TensorProto.INT16: "TYPE_INT16",
          TensorProto.UINT16: "TYPE_UINT16", TensorProto.UINT32: "TYPE_UINT32",
          TensorProto.UINT64: "TYPE_UINT64", TensorProto.INT8: "TYPE_INT8",
          TensorProto.UINT8: "TYPE_UINT8", TensorProto.INT64: "TYPE_INT64",
          TensorProto.INT32: "TYPE_INT32", TensorProto.BOOL: "TYPE_BOOL",
          TensorProto.STRING: "TYPE_STRING", TensorProto.DOUBLE: "TYPE_FP64"}
B = 2  # rows in every reference


def tensor_bytes(arr, elem_type):
    if elem_type == TensorProto.STRING:
        out = b""
        for s in arr.reshape(-1):
            s = s if isinstance(s, bytes) else str(s).encode()
            out += len(s).to_bytes(4, "little") + s
        return out
    if elem_type == TensorProto.BFLOAT16:  # numpy has no bfloat16: the bits, as uint16
        return np.ascontiguousarray(arr, dtype=np.uint16).tobytes()
    return np.ascontiguousarray(arr).tobytes()


def graph_model(name, nodes, inputs, outputs, inits=(), opset=17):
    """inputs/outputs: (name, elem_type, dims after the batch)."""
    vi = lambda n, t, d: helper.make_tensor_value_info(n, t, ["batch"] + list(d))
    g = helper.make_graph(nodes, name, [vi(*i) for i in inputs], [vi(*o) for o in outputs],
                          initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def run_bf16(sess, feeds, types, out_names):
    """ONNX Runtime on BFLOAT16 tensors, which numpy lacks: their bits travel as uint16
    arrays in OrtValues typed BFLOAT16."""
    def ort_value(a, t):
        return (ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a, t) if t == TensorProto.BFLOAT16
                else ort.OrtValue.ortvalue_from_numpy(a))
    ins = {n: ort_value(a, types[n]) for n, a in feeds.items()}
    shapes = [v.shape() for v in sess.run_with_ort_values(out_names, ins)]
    io = sess.io_binding()
    for n, v in ins.items():
        io.bind_ortvalue_input(n, v)
    results = []
    for n, shape in zip(out_names, shapes):
        bf16 = types[n] == TensorProto.BFLOAT16
        host = np.empty(shape, dtype=np.uint16 if bf16 else helper.tensor_dtype_to_np_dtype(types[n]))
        io.bind_ortvalue_output(n, ort_value(host, types[n]))
        results.append(host)
    sess.run_with_iobinding(io)
    return results


def write(out, name, model, feeds, save=None):
    """Writes <out>/models/<name> (through `save(model, path)`, default onnx.save) and
    ONNX Runtime's outputs on `feeds` as the reference."""
    model_dir = out / "models" / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    path = model_dir / "1" / "model.onnx"
    (save or (lambda m, p: onnx.save(m, str(p))))(model, path)
    onnx.checker.check_model(str(path))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    types = {i.name: i.type.tensor_type.elem_type for i in list(model.graph.input) + list(model.graph.output)}
    out_names = [o.name for o in model.graph.output]
    if any(t == TensorProto.BFLOAT16 for t in types.values()):
        results = run_bf16(sess, feeds, types, out_names)
    else:
        results = sess.run(None, {k: v for k, v in feeds.items()})
    outs = list(zip(out_names, results))
    ins = [(i.name, feeds[i.name]) for i in model.graph.input]

    def io(kind, pairs):
        rows = [f'  {{ name: "{n}" data_type: {TRITON[types[n]]} dims: [ '
                + ", ".join(str(d) for d in a.shape[1:]) + " ] }" for n, a in pairs]
        return f"{kind} [\n" + ",\n".join(rows) + "\n]"
    (model_dir / "config.pbtxt").write_text("\n".join([
        f'name: "{name}"', 'platform: "onnxruntime_onnx"', "max_batch_size: 8",
        io("input", ins), io("output", outs),
        "dynamic_batching { max_queue_delay_microseconds: 200 }"]) + "\n")
    ref = out / "reference" / name
    ref.mkdir(parents=True, exist_ok=True)
    manifest = []
    for kind, pairs in (("input", ins), ("output", outs)):
        for n, a in pairs:
            a = np.asarray(a)
            f = f"{kind}_{n}.bin"
            (ref / f).write_bytes(tensor_bytes(a, types[n]))
            manifest.append(f"{kind} {n} {TRITON[types[n]]} {','.join(str(d) for d in a.shape)} {f}")
    (ref / "manifest.txt").write_text("\n".join(manifest) + "\n")
    print(f"{name}: outputs {[tuple(np.asarray(r).shape) for r in results]}")


def fixtures(out):
    rng = np.random.default_rng(90)
    F, H, BF = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
    rnd = lambda *s: rng.standard_normal(s).astype(np.float32)

    # FP16 weights, inputs and outputs: what torch's model.half() exports.
    w = numpy_helper.from_array(rnd(6, 5).astype(np.float16), "w")
    b = numpy_helper.from_array(rnd(5).astype(np.float16), "b")
    m = graph_model("type_fp16_mlp", [helper.make_node("MatMul", ["x", "w"], ["xw"]),
                                      helper.make_node("Add", ["xw", "b"], ["xwb"]),
                                      helper.make_node("Relu", ["xwb"], ["y"])],
                    [("x", H, [6])], [("y", H, [5])], [w, b])
    write(out, "type_fp16_mlp", m, {"x": rnd(B, 6).astype(np.float16)})

    # Casts to and from the half types inside an fp32 graph: values rounded to
    # half precision (ties to even) and back.
    x = np.concatenate([rnd(B, 5) * 3, np.array([[1 + 2**-11, 1 + 3 * 2**-11, 65519.0],
                                                 [1 + 2**-8, 1 + 3 * 2**-8, 1e-6]], np.float32)], 1)
    m = graph_model("type_half_casts", [
        helper.make_node("Cast", ["x"], ["h"], to=H),
        helper.make_node("Cast", ["h"], ["y_fp16"], to=F),
        helper.make_node("Cast", ["x"], ["bh"], to=BF),
        helper.make_node("Cast", ["bh"], ["y_bf16"], to=F)],
        [("x", F, [8])], [("y_fp16", F, [8]), ("y_bf16", F, [8])])
    write(out, "type_half_casts", m, {"x": x})

    # BFLOAT16 inputs, outputs and an initializer (inputs as their bits, uint16).
    # (A generator of its own, so that the fixtures after it keep their values.)
    rng_bf = np.random.default_rng(91)
    rnd_bf = lambda *s: rng_bf.standard_normal(s).astype(np.float32)
    to_bf16 = lambda a: (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    b = helper.make_tensor("b", BF, [4], to_bf16(rnd_bf(4)).tolist())
    m = graph_model("type_bf16_io", [
        helper.make_node("Cast", ["x"], ["xf"], to=F),
        helper.make_node("Cast", ["b"], ["bf"], to=F),
        helper.make_node("MatMul", ["xf", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "bf"], ["yf"]),
        helper.make_node("Cast", ["yf"], ["y"], to=BF)],
        [("x", BF, [3])], [("y", BF, [4])], [numpy_helper.from_array(rnd_bf(3, 4), "w"), b])
    write(out, "type_bf16_io", m, {"x": to_bf16(rnd_bf(B, 3))})

    # DOUBLE inputs, outputs and weights, computed as fp32 (own generator, as above).
    rng_d = np.random.default_rng(92)
    D = TensorProto.DOUBLE
    m = graph_model("type_fp64_io", [helper.make_node("Mul", ["x", "c"], ["xc"]),
                                     helper.make_node("Relu", ["xc"], ["y"])],
                    [("x", D, [4])], [("y", D, [4])],
                    [numpy_helper.from_array(rng_d.standard_normal(4), "c")])
    write(out, "type_fp64_io", m, {"x": rng_d.standard_normal((B, 4))})

    # Small integer types through data movement and a Cast chain.
    I16, U16, U32, U64, I64 = (TensorProto.INT16, TensorProto.UINT16, TensorProto.UINT32,
                               TensorProto.UINT64, TensorProto.INT64)
    a = rng.integers(-30000, 30000, (B, 4)).astype(np.int16)
    u = rng.integers(0, 65535, (B, 4)).astype(np.uint16)
    u32 = rng.integers(0, 2**32 - 1, (B, 3)).astype(np.uint32)
    u64 = rng.integers(0, 2**63, (B, 3), dtype=np.uint64)
    m = graph_model("type_int16_chain", [
        helper.make_node("Identity", ["a"], ["a_out"]),
        helper.make_node("Transpose", ["u"], ["ut"], perm=[0, 1]),
        helper.make_node("Concat", ["ut", "u"], ["u_cat"], axis=1),
        helper.make_node("Cast", ["a"], ["a64"], to=I64),
        helper.make_node("Cast", ["a64"], ["a_u16"], to=U16),
        helper.make_node("Cast", ["a_u16"], ["a_back"], to=I16),
        helper.make_node("Cast", ["u"], ["u_f"], to=F),
        helper.make_node("Identity", ["w32"], ["w32_out"]),
        helper.make_node("Identity", ["w64"], ["w64_out"])],
        [("a", I16, [4]), ("u", U16, [4]), ("w32", U32, [3]), ("w64", U64, [3])],
        [("a_out", I16, [4]), ("u_cat", U16, [8]), ("a_u16", U16, [4]), ("a_back", I16, [4]),
         ("u_f", F, [4]), ("w32_out", U32, [3]), ("w64_out", U64, [3])])
    write(out, "type_int16_chain", m, {"a": a, "u": u, "w32": u32, "w64": u64})

    # A STRING input passed through (Triton's BYTES), as tokenizer-side ids are.
    words = np.array([["alpha", "b"], ["", "\u03bb delta"]], dtype=object)
    m = graph_model("type_string_identity", [helper.make_node("Identity", ["s"], ["s_out"])],
                    [("s", TensorProto.STRING, [2])], [("s_out", TensorProto.STRING, [2])])
    write(out, "type_string_identity", m, {"s": words})
    # STRING inputs beside a computation: one copied to an output, one unused.
    m = graph_model("type_string_beside", [helper.make_node("Relu", ["x"], ["y"]),
                                           helper.make_node("Identity", ["s"], ["s_out"])],
                    [("x", F, [3]), ("s", TensorProto.STRING, [2]),
                     ("unused", TensorProto.STRING, [1])],
                    [("y", F, [3]), ("s_out", TensorProto.STRING, [2])])
    write(out, "type_string_beside", m, {"x": rnd(B, 3), "s": words[::-1].copy(),
                                         "unused": np.array([["x"], ["yz"]], dtype=object)})

    # Weights in model.onnx.data next to model.onnx, as exporters write models past 2 GB.
    w = numpy_helper.from_array(rnd(6, 5), "w")
    b = numpy_helper.from_array(rnd(5), "b")
    m = graph_model("type_external_data", [helper.make_node("MatMul", ["x", "w"], ["xw"]),
                                           helper.make_node("Add", ["xw", "b"], ["y"])],
                    [("x", F, [6])], [("y", F, [5])], [w, b])
    def save(model, p):
        # onnx appends to an existing data file: start from none.
        (p.parent / "model.onnx.data").unlink(missing_ok=True)
        onnx.save_model(model, str(p), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="model.onnx.data", size_threshold=0)
    write(out, "type_external_data", m, {"x": rnd(B, 6)}, save)


if __name__ == "__main__":
    root = pathlib.Path(__file__).resolve().parent.parent
    fixtures(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else root / "tests" / "onnx" / "fixtures")
