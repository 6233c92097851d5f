"""Loads a troupe export (`troupe export DIR --format safetensors OUT`) as Hugging Face's
GPT-2 layout would be read: Conv1D weights stored (in, out), tensor names as in
transformers' GPT2Model, gelu_new, LayerNorm eps 1e-5, LM head tied to wte. It runs the
prompt from `troupe generate DIR --logits-out L.json` through a plain PyTorch GPT-2 built
from those tensors, and compares its next-token logits with troupe's.

  python3 bench/reference/check_export.py model.safetensors logits.json

Exit 0 when max |difference| <= 1e-4 * (1 + max |logit|); prints both figures. Reads the
safetensors file directly (the format is a little-endian u64 header size, a JSON header,
raw tensor bytes), so only torch is needed (Debian's python3-torch).
"""
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, h in header.items():
        assert h["dtype"] == "F32", name
        a, b = h["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + a:base + b]), dtype=torch.float32)
        out[name] = t.reshape(h["shape"])
    return out, meta


def gpt2_logits(w, meta, ids):
    L, NH = int(meta["n_layer"]), int(meta["n_head"])
    x = w["wte.weight"][ids] + w["wpe.weight"][: len(ids)]
    T, C = x.shape
    HS = C // NH
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(L):
        p = f"h.{l}."
        h = F.layer_norm(x, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], 1e-5)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]  # Conv1D: (in, out)
        q, k, v = qkv.split(C, dim=1)
        q, k, v = (z.view(T, NH, HS).transpose(0, 1) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(HS)
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(0, 1).reshape(T, C)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], 1e-5)
        h = F.gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), w["ln_f.weight"], w["ln_f.bias"], 1e-5)
    return x[-1] @ w["wte.weight"].T  # tied LM head


def main():
    w, meta = load_safetensors(sys.argv[1])
    ref = json.load(open(sys.argv[2]))
    ids = torch.tensor(ref["prompt_ids"][-int(meta["n_positions"]):])
    with torch.no_grad():
        logits = gpt2_logits(w, meta, ids).double()
    troupe = torch.tensor(ref["logits"], dtype=torch.float64)
    diff = (logits - troupe).abs().max().item()
    scale = troupe.abs().max().item()
    ok = diff <= 1e-4 * (1 + scale)
    print(json.dumps({"name": "export_logits_vs_pytorch", "max_abs_diff": diff, "max_abs_logit": scale,
                      "tensors": len(w), "ok": ok}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
