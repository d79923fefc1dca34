"""Fixtures of the patterns torch's exporters write for transformer blocks today
(issue 16): the same small modules exported by the dynamo exporter
(torch.onnx.export(..., dynamo=True), its default opset) and by TorchScript at
opset 17, with a static sequence length and a dynamic batch. passes.test.cpp
checks that they fuse (FusedAttention, FusedLayerNorm) and that the fused plan
matches the unfused one; onnx.server.test serves them against ONNX Runtime.

The patterns (torch 2.x's scaled_dot_product_attention, as transformers 5
calls it by default):
  - Q and K each multiplied by sqrt(scale) before Q x K^T;
  - K^T written by the dynamo exporter as Reshape [B*H, S, D], Transpose
    (0, 2, 1), Reshape [B, H, D, S];
  - a boolean mask turned into an additive one by Where(mask, 0, -inf or the
    lowest float), added to the scores;
  - Where(IsNaN(p), 0, p) after the softmax: a row masked throughout gives 0.
The references' second row is masked throughout (the NaN guard matters).

vit_block is torchvision's ViT encoder block (nn.MultiheadAttention with
batch_first=True and one packed in-projection) as TorchScript writes it at
opset 17: Transpose to [S, B, E], MatMul + Add to [S, B, 3E], Reshape /
Unsqueeze / Transpose / Squeeze / Gather to Q, K and V, per-head Reshape /
Transpose, SDPA without a mask, Transpose (2, 0, 1, 3), Gemm out-projection
and the Transpose back to [B, S, E].

export_onnx_models.py's `fixtures` set calls export(); it needs torch and
onnxscript (the dynamo exporter).
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, SEQ, EMBED, HEADS = 2, 8, 32, 4


class sdpa_block(nn.Module):
    """A pre-LayerNorm self-attention block with torch's SDPA and a key padding
    mask given as 0/1 floats [B, S] (an integer mask would need GatherND in
    transformers' dynamo export)."""

    def __init__(self, causal=False):
        super().__init__()
        self.ln = nn.LayerNorm(EMBED)
        self.q = nn.Linear(EMBED, EMBED)
        self.k = nn.Linear(EMBED, EMBED)
        self.v = nn.Linear(EMBED, EMBED)
        self.o = nn.Linear(EMBED, EMBED)
        self.causal = causal
        # A constant (TorchScript writes Trilu for tril() in forward).
        self.register_buffer("tril", torch.ones(SEQ, SEQ, dtype=torch.bool).tril())

    def forward(self, x, mask):
        b, s, e = x.shape
        h = self.ln(x)

        def heads(t):
            return t.view(b, s, HEADS, e // HEADS).transpose(1, 2)

        keep = mask[:, None, None, :] > 0.5
        if self.causal:
            keep = keep & self.tril
        ctx = F.scaled_dot_product_attention(heads(self.q(h)), heads(self.k(h)),
                                             heads(self.v(h)), attn_mask=keep)
        return x + self.o(ctx.transpose(1, 2).reshape(b, s, e))


class vit_block(nn.Module):
    """torchvision's EncoderBlock (ViT-B/16's layer) at a tiny size: pre-LN
    self-attention through nn.MultiheadAttention(batch_first=True), then the
    GELU MLP, each with its residual."""

    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(EMBED, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(EMBED, HEADS, batch_first=True)
        self.ln_2 = nn.LayerNorm(EMBED, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(EMBED, 2 * EMBED), nn.GELU(), nn.Linear(2 * EMBED, EMBED))

    def forward(self, x):
        h = self.ln_1(x)
        h, _ = self.self_attention(h, h, h, need_weights=False)
        x = x + h
        return x + self.mlp(self.ln_2(x))


def export_module(module, feeds, path, dynamo):
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    names = list(feeds)
    if dynamo:
        from torch.export import Dim
        batch = Dim("batch", min=1, max=64)
        prog = torch.onnx.export(module, args, input_names=names, output_names=["y"],
                                 dynamic_shapes=tuple({0: batch} for _ in names), dynamo=True,
                                 external_data=False)
        prog.save(str(path))
    else:
        dyn = {n: {0: "batch"} for n in names + ["y"]}
        torch.onnx.export(module, args, str(path), dynamo=False, input_names=names,
                          output_names=["y"], dynamic_axes=dyn, opset_version=17,
                          do_constant_folding=True)


def export(out, write_model, seed=95):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, SEQ, EMBED), dtype=np.float32)
    mask = np.ones((BATCH, SEQ), dtype=np.float32)
    mask[0, SEQ - 3:] = 0  # padding at the end of the first row
    mask[1, :] = 0  # the second row masked throughout
    feeds = {"x": x, "mask": mask}
    for causal in (False, True):
        torch.manual_seed(seed + causal)
        module = sdpa_block(causal).eval()
        kind = "causal" if causal else "padding"
        for dynamo in (True, False):
            name = f"pattern_attention_{kind}_{'dynamo' if dynamo else 'torchscript17'}"
            write_model(out, name,
                        lambda p, m=module, d=dynamo: export_module(m, feeds, p, d), feeds)
    export_vit(out, write_model, seed + 2)


def export_vit(out, write_model, seed):
    """pattern_mha_vit_torchscript17: vit_block, whose attention the engine
    fuses into FusedAttention (passes.test.cpp, onnx.server.test)."""
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    module = vit_block().eval()
    with torch.no_grad():  # in-projection biases as a trained model has them, not zeros
        module.self_attention.in_proj_bias.normal_(0, 0.5)
        module.self_attention.out_proj.bias.normal_(0, 0.5)
    feeds = {"x": rng.standard_normal((BATCH, SEQ, EMBED), dtype=np.float32)}
    write_model(out, "pattern_mha_vit_torchscript17",
                lambda p: export_module(module, feeds, p, False), feeds)
