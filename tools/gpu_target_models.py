"""The GPU executor's target models (issue 20) at their real sizes, with random weights, and
their stripped CI fixtures (tests/gpu/zoo).

    /work/wt/zoo-venv/bin/python tools/gpu_target_models.py --out DIR [--models bert_base,...]
                                     [--fixtures tests/gpu/zoo] [--no-reference]

Each model is built with torch.manual_seed (nothing is downloaded) and exported as most users
export today: torch.onnx.export(..., dynamo=False, opset_version=17) with a dynamic batch
axis only (text at a fixed sequence length of 128: the GPU plans need fixed dimensions
besides the batch). Every initializer larger than 64 KiB, and every floating-point weight,
bias or scale of 1 KiB or more (is_parameter), is then moved to external data in one file,
weights.bin (ONNX external_data: location, offset, length; offsets 64-byte aligned); the
others (shape tensors, axes, scalars, masks' constants, LayerNorm's epsilon) stay inline
with their real values, so every pass that reads a constant's value sees the real value.
Graph outputs get their fixed dimensions besides the batch (the exporter leaves BERT's
sequence axis symbolic).

DIR gets tools/onnx_zoo.py's layout, complete (weights.bin included), for a run on a device:
    DIR/models/<model>/{config.pbtxt, 1/model.onnx, 1/weights.bin}
    DIR/reference/<model>/{manifest.txt, info.txt, input_*.bin, output_*.bin}
(ONNX Runtime's outputs on fixed random inputs, batch 2; manifest.txt: one line per tensor,
input|output <name> <TYPE_...> <dims comma-separated> <file.bin>).

--fixtures D writes what is committed: D/<model>/{config.pbtxt, 1/model.onnx, weights.size,
weights.stats} (weights.size: weights.bin's length in bytes, one number; weights.stats: each
external tensor's name, type, offset, length, mean and standard deviation, also in
DIR/models/<model>/). That model.onnx is byte for byte DIR's, so DIR's weights.bin dropped
next to it gives the full model back; tests instead stage the fixture with a sparse
weights.bin of that size, or one of pseudo-random values with each tensor's mean and
deviation (tests/support/gpu_zoo.hpp).
"""
import argparse
import pathlib
import shutil
import sys
import time

import numpy as np
import onnx
import onnx.numpy_helper
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import onnx_zoo  # noqa: E402  (the zoo's model builders, reference writer and info)

OPSET = 17
SEQUENCE = 128
EXTERNAL_THRESHOLD = 64 * 1024  # bytes: larger initializers go to weights.bin
# Weights and biases from this size on go to weights.bin too (see is_parameter): without
# them the depthwise and squeeze-excite convolutions' weights and the transformers' biases
# and LayerNorm scales keep a MobileNet or BERT-base model.onnx near 1 MB.
PARAMETER_THRESHOLD = 1024
# Where an operator reads learned parameters: (input indices, or None for any input with a
# rank-1 constant, a bias or scale vector of an element-wise Add or Mul).
PARAMETER_SLOTS = {"Conv": {1, 2}, "ConvTranspose": {1, 2}, "Gemm": {0, 1, 2}, "MatMul": {0, 1},
                   "BatchNormalization": {1, 2, 3, 4}, "LayerNormalization": {1, 2},
                   "InstanceNormalization": {1, 2}, "Gather": {0}, "Add": None, "Mul": None}
FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
          onnx.TensorProto.DOUBLE}
ALIGNMENT = 64
WEIGHTS_FILE = "weights.bin"
STATS_FILE = "weights.stats"
STATS_HEADER = ("# One line per tensor in weights.bin: name, element type, offset and length in "
                "bytes,\n# mean and standard deviation of the real (random) weights.\n")
# cuda/gpu_options.hpp: the batch sizes with a captured CUDA graph.
GRAPH_BATCH_SIZES = "1,8,32"
MAX_BATCH = {"vision": 64, "text": 32}


# --------------------------------------------------------------------------- models


def vision(name, seed, **kw):
    """A torchvision model at its real size (1000 classes, 224x224)."""
    import torchvision
    torch.manual_seed(seed)
    model = getattr(torchvision.models, name)(weights=None, **kw)
    onnx_zoo.randomize_batchnorm(model, torch.Generator().manual_seed(seed + 1))
    onnx_zoo.randomize_constant_parameters(model, torch.Generator().manual_seed(seed + 2))
    x = np.random.default_rng(seed).standard_normal((2, 3, 224, 224), dtype=np.float32)
    return onnx_zoo.zoo_model(model, {"input": x}, ["logits"], {"input": {0: "batch"}},
                              "vision")


def text(model_cls, config_cls, seed, inputs, outputs, **cfg):
    """A transformers model in its real configuration (`cfg` overrides the defaults), fed
    SEQUENCE tokens; rows after the first are padded at the end (attention_mask 0)."""
    import transformers
    torch.manual_seed(seed)
    config = getattr(transformers, config_cls)(**cfg)
    model = getattr(transformers, model_cls)(config).eval()
    onnx_zoo.randomize_constant_parameters(model, torch.Generator().manual_seed(seed + 2))
    feeds = onnx_zoo.text_inputs(inputs, config.vocab_size, seed, batch=2, seq=SEQUENCE)
    return onnx_zoo.zoo_model(onnx_zoo.text_wrapper(model, inputs, outputs), feeds, outputs,
                              {n: {0: "batch"} for n in inputs}, "text")


BERT_IO = (["input_ids", "attention_mask", "token_type_ids"],
           ["last_hidden_state", "pooler_output"])

MODELS = {
    "resnet18": lambda: vision("resnet18", 501),
    "resnet50": lambda: vision("resnet50", 502),
    "mobilenet_v2": lambda: vision("mobilenet_v2", 503),
    "mobilenet_v3_large": lambda: vision("mobilenet_v3_large", 504),
    "mobilenet_v3_small": lambda: vision("mobilenet_v3_small", 505),
    "efficientnet_b0": lambda: vision("efficientnet_b0", 506),
    "vit_b_16": lambda: vision("vit_b_16", 507),
    "bert_base": lambda: text("BertModel", "BertConfig", 601, *BERT_IO),
    "distilbert_base": lambda: text("DistilBertModel", "DistilBertConfig", 602,
                                    ["input_ids", "attention_mask"], ["last_hidden_state"]),
    # sentence-transformers/all-MiniLM-L6-v2's shape.
    "minilm_l6": lambda: text("BertModel", "BertConfig", 603, *BERT_IO, hidden_size=384,
                              num_hidden_layers=6, num_attention_heads=12,
                              intermediate_size=1536),
    "gpt2": lambda: text("GPT2LMHeadModel", "GPT2Config", 604, ["input_ids", "attention_mask"],
                         ["logits"], use_cache=False),
}


# --------------------------------------------------------------------------- export


def export(m, path):
    """TorchScript's exporter at opset 17, the batch axis dynamic (inputs and outputs). Not
    under torch.no_grad(): there nn.MultiheadAttention takes its fused fast path, which the
    TorchScript exporter cannot export (ViT-B/16); people export without it."""
    axes = {n: {0: "batch"} for n in list(m.inputs) + m.outputs}
    args = tuple(torch.from_numpy(v) for v in m.inputs.values())
    torch.onnx.export(m.module, args, str(path), dynamo=False, input_names=list(m.inputs),
                      output_names=m.outputs, dynamic_axes=axes, opset_version=OPSET,
                      do_constant_folding=True)


def lift_large_constants(model):
    """Constant nodes holding a tensor above the threshold become initializers (the same
    value under the same name), so that their bytes can go to weights.bin too."""
    g = model.graph
    kept = []
    for n in g.node:
        if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value":
            t = n.attribute[0].t
            if onnx.numpy_helper.to_array(t).nbytes > EXTERNAL_THRESHOLD:
                lifted = onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(t), n.output[0])
                g.initializer.append(lifted)
                continue
        kept.append(n)
    del g.node[:]
    g.node.extend(kept)


def readers(graph):
    """initializer name -> [(op_type, input index)] of the nodes reading it."""
    out = {}
    for n in graph.node:
        for i, x in enumerate(n.input):
            out.setdefault(x, []).append((n.op_type, i))
    return out


def is_parameter(t, reads):
    """A floating-point tensor of PARAMETER_THRESHOLD bytes or more that every reader takes
    as a weight, bias or scale: its values decide no pass (passes read scalars: epsilons,
    Pow's exponent, GELU's constants, Clip's bounds) and no plan. Masks' constants (rank 2
    and up into element-wise operators) and integer tensors are never parameters."""
    if t.data_type not in FLOATS or not reads:
        return False
    if onnx.numpy_helper.to_array(t).nbytes < PARAMETER_THRESHOLD:
        return False
    for op, i in reads:
        slots = PARAMETER_SLOTS.get(op, set())
        if slots is None:
            if len(t.dims) != 1:
                return False
        elif i not in slots:
            return False
    return True


def fix_output_dims(model, shapes):
    """The exporter leaves some output dimensions symbolic (BERT's sequence axis) although
    only the batch axis is dynamic: each output's other dimensions become the sizes torch
    computed (`shapes`, in output order)."""
    for out, shape in zip(model.graph.output, shapes):
        dims = out.type.tensor_type.shape.dim
        if len(dims) != len(shape):
            raise RuntimeError(f"output {out.name}: the graph has rank {len(dims)}, torch's "
                               f"output {tuple(shape)}")
        for d, n in list(zip(dims, shape))[1:]:
            if not d.HasField("dim_value"):
                d.Clear()
                d.dim_value = n


def externalize(model_file, output_shapes):
    """Moves every initializer above EXTERNAL_THRESHOLD bytes, and every parameter
    (is_parameter), into weights.bin next to `model_file` (offsets ALIGNMENT-aligned), fixes
    the outputs' dimensions besides the batch and rewrites model_file; returns (the weights'
    length in bytes, weights.stats's lines: one per tensor moved)."""
    model = onnx.load(str(model_file))
    lift_large_constants(model)
    fix_output_dims(model, output_shapes)
    reads = readers(model.graph)
    weights = model_file.parent / WEIGHTS_FILE
    offset = 0
    stats = []
    with open(weights, "wb") as f:
        for t in model.graph.initializer:
            a = onnx.numpy_helper.to_array(t)
            if a.nbytes <= EXTERNAL_THRESHOLD and not is_parameter(t, reads.get(t.name)):
                continue
            raw = np.ascontiguousarray(a).tobytes()
            pad = (-offset) % ALIGNMENT
            f.write(b"\0" * pad)
            offset += pad
            f.write(raw)
            name = t.name
            t.CopyFrom(onnx.TensorProto(name=name, data_type=t.data_type, dims=list(t.dims)))
            t.data_location = onnx.TensorProto.EXTERNAL
            for k, v in (("location", WEIGHTS_FILE), ("offset", str(offset)),
                         ("length", str(len(raw)))):
                e = t.external_data.add()
                e.key, e.value = k, v
            a64 = a.astype(np.float64)
            stats.append(f"{name} {onnx.TensorProto.DataType.Name(t.data_type)} {offset} "
                         f"{len(raw)} {a64.mean():.9g} {a64.std():.9g}")
            offset += len(raw)
    onnx.save(model, str(model_file))
    return offset, stats


def config_pbtxt(name, model, kind):
    """tools/onnx_zoo.py's config (dims from the graph, batch axis left out), with the
    instance group and parameters of the CUDA executor. `instance_group` is on one line, so
    that KIND_GPU -> KIND_CPU is a one-line change for the CPU backend."""
    text = onnx_zoo.config_pbtxt(name, model, max_batch_size=MAX_BATCH[kind])
    if "-1" in text:
        raise RuntimeError(f"{name}: a dimension besides the batch is variable:\n{text}")
    return (text + "instance_group [ { kind: KIND_GPU count: 1 } ]\n"
            f'parameters {{ key: "cuda_graph_batch_sizes" '
            f'value: {{ string_value: "{GRAPH_BATCH_SIZES}" }} }}\n')


def write_model(out, name, m, with_reference):
    model_dir = out / "models" / name
    shutil.rmtree(model_dir, ignore_errors=True)
    (model_dir / "1").mkdir(parents=True)
    onnx_file = model_dir / "1" / "model.onnx"
    export(m, onnx_file)
    with torch.no_grad():
        outs = m.module(*(torch.from_numpy(v) for v in m.inputs.values()))
    outs = outs if isinstance(outs, tuple) else (outs,)
    weights_bytes, stats = externalize(onnx_file, [tuple(o.shape) for o in outs])
    (model_dir / STATS_FILE).write_text(STATS_HEADER + "".join(l + "\n" for l in stats))
    model = onnx.load(str(onnx_file), load_external_data=False)
    onnx.checker.check_model(str(onnx_file))  # by path: follows the external data
    (model_dir / "config.pbtxt").write_text(config_pbtxt(name, model, m.kind))
    outs = None
    if with_reference:
        outs = onnx_zoo.write_reference(out, name, onnx_file, m.inputs, model)
    return onnx_file.stat().st_size, weights_bytes, len(stats), outs


def write_fixture(out, name, fixtures):
    """The committed part: config.pbtxt, 1/model.onnx, weights.size and weights.stats."""
    src = out / "models" / name
    dst = fixtures / name
    shutil.rmtree(dst, ignore_errors=True)
    (dst / "1").mkdir(parents=True)
    shutil.copyfile(src / "config.pbtxt", dst / "config.pbtxt")
    shutil.copyfile(src / "1" / "model.onnx", dst / "1" / "model.onnx")
    shutil.copyfile(src / STATS_FILE, dst / STATS_FILE)
    (dst / "weights.size").write_text(f"{(src / '1' / WEIGHTS_FILE).stat().st_size}\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent.parent
                                         / "build-onnx" / "gpu-zoo"))
    ap.add_argument("--models", default="", help="comma-separated; default all: "
                    + ", ".join(MODELS))
    ap.add_argument("--fixtures", default="",
                    help="also write the stripped fixtures here (tests/gpu/zoo)")
    ap.add_argument("--no-reference", action="store_true",
                    help="skip ONNX Runtime's reference outputs")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, (__import__("os").cpu_count() or 1) // 2))
    out = pathlib.Path(args.out)
    names = [n for n in args.models.split(",") if n] or list(MODELS)
    for n in names:
        if n not in MODELS:
            raise SystemExit(f"unknown model '{n}'; the models: {', '.join(MODELS)}")
    for n in names:
        t0 = time.time()
        size, weights, moved, outs = write_model(out, n, MODELS[n](), not args.no_reference)
        shapes = [tuple(o.shape) for o in outs] if outs is not None else "not run"
        print(f"{n}: model.onnx {size / 1e3:.0f} KB, {WEIGHTS_FILE} {weights / 1e6:.1f} MB "
              f"({moved} tensors), outputs {shapes}, {time.time() - t0:.0f} s", flush=True)
        if args.fixtures:
            write_fixture(out, n, pathlib.Path(args.fixtures))


if __name__ == "__main__":
    main()
