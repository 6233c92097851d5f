#!/usr/bin/env python3
"""bench/gpu/torch_check.py DUMP_DIR OUT.json — troupe's CUDA kernels against PyTorch.

DUMP_DIR is what bench/gpu/cuda_kernel_dump wrote (manifest.json + raw little-endian
files). Each op is recomputed with PyTorch on the GPU in float64 (the bf16 GEMM from the
same bf16 inputs) and compared with a per-op tolerance: max |troupe - torch| <= atol +
rtol * max |torch|. Writes one verdict per op to OUT.json, prints a table, exits 1 when
any op is outside its tolerance. Ops: layernorm, GELU (tanh), causal attention forward and
backward (the fused kernel; torch's masked softmax in float64), cross-entropy losses
and gradients over 50304 classes, three AdamW steps (torch.optim.AdamW), bf16 GEMM + bias
and + GELU (cuBLASLt epilogues).
"""
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: checking a --cpu dump on a machine without a GPU
DT = {"f32": np.float32, "i32": np.int32, "bf16": np.uint16}


def load(d, man, name):
    m = man[name]
    a = np.fromfile(f"{d}/{name}.bin", dtype=DT[m["dtype"]]).reshape(m["shape"])
    if m["dtype"] == "bf16":  # bits -> float32 -> torch
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return torch.from_numpy(a.copy()).to(DEV)


def main():
    d, out = sys.argv[1], sys.argv[2]
    man = json.load(open(f"{d}/manifest.json"))
    f64 = lambda n: load(d, man, n).double()
    results = []

    def check(name, got, want, atol, rtol):
        diff = (got.double() - want.double()).abs().max().item()
        scale = want.double().abs().max().item()
        ok = diff <= atol + rtol * scale
        results.append({"op": name, "max_abs_diff": diff, "max_abs_ref": scale, "atol": atol, "rtol": rtol, "pass": ok})
        print(f"{'PASS' if ok else 'FAIL'}  {name:34s} max|diff| {diff:.3e}  (max|ref| {scale:.3e}, atol {atol}, rtol {rtol})")

    x = f64("ln_x")
    C = x.shape[-1]
    check("layernorm forward", f64("ln_out"), F.layer_norm(x, (C,), f64("ln_w"), f64("ln_b"), eps=1e-5), 1e-5, 1e-5)
    check("gelu (tanh) forward", f64("gelu_out"), F.gelu(x, approximate="tanh"), 1e-6, 1e-6)

    qkv = f64("att_qkv").requires_grad_(True)
    B, T, C3 = qkv.shape
    C, NH = C3 // 3, 12
    q, k, v = qkv.split(C, dim=2)
    heads = lambda t: t.view(B, T, NH, C // NH).transpose(1, 2)
    # causal softmax attention written out (what scaled_dot_product_attention(is_causal=True) computes), in float64
    qh, kh, vh = heads(q), heads(k), heads(v)
    s = qh @ kh.transpose(-1, -2) / (C // NH) ** 0.5
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    y = torch.softmax(s, dim=-1) @ vh
    y = y.transpose(1, 2).reshape(B, T, C)
    y.backward(f64("att_dout"))
    check("attention forward (fused)", f64("att_out"), y.detach(), 1e-5, 1e-4)
    check("attention backward dq|dk|dv (fused)", f64("att_dqkv"), qkv.grad, 1e-4, 1e-3)

    logits = f64("ce_logits").requires_grad_(True)
    tgt = load(d, man, "ce_targets").long()
    losses = F.cross_entropy(logits, tgt, reduction="none")
    losses.mean().backward()
    check("cross-entropy losses", f64("ce_losses"), losses.detach(), 1e-5, 1e-5)
    check("cross-entropy dlogits (mean)", f64("ce_dlogits"), logits.grad, 1e-9, 1e-4)

    p = torch.nn.Parameter(f64("adamw_p0"))
    opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for _ in range(3):
        p.grad = f64("adamw_g")
        opt.step()
    check("adamw, 3 steps (fp32 master)", f64("adamw_p3"), p.detach(), 1e-6, 1e-6)

    x16, w16, bias = f64("mm_x16"), f64("mm_w16"), f64("mm_bias")
    mm = x16 @ w16.t() + bias
    check("bf16 GEMM + bias (cuBLASLt)", f64("mm_out"), mm, 1e-4, 1e-4)
    check("bf16 GEMM + bias + GELU epilogue", f64("mm_gelu_out"), F.gelu(mm, approximate="tanh"), 1e-3, 1e-3)

    json.dump({"device": torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu", "torch": torch.__version__, "results": results},
              open(out, "w"), indent=1)
    bad = [r["op"] for r in results if not r["pass"]]
    print(f"{len(results) - len(bad)} of {len(results)} ops within tolerance" + (f"; failed: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
