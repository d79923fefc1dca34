#!/usr/bin/env python3
"""Exports the ONNX models that caf-serving's ONNX backend is tested and benchmarked on,
with random weights, and writes ONNX Runtime's outputs on fixed random inputs as references.

    python3 tools/export_onnx_models.py fixtures   # small test fixtures -> tests/onnx/fixtures
    python3 tools/export_onnx_models.py examples   # examples/models/resnet_small, bert_small,
                                                   # densenet_small (tools/densenet_small.py)
    python3 tools/export_onnx_models.py bench --out build-onnx/bench-models
                                                   # ResNet-18/50, BERT-base, MiniLM-L6 (never committed)
    python3 tools/export_onnx_models.py zoo --out build-onnx/zoo
                                                   # the model zoo (tools/onnx_zoo.py, whose
                                                   # --help has its options; checked by
                                                   # scripts/onnx-zoo-check, never committed)

Needs torch, torchvision, transformers, onnx and onnxruntime (tools/requirements-onnx.txt).
The server, its build and its tests never need them: the fixtures are committed.

A model directory is Triton's layout, <out>/models/<name>/{config.pbtxt,1/model.onnx};
its reference is <out>/reference/<name>/{manifest.txt, *.bin}. manifest.txt has one line
per tensor:  input|output <name> <TYPE_...> <dims comma-separated> <file.bin>
and the .bin files hold raw little-endian elements.
"""
import argparse
import os
import pathlib

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn
import torchvision
from onnx import TensorProto, helper
from torchvision.models.resnet import BasicBlock, Bottleneck

import opset_fixtures
import pattern_fixtures

# By dtype name: ONNX Runtime answers INT64 as numpy.longlong, another type than numpy.int64.
TRITON_TYPE = {"float32": "TYPE_FP32", "int64": "TYPE_INT64", "int32": "TYPE_INT32",
               "bool": "TYPE_BOOL", "int8": "TYPE_INT8", "uint8": "TYPE_UINT8"}


def triton_type(arr):
    return TRITON_TYPE[arr.dtype.name]


# --------------------------------------------------------------------------- models


class NarrowResNet(nn.Module):
    """torchvision's ResNet with its own blocks and layer structure, but narrow widths,
    so a fixture has the same operators and patterns as ResNet-18/50 in a few hundred KB."""

    def __init__(self, block, layers, widths, num_classes):
        super().__init__()
        self.inplanes = widths[0]
        self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages = []
        for i, (w, n) in enumerate(zip(widths, layers)):
            stages.append(self._make_layer(block, w, n, 1 if i == 0 else 2))
        self.layers = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[-1] * block.expansion, num_classes)

    def _make_layer(self, block, planes, blocks, stride):
        down = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            down = nn.Sequential(nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride,
                                           bias=False), nn.BatchNorm2d(planes * block.expansion))
        mods = [block(self.inplanes, planes, stride, down)]
        self.inplanes = planes * block.expansion
        mods += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*mods)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.avgpool(self.layers(x))
        return self.fc(torch.flatten(x, 1))


def randomize_batchnorm(model, gen):
    """Random running statistics, so that BatchNorm folding is tested with values that matter."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(n, generator=gen) * 0.5 + 0.75)
            m.weight.data.copy_(torch.rand(n, generator=gen) * 0.5 + 0.75)
            m.bias.data.copy_(torch.randn(n, generator=gen) * 0.1)
    return model


def bert_model(kind, **shape):
    import transformers
    if kind == "distilbert":
        cfg = transformers.DistilBertConfig(**shape)
        model = transformers.DistilBertModel(cfg)
    else:
        cfg = transformers.BertConfig(**shape)
        model = transformers.BertModel(cfg)
    # The classic attention pattern (MatMul, Div, Add mask, Softmax, MatMul), as the
    # exports people serve today have it, not torch's fused SDPA.
    for c in (cfg, getattr(model, "config", None)):
        if c is not None:
            try:
                c._attn_implementation = "eager"
            except Exception:
                pass
    return model.eval()


class BertWrapper(nn.Module):
    def __init__(self, model, with_token_types):
        super().__init__()
        self.model = model
        self.with_token_types = with_token_types

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        kw = dict(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)
        if self.with_token_types:
            kw["token_type_ids"] = token_type_ids
        return self.model(**kw)


# --------------------------------------------------------------------------- export


def torch_export(module, args, names_in, names_out, path, opset):
    dyn = {n: {0: "batch"} for n in names_in + names_out}
    kw = dict(input_names=names_in, output_names=names_out, dynamic_axes=dyn,
              opset_version=opset, do_constant_folding=True)
    try:
        torch.onnx.export(module, args, str(path), dynamo=False, **kw)
    except TypeError:  # torch without the dynamo switch
        torch.onnx.export(module, args, str(path), **kw)


def write_model(out, name, onnx_path_writer, inputs, config_io=True, max_batch_size=8,
                extra_config="", labels=None):
    """Writes <out>/models/<name>, runs ONNX Runtime on `inputs` and writes the reference."""
    model_dir = out / "models" / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    onnx_file = model_dir / "1" / "model.onnx"
    onnx_path_writer(onnx_file)
    model = onnx.load(str(onnx_file))
    onnx.checker.check_model(model)
    sess_opts = ort.SessionOptions()
    sess_opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(onnx_file), sess_opts, providers=["CPUExecutionProvider"])
    feeds = {i.name: inputs[i.name] for i in sess.get_inputs()}
    outs = sess.run(None, feeds)
    out_names = [o.name for o in sess.get_outputs()]

    lines = [f'name: "{name}"', 'platform: "onnxruntime_onnx"', f"max_batch_size: {max_batch_size}"]
    if config_io:
        def io(kind, arrs):
            items = []
            for n, a in arrs:
                dims = ", ".join(str(d) for d in a.shape[1:])
                lbl = f' label_filename: "labels.txt"' if (labels and kind == "output") else ""
                items.append(f'  {{ name: "{n}" data_type: {triton_type(a)} dims: [ {dims} ]{lbl} }}')
            return f"{kind} [\n" + ",\n".join(items) + "\n]"
        lines.append(io("input", [(n, feeds[n]) for n in feeds]))
        lines.append(io("output", list(zip(out_names, outs))))
    lines.append('dynamic_batching { max_queue_delay_microseconds: 200 }')
    if extra_config:
        lines.append(extra_config)
    (model_dir / "config.pbtxt").write_text("\n".join(lines) + "\n")
    if labels:
        (model_dir / "labels.txt").write_text("\n".join(labels) + "\n")

    ref_dir = out / "reference" / name
    ref_dir.mkdir(parents=True, exist_ok=True)
    manifest = []
    for kind, pairs in (("input", list(feeds.items())), ("output", list(zip(out_names, outs)))):
        for n, a in pairs:
            a = np.ascontiguousarray(a)
            fname = f"{kind}_{n}.bin"
            a.tofile(ref_dir / fname)
            manifest.append(f"{kind} {n} {triton_type(a)} {','.join(str(d) for d in a.shape)} {fname}")
    (ref_dir / "manifest.txt").write_text("\n".join(manifest) + "\n")
    size = onnx_file.stat().st_size
    print(f"{name}: {size / 1e6:.2f} MB, outputs {[tuple(o.shape) for o in outs]}")


def export_resnet(out, name, module, opset, batch, hw, seed, **kw):
    module = module.eval()
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, 3, hw, hw), dtype=np.float32)
    write_model(out, name, lambda p: torch_export(module, (torch.from_numpy(x),), ["input"],
                                                  ["logits"], p, opset), {"input": x}, **kw)


def export_bert(out, name, model, opset, batch, seq, vocab, seed, token_types=True, **kw):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (batch, seq), dtype=np.int64)
    mask = np.ones((batch, seq), dtype=np.int64)
    for b in range(batch):  # padding at the end of all but the first row
        if b:
            mask[b, seq - (b * 3) % seq:] = 0
    types = np.zeros((batch, seq), dtype=np.int64)
    types[:, seq // 2:] = 1
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if token_types else [])
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    feeds = {n: feeds[n] for n in names}
    wrapper = BertWrapper(model, token_types).eval()
    outs = ["last_hidden_state"] + (["pooler_output"] if token_types else [])
    args = tuple(torch.from_numpy(feeds[n]) for n in names)
    write_model(out, name, lambda p: torch_export(wrapper, args, names, outs, p, opset), feeds,
                **kw)


# --------------------------------------------------------------------------- single ops


def single_op_model(path, op, inputs, outputs, attrs=None, initializers=(), opset=17):
    """A one-node ONNX model; `inputs`/`outputs` are (name, elem_type, shape) with the
    batch dimension named "batch"."""
    node = helper.make_node(op, [n for n, _, _ in inputs] + [t.name for t in initializers],
                            [n for n, _, _ in outputs], **(attrs or {}))
    g = helper.make_graph([node], f"single_{op}",
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                          initializer=[t for t in initializers if t.name])  # "": omitted
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8 if opset <= 20 else 10
    if any(s is None for _, _, s in outputs):  # outputs without a shape: ONNX's inference
        m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    onnx.save(m, str(path))


def const(name, arr):
    return onnx.numpy_helper.from_array(np.asarray(arr), name)


def export_single_ops(out, seed):
    rng = np.random.default_rng(seed)
    F = TensorProto.FLOAT
    B = 2
    def rnd(*s):
        return rng.standard_normal(s, dtype=np.float32)
    cases = [
        # name, op, inputs [(name, type, shape, value)], outputs [(name, type, shape)], attrs, inits
        ("op_conv", "Conv", [("x", F, ["batch", 3, 9, 9], rnd(B, 3, 9, 9))], [("y", F, ["batch", 4, 5, 5])],
         dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), [const("w", rnd(4, 3, 3, 3)), const("b", rnd(4))]),
        ("op_conv_group", "Conv", [("x", F, ["batch", 4, 6, 6], rnd(B, 4, 6, 6))], [("y", F, ["batch", 4, 6, 6])],
         dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=2), [const("w", rnd(4, 2, 3, 3))]),
        ("op_batchnorm", "BatchNormalization", [("x", F, ["batch", 3, 4, 4], rnd(B, 3, 4, 4))], [("y", F, ["batch", 3, 4, 4])],
         dict(epsilon=1e-5), [const("s", rnd(3)), const("bias", rnd(3)), const("mean", rnd(3)),
                              const("var", np.abs(rnd(3)) + 0.5)]),
        ("op_maxpool", "MaxPool", [("x", F, ["batch", 2, 7, 7], rnd(B, 2, 7, 7))], [("y", F, ["batch", 2, 4, 4])],
         dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), []),
        ("op_averagepool", "AveragePool", [("x", F, ["batch", 2, 6, 6], rnd(B, 2, 6, 6))], [("y", F, ["batch", 2, 3, 3])],
         dict(kernel_shape=[2, 2], strides=[2, 2]), []),
        ("op_globalaveragepool", "GlobalAveragePool", [("x", F, ["batch", 3, 5, 5], rnd(B, 3, 5, 5))],
         [("y", F, ["batch", 3, 1, 1])], {}, []),
        ("op_gemm", "Gemm", [("x", F, ["batch", 6], rnd(B, 6))], [("y", F, ["batch", 5])],
         dict(transB=1, alpha=0.5, beta=2.0), [const("w", rnd(5, 6)), const("c", rnd(5))]),
        ("op_matmul", "MatMul", [("x", F, ["batch", 3, 6], rnd(B, 3, 6))], [("y", F, ["batch", 3, 5])], {},
         [const("w", rnd(6, 5))]),
        ("op_softmax", "Softmax", [("x", F, ["batch", 3, 7], rnd(B, 3, 7))], [("y", F, ["batch", 3, 7])],
         dict(axis=-1), []),
        ("op_layernorm", "LayerNormalization", [("x", F, ["batch", 3, 8], rnd(B, 3, 8))], [("y", F, ["batch", 3, 8])],
         dict(axis=-1, epsilon=1e-5), [const("g", rnd(8)), const("b", rnd(8))]),
        ("op_transpose", "Transpose", [("x", F, ["batch", 2, 3, 4], rnd(B, 2, 3, 4))], [("y", F, ["batch", 4, 2, 3])],
         dict(perm=[0, 3, 1, 2]), []),
        ("op_tanh", "Tanh", [("x", F, ["batch", 5], rnd(B, 5))], [("y", F, ["batch", 5])], {}, []),
        ("op_sigmoid", "Sigmoid", [("x", F, ["batch", 5], rnd(B, 5))], [("y", F, ["batch", 5])], {}, []),
        ("op_clip", "Clip", [("x", F, ["batch", 5], rnd(B, 5))], [("y", F, ["batch", 5])], {},
         [const("lo", np.float32(-0.5)), const("hi", np.float32(0.7))]),
        ("op_reducesum", "ReduceSum", [("x", F, ["batch", 3, 4], rnd(B, 3, 4))], [("y", F, ["batch", 1, 4])],
         dict(keepdims=1), [const("axes", np.array([1], dtype=np.int64))]),
        ("op_split", "Split", [("x", F, ["batch", 6], rnd(B, 6))], [("y0", F, ["batch", 2]), ("y1", F, ["batch", 4])],
         dict(axis=1), [const("split", np.array([2, 4], dtype=np.int64))]),
        ("op_flatten", "Flatten", [("x", F, ["batch", 2, 3], rnd(B, 2, 3))], [("y", F, ["batch", 6])], dict(axis=1), []),
    ]
    # The operators that current exporters emit around the main work (issue 16). Appended,
    # so that the random inputs of the cases above stay as they were.
    I64, BOOL = TensorProto.INT64, TensorProto.BOOL
    special = rnd(B, 6)
    special[0, 1], special[0, 4], special[1, 0], special[1, 5] = np.nan, np.inf, -np.inf, np.nan
    cases += [
        ("op_isnan", "IsNaN", [("x", F, ["batch", 6], special)], [("y", BOOL, ["batch", 6])], {}, []),
        ("op_isinf", "IsInf", [("x", F, ["batch", 6], special)], [("y", BOOL, ["batch", 6])],
         dict(detect_negative=0), []),
        ("op_abs", "Abs", [("x", F, ["batch", 5], rnd(B, 5))], [("y", F, ["batch", 5])], {}, []),
        ("op_neg", "Neg", [("x", I64, ["batch", 5], rng.integers(-50, 50, (B, 5)))],
         [("y", I64, ["batch", 5])], {}, []),
        ("op_exp", "Exp", [("x", F, ["batch", 5], rnd(B, 5))], [("y", F, ["batch", 5])], {}, []),
        ("op_log", "Log", [("x", F, ["batch", 5], np.abs(rnd(B, 5)) + 0.1)], [("y", F, ["batch", 5])], {}, []),
        ("op_reciprocal", "Reciprocal", [("x", F, ["batch", 5], np.abs(rnd(B, 5)) + 0.5)],
         [("y", F, ["batch", 5])], {}, []),
        ("op_max", "Max", [("x", F, ["batch", 3, 4], rnd(B, 3, 4))], [("y", F, ["batch", 3, 4])], {},
         [const("row", rnd(4)), const("col", rnd(3, 1))]),
        ("op_min", "Min", [("a", F, ["batch", 3, 4], rnd(B, 3, 4)), ("b", F, ["batch", 1, 4], rnd(B, 1, 4))],
         [("y", F, ["batch", 3, 4])], {}, []),
        ("op_hardsigmoid", "HardSigmoid", [("x", F, ["batch", 6], 3 * rnd(B, 6))], [("y", F, ["batch", 6])],
         dict(alpha=0.3, beta=0.4), []),
        ("op_hardswish", "HardSwish", [("x", F, ["batch", 6], 4 * rnd(B, 6))], [("y", F, ["batch", 6])], {}, []),
        ("op_mod", "Mod", [("x", I64, ["batch", 6], rng.integers(-20, 20, (B, 6)))], [("y", I64, ["batch", 6])],
         {}, [const("d", np.array([3, -3, 7, -7, 4, -5], dtype=np.int64))]),
        ("op_mod_fmod", "Mod", [("x", F, ["batch", 6], 5 * rnd(B, 6))], [("y", F, ["batch", 6])],
         dict(fmod=1), [const("d", np.array([1.5, -1.5, 2.0, -2.5, 0.75, 3.0], dtype=np.float32))]),
        ("op_gatherelements", "GatherElements",
         [("x", F, ["batch", 3, 4], rnd(B, 3, 4)), ("i", I64, ["batch", 3, 2], rng.integers(-4, 4, (B, 3, 2)))],
         [("y", F, ["batch", 3, 2])], dict(axis=2), []),
        ("op_cumsum", "CumSum", [("x", F, ["batch", 5], rnd(B, 5))], [("y", F, ["batch", 5])],
         dict(exclusive=1, reverse=1), [const("axis", np.int64(1))]),
        ("op_argmax", "ArgMax", [("x", F, ["batch", 3, 5], rnd(B, 3, 5))], [("y", I64, ["batch", 3])],
         dict(axis=2, keepdims=0), []),
    ]
    for name, op, ins, outs, attrs, inits in cases:
        feeds = {n: v for n, _, _, v in ins}
        write_model(out, name, lambda p, op=op, ins=ins, outs=outs, attrs=attrs, inits=inits:
                    single_op_model(p, op, [(n, t, s) for n, t, s, _ in ins], outs, attrs, inits),
                    feeds)


def export_new_ops(out, seed):
    """The operators that torch's exporters, transformers and ONNX Runtime's optimizer emit
    and that issue 16 added (GatherND, Pad, ScatterND, Gelu, Trilu, Resize, Einsum,
    RMSNormalization, Attention, Q/DQ, ...): one tiny model each, at opset 17 where the
    operator exists there and at its newest semantics otherwise."""
    rng = np.random.default_rng(seed)
    F, I64, BOOL, I8, U8 = (TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL,
                            TensorProto.INT8, TensorProto.UINT8)
    B = 2

    def rnd(*s):
        return rng.standard_normal(s, dtype=np.float32)

    def i64(a):
        return np.array(a, dtype=np.int64)

    # Batched ScatterND: tuple (b, j) in row b, so that each row updates only itself.
    scatter_idx = np.stack([np.stack([np.full(3, b), i64([0, -1, 2])], -1) for b in range(B)])
    # Batched GatherND without batch_dims: likewise (b, j, k) in row b.
    gather_idx = np.stack([np.stack([np.full(4, b), i64([0, 2, -1, 1]), i64([1, -2, 0, 3])], -1)
                           for b in range(B)])
    topk_x = rng.permutation(B * 3 * 7).astype(np.float32).reshape(B, 3, 7) / 10
    q8 = rng.integers(-128, 128, (B, 3, 4)).astype(np.int8)
    u8 = rng.integers(0, 256, (B, 6)).astype(np.uint8)
    cases = [
        # name, op, inputs [(name, type, shape, value)], outputs [(name, type)], attrs, inits, opset
        ("op_gathernd", "GatherND", [("x", F, ["batch", 3, 4, 5], rnd(B, 3, 4, 5)),
                                     ("i", I64, ["batch", 4, 3], gather_idx)],
         [("y", F)], {}, [], 17),
        ("op_gathernd_batch_dims", "GatherND",
         [("x", F, ["batch", 3, 4], rnd(B, 3, 4)),
          ("i", I64, ["batch", 2, 1, 2], rng.integers(-3, 3, (B, 2, 1, 2)))],
         [("y", F)], dict(batch_dims=1), [], 17),
        ("op_scatternd", "ScatterND", [("x", F, ["batch", 4, 5], rnd(B, 4, 5)),
                                       ("i", I64, ["batch", 3, 2], scatter_idx),
                                       ("u", F, ["batch", 3, 5], rnd(B, 3, 5))],
         [("y", F)], {}, [], 17),
        ("op_scatternd_add", "ScatterND", [("x", F, ["batch", 4, 5], rnd(B, 4, 5)),
                                           ("i", I64, ["batch", 3, 2], scatter_idx),
                                           ("u", F, ["batch", 3, 5], rnd(B, 3, 5))],
         [("y", F)], dict(reduction="add"), [], 17),
        ("op_scatternd_max", "ScatterND", [("x", F, ["batch", 4, 5], rnd(B, 4, 5)),
                                           ("i", I64, ["batch", 3, 2], scatter_idx),
                                           ("u", F, ["batch", 3, 5], rnd(B, 3, 5))],
         [("y", F)], dict(reduction="max"), [], 18),
        ("op_pad", "Pad", [("x", F, ["batch", 3, 4], rnd(B, 3, 4))], [("y", F)], {},
         [const("pads", i64([0, 1, 2, 0, 2, 1])), const("v", np.float32(1.5))], 17),
        ("op_pad_reflect", "Pad", [("x", F, ["batch", 2, 4, 5], rnd(B, 2, 4, 5))], [("y", F)],
         dict(mode="reflect"), [const("pads", i64([0, 0, 2, 3, 0, 0, 3, 1]))], 17),
        ("op_pad_edge_crop", "Pad", [("x", F, ["batch", 4, 5], rnd(B, 4, 5))], [("y", F)],
         dict(mode="edge"), [const("pads", i64([0, -1, 3, 0, 2, -2]))], 17),
        ("op_pad_wrap_axes", "Pad", [("x", F, ["batch", 3, 4], rnd(B, 3, 4))], [("y", F)],
         dict(mode="wrap"), [const("pads", i64([2, 1, 5, 0])), const("", np.float32(0)),
                             const("axes", i64([-1, 1]))], 25),
        ("op_trilu", "Trilu", [("x", F, ["batch", 4, 5], rnd(B, 4, 5))], [("y", F)],
         dict(upper=0), [const("k", np.int64(1))], 17),
        ("op_trilu_upper", "Trilu", [("x", I64, ["batch", 3, 4], rng.integers(-9, 9, (B, 3, 4)))],
         [("y", I64)], {}, [const("k", np.int64(-1))], 17),
        # torch.nn.functional.interpolate(scale_factor=2, mode="nearest") as exported
        ("op_resize_nearest", "Resize", [("x", F, ["batch", 2, 3, 4], rnd(B, 2, 3, 4))], [("y", F)],
         dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
         [const("roi", np.zeros(0, np.float32)), const("scales", np.float32([1, 1, 2, 2]))], 17),
        # interpolate(size=..., mode="bilinear", align_corners=False)
        ("op_resize_linear", "Resize", [("x", F, ["batch", 2, 4, 5], rnd(B, 2, 4, 5))], [("y", F)],
         dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel"),
         [const("roi", np.zeros(0, np.float32)), const("scales", np.float32([1, 1, 1.75, 0.6]))],
         17),
        ("op_resize_linear_align", "Resize", [("x", F, ["batch", 2, 4, 5], rnd(B, 2, 4, 5))],
         [("y", F)], dict(mode="linear", coordinate_transformation_mode="align_corners"),
         [const("roi", np.zeros(0, np.float32)), const("scales", np.float32([1, 1, 1.5, 2.3]))],
         17),
        ("op_resize_nearest_half_pixel", "Resize", [("x", F, ["batch", 2, 5, 6], rnd(B, 2, 5, 6))],
         [("y", F)], dict(mode="nearest"),
         [const("roi", np.zeros(0, np.float32)), const("scales", np.float32([1, 1, 0.6, 1.7]))],
         17),
        ("op_resize_axes", "Resize", [("x", F, ["batch", 2, 4, 5], rnd(B, 2, 4, 5))], [("y", F)],
         dict(mode="linear", axes=[2, 3], coordinate_transformation_mode="half_pixel_symmetric"),
         [const("", np.zeros(0, np.float32)), const("scales", np.float32([1.7, 0.6]))], 19),
        ("op_resize_sizes_axes", "Resize", [("x", F, ["batch", 2, 4, 5], rnd(B, 2, 4, 5))],
         [("y", F)], dict(mode="nearest", axes=[3, 2], keep_aspect_ratio_policy="not_larger"),
         [const("", np.zeros(0, np.float32)), const("", np.zeros(0, np.float32)),
          const("sizes", i64([9, 7]))], 19),
        ("op_einsum", "Einsum", [("x", F, ["batch", 3, 4], rnd(B, 3, 4))], [("y", F)],
         dict(equation="bij,jk->bik"), [const("w", rnd(4, 5))], 17),
        ("op_einsum_attention", "Einsum", [("q", F, ["batch", 2, 3, 4], rnd(B, 2, 3, 4)),
                                           ("k", F, ["batch", 2, 5, 4], rnd(B, 2, 5, 4))],
         [("y", F)], dict(equation="bhqd,bhkd->bhqk"), [], 17),
        ("op_einsum_implicit", "Einsum", [("x", F, ["batch", 3, 4], rnd(B, 3, 4))], [("y", F)],
         dict(equation="...ij,jk"), [const("w", rnd(4, 2))], 17),
        ("op_tile", "Tile", [("x", F, ["batch", 2, 3], rnd(B, 2, 3))], [("y", F)], {},
         [const("r", i64([1, 3, 2]))], 17),
        ("op_topk", "TopK", [("x", F, ["batch", 3, 7], topk_x)], [("v", F), ("i", I64)],
         dict(axis=-1), [const("k", i64([3]))], 17),
        ("op_topk_smallest", "TopK", [("x", F, ["batch", 3, 7], topk_x)], [("v", F), ("i", I64)],
         dict(axis=1, largest=0), [const("k", i64([2]))], 17),
        ("op_gelu", "Gelu", [("x", F, ["batch", 6], 3 * rnd(B, 6))], [("y", F)], {}, [], 20),
        ("op_gelu_tanh", "Gelu", [("x", F, ["batch", 6], 3 * rnd(B, 6))], [("y", F)],
         dict(approximate="tanh"), [], 20),
        ("op_rmsnorm", "RMSNormalization", [("x", F, ["batch", 3, 8], rnd(B, 3, 8))], [("y", F)],
         dict(epsilon=1e-5), [const("s", rnd(8))], 23),
        ("op_rmsnorm_axis", "RMSNormalization", [("x", F, ["batch", 3, 4], rnd(B, 3, 4))],
         [("y", F)], dict(axis=1), [const("s", rnd(3, 4))], 23),
        ("op_quantize", "QuantizeLinear", [("x", F, ["batch", 3, 4], 20 * rnd(B, 3, 4))], [("y", I8)],
         dict(axis=1), [const("s", np.float32([0.1, 0.25, 0.05])), const("z", np.int8([0, 3, -2]))],
         17),
        ("op_quantize_uint8", "QuantizeLinear", [("x", F, ["batch", 6], 40 * rnd(B, 6))], [("y", U8)],
         {}, [const("s", np.float32(0.2)), const("z", np.uint8(128))], 17),
        ("op_quantize_output_dtype", "QuantizeLinear", [("x", F, ["batch", 6], 40 * rnd(B, 6))],
         [("y", I8)], dict(output_dtype=I8), [const("s", np.float32(0.3))], 25),
        ("op_dequantize", "DequantizeLinear", [("x", I8, ["batch", 3, 4], q8)], [("y", F)],
         dict(axis=1), [const("s", np.float32([0.1, 0.25, 0.05])), const("z", np.int8([0, 3, -2]))],
         17),
        ("op_dequantize_uint8", "DequantizeLinear", [("x", U8, ["batch", 6], u8)], [("y", F)], {},
         [const("s", np.float32(0.2)), const("z", np.uint8(128))], 17),
        ("op_lrn", "LRN", [("x", F, ["batch", 5, 3, 3], rnd(B, 5, 3, 3))], [("y", F)],
         dict(size=3, alpha=0.01, beta=0.6, bias=1.5), [], 17),
        ("op_reducemax", "ReduceMax", [("x", F, ["batch", 3, 4], rnd(B, 3, 4))], [("y", F)],
         dict(axes=[2], keepdims=0), [], 17),
        ("op_reducemin", "ReduceMin", [("x", I64, ["batch", 3, 4], rng.integers(-50, 50, (B, 3, 4)))],
         [("y", I64)], dict(axes=[1]), [], 17),
        ("op_reduceprod", "ReduceProd", [("x", F, ["batch", 3, 4], rnd(B, 3, 4))], [("y", F)],
         dict(keepdims=1), [const("axes", i64([-1, 1]))], 18),
        ("op_reducemax_opset20", "ReduceMax", [("x", F, ["batch", 3, 4], rnd(B, 3, 4))], [("y", F)],
         dict(keepdims=0), [const("axes", i64([1]))], 20),
        ("op_prelu", "PRelu", [("x", F, ["batch", 3, 4], rnd(B, 3, 4))], [("y", F)], {},
         [const("slope", rnd(3, 1))], 17),
    ]
    unary = [("Sin", {}), ("Cos", {}), ("Floor", {}), ("Ceil", {}), ("Round", {}), ("Sign", {}),
             ("Selu", dict(alpha=1.5, gamma=1.1)), ("Elu", dict(alpha=0.7)),
             ("LeakyRelu", dict(alpha=0.2)), ("Softplus", {}), ("Softsign", {}),
             ("ThresholdedRelu", dict(alpha=0.4))]
    for op, attrs in unary:
        x = 3 * rnd(B, 7)
        if op == "Round":
            x[0, :4] = [0.5, 1.5, -2.5, 2.5]  # halves go to the even neighbour
        if op == "Sign":
            x[0, 0] = 0
        cases.append((f"op_{op.lower()}", op, [("x", F, ["batch", 7], x)], [("y", F)], attrs, [],
                      17))
    cases.append(("op_mish", "Mish", [("x", F, ["batch", 7], 3 * rnd(B, 7))], [("y", F)], {}, [],
                  18))
    for name, op, ins, outs, attrs, inits, opset in cases:
        feeds = {n: v for n, _, _, v in ins}
        write_model(out, name, lambda p, op=op, ins=ins, outs=outs, attrs=attrs, inits=inits,
                    opset=opset:
                    single_op_model(p, op, [(n, t, s) for n, t, s, _ in ins],
                                    [(n, t, None) for n, t in outs], attrs, inits, opset), feeds)
    export_new_op_graphs(out, rng)


def export_new_op_graphs(out, rng):
    """The new operators in the small graphs exporters write around them."""
    F, BOOL, I64 = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64
    B = 2

    def model(g, opset):
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8 if opset <= 20 else 10
        return onnx.shape_inference.infer_shapes(m, strict_mode=True)

    # interpolate(size=(7, 3), mode="bilinear") as torch's exporter writes it: the sizes
    # are the input's own batch and channels, then the requested ones.
    x = rng.standard_normal((B, 2, 4, 5), dtype=np.float32)
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Slice", ["shape", "start", "end"], ["nc"]),
             helper.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear",
                              coordinate_transformation_mode="pytorch_half_pixel")]
    g = helper.make_graph(nodes, "resize_sizes",
                          [helper.make_tensor_value_info("x", F, ["batch", 2, 4, 5])],
                          [helper.make_tensor_value_info("y", F, None)],
                          initializer=[const("start", np.array([0], dtype=np.int64)),
                                       const("end", np.array([2], dtype=np.int64)),
                                       const("hw", np.array([7, 3], dtype=np.int64))])
    m = model(g, 17)
    write_model(out, "pattern_resize_sizes_opset17", lambda p: onnx.save(m, str(p)), {"x": x})
    # NonZero of a constant (a mask's positions, as torch's exporter writes index_select
    # with a boolean mask) folds away: the Gather reads the columns it chose.
    x = rng.standard_normal((B, 6), dtype=np.float32)
    nodes = [helper.make_node("NonZero", ["mask"], ["nz"]),
             helper.make_node("Squeeze", ["nz", "zero"], ["cols"]),
             helper.make_node("Gather", ["x", "cols"], ["y"], axis=1)]
    g = helper.make_graph(nodes, "nonzero", [helper.make_tensor_value_info("x", F, ["batch", 6])],
                          [helper.make_tensor_value_info("y", F, None)],
                          initializer=[const("mask", np.array([1, 0, 0, 1, 1, 0], dtype=bool)),
                                       const("zero", np.array([0], dtype=np.int64))])
    m = model(g, 17)
    write_model(out, "op_nonzero_constant", lambda p: onnx.save(m, str(p)), {"x": x})
    # Quantize-dequantize around a MatMul, as ONNX Runtime's static quantization writes it.
    x = rng.standard_normal((B, 3, 8), dtype=np.float32)
    w = rng.standard_normal((8, 4), dtype=np.float32)
    ws = np.abs(w).max(0) / 127
    wq = np.clip(np.round(w / ws), -127, 127).astype(np.int8)
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws"], ["wd"], axis=1),
             helper.make_node("MatMul", ["xd", "wd"], ["y"])]
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", F, ["batch", 3, 8])],
                          [helper.make_tensor_value_info("y", F, None)],
                          initializer=[const("xs", np.float32(0.03)), const("xz", np.uint8(120)),
                                       const("wq", wq), const("ws", ws.astype(np.float32))])
    m = model(g, 17)
    write_model(out, "pattern_qdq_matmul_opset17", lambda p: onnx.save(m, str(p)), {"x": x})
    # Attention-23: 3-D with a BOOL padding mask; 4-D grouped-query with is_causal and a
    # float mask.
    q, k, v = (rng.standard_normal((B, 5, 8), dtype=np.float32) for _ in range(3))
    mask = np.ones((B, 1, 5, 5), dtype=bool)  # ONNX Runtime wants the query length
    mask[1, ..., 3:] = False
    node = helper.make_node("Attention", ["q", "k", "v", "m"], ["y"], q_num_heads=2,
                            kv_num_heads=2)
    g = helper.make_graph([node], "attention",
                          [helper.make_tensor_value_info(n, F, ["batch", 5, 8]) for n in "qkv"]
                          + [helper.make_tensor_value_info("m", BOOL, ["batch", 1, 5, 5])],
                          [helper.make_tensor_value_info("y", F, None)])
    m = model(g, 23)
    write_model(out, "op_attention", lambda p: onnx.save(m, str(p)),
                {"q": q, "k": k, "v": v, "m": mask})
    q = rng.standard_normal((B, 4, 3, 4), dtype=np.float32)
    k = rng.standard_normal((B, 2, 3, 4), dtype=np.float32)
    v = rng.standard_normal((B, 2, 3, 6), dtype=np.float32)
    bias = rng.standard_normal((3, 3), dtype=np.float32)
    node = helper.make_node("Attention", ["q", "k", "v", "bias"], ["y", "present_k", "present_v"],
                            is_causal=1, scale=0.3)
    g = helper.make_graph([node], "attention_gqa",
                          [helper.make_tensor_value_info("q", F, ["batch", 4, 3, 4]),
                           helper.make_tensor_value_info("k", F, ["batch", 2, 3, 4]),
                           helper.make_tensor_value_info("v", F, ["batch", 2, 3, 6])],
                          [helper.make_tensor_value_info(n, F, ["batch"] + s) for n, s in
                           (("y", [4, 3, 6]), ("present_k", [2, 3, 4]), ("present_v", [2, 3, 6]))],
                          initializer=[const("bias", bias)])
    m = model(g, 23)
    write_model(out, "op_attention_gqa_causal", lambda p: onnx.save(m, str(p)),
                {"q": q, "k": k, "v": v})
    # The forms the engine runs as FusedAttention: torch's scaled_dot_product_attention
    # (4-D, is_causal) and 3-D heads with a float mask.
    q, k, v = (rng.standard_normal((B, 2, 6, 4), dtype=np.float32) for _ in range(3))
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1)
    g = helper.make_graph([node], "attention_sdpa",
                          [helper.make_tensor_value_info(n, F, ["batch", 2, 6, 4]) for n in "qkv"],
                          [helper.make_tensor_value_info("y", F, ["batch", 2, 6, 4])])
    m = model(g, 23)
    write_model(out, "op_attention_4d_causal", lambda p: onnx.save(m, str(p)),
                {"q": q, "k": k, "v": v})
    q, k, v = (rng.standard_normal((B, 5, 8), dtype=np.float32) for _ in range(3))
    bias = rng.standard_normal((5, 5), dtype=np.float32)
    node = helper.make_node("Attention", ["q", "k", "v", "bias"], ["y"], q_num_heads=4,
                            kv_num_heads=4, scale=0.4)
    g = helper.make_graph([node], "attention_float_mask",
                          [helper.make_tensor_value_info(n, F, ["batch", 5, 8]) for n in "qkv"],
                          [helper.make_tensor_value_info("y", F, ["batch", 5, 8])],
                          initializer=[const("bias", bias)])
    m = model(g, 23)
    write_model(out, "op_attention_float_mask", lambda p: onnx.save(m, str(p)),
                {"q": q, "k": k, "v": v})


class LayerNormPattern(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.ln = nn.LayerNorm(n)

    def forward(self, x):
        return self.ln(x)


class GeluPattern(nn.Module):
    def forward(self, x):
        return nn.functional.gelu(x)


def export_patterns(out, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 5, 16), dtype=np.float32)
    ln = LayerNormPattern(16)
    with torch.no_grad():
        ln.ln.weight.copy_(torch.randn(16))
        ln.ln.bias.copy_(torch.randn(16))
    for opset in (13, 17):
        write_model(out, f"pattern_layernorm_opset{opset}",
                    lambda p, opset=opset: torch_export(ln.eval(), (torch.from_numpy(x),), ["x"],
                                                        ["y"], p, opset), {"x": x})
    write_model(out, "pattern_gelu_opset13",
                lambda p: torch_export(GeluPattern(), (torch.from_numpy(x),), ["x"], ["y"], p, 13),
                {"x": x})


def export_mobilenetv3_block(out, seed):
    """torchvision's MobileNetV3 inverted residual with squeeze-and-excitation and its
    classifier, written as the TorchScript exporter leaves them (BatchNorm folded into the
    convolutions): Conv -> HardSwish, depthwise Conv -> HardSwish, SE (GlobalAveragePool,
    Conv, Relu, Conv, HardSigmoid, Mul), projection Conv + residual, then
    GlobalAveragePool, Flatten, Gemm -> HardSwish -> Gemm."""
    rng = np.random.default_rng(seed)
    F = TensorProto.FLOAT

    def w(name, *shape, scale=1.0):
        return const(name, (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)))

    N = helper.make_node
    nodes = [
        N("Conv", ["x", "c1.w", "c1.b"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        N("HardSwish", ["c1"], ["a1"]),
        N("Conv", ["a1", "dw.w", "dw.b"], ["dw"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=16),
        N("HardSwish", ["dw"], ["a2"]),
        N("GlobalAveragePool", ["a2"], ["pooled"]),
        N("Conv", ["pooled", "se1.w", "se1.b"], ["se1"], kernel_shape=[1, 1]),
        N("Relu", ["se1"], ["se1r"]),
        N("Conv", ["se1r", "se2.w", "se2.b"], ["se2"], kernel_shape=[1, 1]),
        N("HardSigmoid", ["se2"], ["scale"], alpha=1.0 / 6, beta=0.5),
        N("Mul", ["a2", "scale"], ["excited"]),
        N("Conv", ["excited", "pj.w", "pj.b"], ["pj"], kernel_shape=[1, 1]),
        N("Add", ["pj", "a1"], ["block"]),
        N("GlobalAveragePool", ["block"], ["gap"]),
        N("Flatten", ["gap"], ["flat"], axis=1),
        N("Gemm", ["flat", "fc1.w", "fc1.b"], ["fc1"], transB=1),
        N("HardSwish", ["fc1"], ["fc1a"]),
        N("Gemm", ["fc1a", "fc2.w", "fc2.b"], ["logits"], transB=1),
    ]
    inits = [w("c1.w", 16, 16, 3, 3, scale=1 / 12), w("c1.b", 16, scale=0.5),
             w("dw.w", 16, 1, 3, 3, scale=1 / 3), w("dw.b", 16, scale=0.5),
             w("se1.w", 8, 16, 1, 1, scale=0.25), w("se1.b", 8, scale=0.5),
             w("se2.w", 16, 8, 1, 1, scale=0.35), w("se2.b", 16, scale=0.5),
             w("pj.w", 16, 16, 1, 1, scale=0.25), w("pj.b", 16, scale=0.5),
             w("fc1.w", 32, 16, scale=0.25), w("fc1.b", 32, scale=0.5),
             w("fc2.w", 10, 32, scale=0.18), w("fc2.b", 10, scale=0.5)]
    g = helper.make_graph(nodes, "mobilenetv3_block",
                          [helper.make_tensor_value_info("x", F, ["batch", 16, 12, 12])],
                          [helper.make_tensor_value_info("logits", F, ["batch", 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    x = rng.standard_normal((2, 16, 12, 12), dtype=np.float32)
    write_model(out, "pattern_mobilenetv3_block_opset17", lambda p: onnx.save(m, str(p)), {"x": x})


def export_mbconv_block(out, seed):
    """The convolutions and activations of EfficientNet-B0 and MobileNetV2 the CUDA backend
    runs as a convolution then the epilogue kernel (issue 20): Conv -> SiLU (Sigmoid, Mul),
    depthwise stride-2 Conv -> Clip(0, 6), squeeze-excite with a SiLU 1x1 Conv and a
    Sigmoid one, a projection Conv + residual -> HardSwish (the residual before the
    activation), a grouped Conv, then Gemm (alpha, beta, C [1, N]) -> Tanh."""
    rng = np.random.default_rng(seed)
    F = TensorProto.FLOAT

    def w(name, *shape, scale=1.0):
        return const(name, (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)))

    N = helper.make_node
    nodes = [
        N("Conv", ["x", "c1.w", "c1.b"], ["c1"], kernel_shape=[1, 1]),
        N("Sigmoid", ["c1"], ["c1s"]),
        N("Mul", ["c1", "c1s"], ["a1"]),
        N("Conv", ["a1", "dw.w", "dw.b"], ["dw"], kernel_shape=[3, 3], strides=[2, 2],
          pads=[1, 1, 1, 1], group=24),
        N("Clip", ["dw", "lo", "hi"], ["a2"]),
        N("GlobalAveragePool", ["a2"], ["pooled"]),
        N("Conv", ["pooled", "se1.w", "se1.b"], ["se1"], kernel_shape=[1, 1]),
        N("Sigmoid", ["se1"], ["se1s"]),
        N("Mul", ["se1s", "se1"], ["se1a"]),
        N("Conv", ["se1a", "se2.w", "se2.b"], ["se2"], kernel_shape=[1, 1]),
        N("Sigmoid", ["se2"], ["scale"]),
        N("Mul", ["a2", "scale"], ["excited"]),
        N("Conv", ["excited", "pj.w", "pj.b"], ["pj"], kernel_shape=[1, 1]),
        N("Add", ["pj", "a2"], ["sum"]),
        N("HardSwish", ["sum"], ["a3"]),
        N("Conv", ["a3", "gc.w", "gc.b"], ["gc"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=4),
        N("GlobalAveragePool", ["gc"], ["gap"]),
        N("Flatten", ["gap"], ["flat"], axis=1),
        N("Gemm", ["flat", "fc.w", "fc.c"], ["fc"], alpha=0.7, beta=0.5),
        N("Tanh", ["fc"], ["logits"]),
    ]
    inits = [w("c1.w", 24, 16, 1, 1, scale=0.25), w("c1.b", 24, scale=0.5),
             w("dw.w", 24, 1, 3, 3, scale=1 / 3), w("dw.b", 24, scale=0.5),
             const("lo", np.float32(0.0)), const("hi", np.float32(6.0)),
             w("se1.w", 8, 24, 1, 1, scale=0.2), w("se1.b", 8, scale=0.5),
             w("se2.w", 24, 8, 1, 1, scale=0.35), w("se2.b", 24, scale=0.5),
             w("pj.w", 24, 24, 1, 1, scale=0.2), w("pj.b", 24, scale=0.5),
             w("gc.w", 24, 6, 3, 3, scale=1 / 7), w("gc.b", 24, scale=0.5),
             w("fc.w", 24, 10, scale=0.3), w("fc.c", 1, 10, scale=0.5)]
    g = helper.make_graph(nodes, "mbconv_block",
                          [helper.make_tensor_value_info("x", F, ["batch", 16, 10, 10])],
                          [helper.make_tensor_value_info("logits", F, ["batch", 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    x = rng.standard_normal((2, 16, 10, 10), dtype=np.float32)
    write_model(out, "pattern_mbconv_block_opset17", lambda p: onnx.save(m, str(p)), {"x": x})


# --------------------------------------------------------------------------- sets


def fixtures(out):
    torch.manual_seed(1)
    gen = torch.Generator().manual_seed(2)
    resnet = randomize_batchnorm(NarrowResNet(BasicBlock, [1, 1, 1, 1], [8, 16, 32, 64], 10), gen)
    bottle = randomize_batchnorm(NarrowResNet(Bottleneck, [1, 1, 1, 1], [4, 8, 16, 32], 10), gen)
    for opset in (13, 17):
        export_resnet(out, f"resnet_narrow_opset{opset}", resnet, opset, 2, 64, 10 + opset)
    export_resnet(out, "resnet_bottleneck_opset17", bottle, 17, 2, 64, 30)
    # Wide enough early layers that at one row on 2 threads the engine splits
    # 3x3 convolutions (Winograd, and strided) into bands of rows on copies.
    gen = torch.Generator().manual_seed(9)
    bands = randomize_batchnorm(NarrowResNet(BasicBlock, [1, 1, 1, 1], [32, 32, 32, 32], 10), gen)
    export_resnet(out, "resnet_bands_opset17", bands, 17, 2, 96, 31)
    torch.manual_seed(3)
    bert = bert_model("bert", vocab_size=512, hidden_size=64, num_hidden_layers=2,
                      num_attention_heads=4, intermediate_size=128, max_position_embeddings=64)
    for opset in (13, 17):
        # Opset 17 leaves inputs and outputs out of config.pbtxt: the server derives them.
        export_bert(out, f"bert_2layer_opset{opset}", bert, opset, 2, 16, 512, 40 + opset,
                    config_io=(opset == 13))
    torch.manual_seed(4)
    distil = bert_model("distilbert", vocab_size=512, dim=64, n_layers=2, n_heads=4,
                        hidden_dim=128, max_position_embeddings=64)
    export_bert(out, "distilbert_2layer_opset13", distil, 13, 2, 16, 512, 50, token_types=False)
    export_single_ops(out, 60)
    export_patterns(out, 70)
    export_mobilenetv3_block(out, 80)
    export_mbconv_block(out, 81)
    opset_fixtures.export(out, write_model)
    # torch's SDPA as both exporters write it (needs onnxscript for dynamo=True).
    pattern_fixtures.export(out, write_model)
    # com.microsoft operators of onnxruntime's transformer optimizer (onnx.helper only).
    import contrib_fixtures
    contrib_fixtures.export(out, write_model)
    contrib_fixtures.export_optimized_bert(out, write_model, bert_model, BertWrapper, torch_export)
    # Variable dimensions besides the batch (onnx.helper only; several reference sizes).
    import onnx_dynamic_fixtures
    onnx_dynamic_fixtures.write(out)
    import onnx_type_fixtures  # FP16/BF16, small integers, STRING, external data
    onnx_type_fixtures.fixtures(out)
    import quant_fixtures  # INT8: the integer operators, onnxruntime.quantization's output
    quant_fixtures.export(out, write_model)
    export_new_ops(out, 90)


def examples(out):
    torch.manual_seed(5)
    gen = torch.Generator().manual_seed(6)
    resnet = randomize_batchnorm(NarrowResNet(BasicBlock, [1, 1, 1, 1], [16, 32, 64, 128], 1000),
                                 gen)
    export_resnet(out, "resnet_small", resnet, 17, 1, 224, 7,
                  labels=[f"class_{i}" for i in range(1000)], max_batch_size=16)
    torch.manual_seed(8)
    bert = bert_model("bert", vocab_size=4096, hidden_size=128, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=512, max_position_embeddings=128)
    export_bert(out, "bert_small", bert, 17, 1, 32, 4096, 9, max_batch_size=16)


def bench(out, opsets):
    torch.manual_seed(11)
    for opset in opsets:
        export_resnet(out, f"resnet18_opset{opset}", torchvision.models.resnet18(), opset, 1, 224, 1,
                      max_batch_size=32)
        export_resnet(out, f"resnet50_opset{opset}", torchvision.models.resnet50(), opset, 1, 224, 2,
                      max_batch_size=32)
        bert = bert_model("bert")  # BERT-base: 12 layers, hidden 768, 12 heads
        export_bert(out, f"bert_base_opset{opset}", bert, opset, 1, 128, 30522, 3, max_batch_size=32)
        minilm = bert_model("bert", hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                            intermediate_size=1536)
        export_bert(out, f"minilm_l6_opset{opset}", minilm, opset, 1, 128, 30522, 4,
                    max_batch_size=32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("what", choices=["fixtures", "examples", "bench", "zoo"])
    ap.add_argument("--out", help="output directory (default depends on `what`)")
    ap.add_argument("--opsets", default="17,13", help="bench only: opsets to export")
    args, rest = ap.parse_known_args()
    if args.what == "zoo":  # its own options: tools/onnx_zoo.py
        import onnx_zoo
        return onnx_zoo.main(rest + (["--out", args.out] if args.out else []))
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    root = pathlib.Path(__file__).resolve().parent.parent
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
    with torch.no_grad():
        if args.what == "fixtures":
            fixtures(pathlib.Path(args.out or root / "tests" / "onnx" / "fixtures"))
        elif args.what == "examples":
            # Examples carry no reference; they go straight into examples/models.
            tmp = pathlib.Path(args.out or root / "build-onnx" / "examples-export")
            examples(tmp)
            import shutil
            for name in ("resnet_small", "bert_small"):
                dst = root / "examples" / "models" / name
                shutil.rmtree(dst, ignore_errors=True)
                shutil.copytree(tmp / "models" / name, dst)
            # Triton's densenet_onnx layout (format, reshape, labels), built with onnx alone.
            import densenet_small
            densenet_small.write(root / "examples" / "models")
        else:
            bench(pathlib.Path(args.out or root / "build-onnx" / "bench-models"),
                  [int(o) for o in args.opsets.split(",")])


if __name__ == "__main__":
    main()
