#!/usr/bin/env python3
"""Write the golden GPT-2 fixture tests/fixtures/gpt_tiny.bin.

Run with Debian's python3 (it has torch):
    /usr/bin/python3 bench/reference/make_fixture.py [--out PATH]

The truth is computed in float64 on CPU from float32-representable initial
parameters, and stored as float32. Deterministic (fixed seed). The binary
format is described in tests/fixtures/README.md and read by
tests/fixture_io.h.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_ref import GPT, canonical_names, lr_at, make_optimizer  # noqa: E402

MAGIC = 0x58465254  # bytes 'T','R','F','X' read as a little-endian u32
VERSION = 1
DTYPE_F32, DTYPE_I32 = 0, 1
SEED = 1234

CONFIG = {
    "n_layer": 2, "n_head": 4, "n_embd": 32, "block_size": 16, "vocab_size": 96,
    "B": 3, "T": 12,
    "lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 3, "lr_decay_steps": 10,
    "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
    "grad_clip": 1.0, "steps": 10,
}


def write_fixture(path, header, tensors):
    """tensors: list of (name, np.ndarray float32 or int32)."""
    hb = json.dumps(header, sort_keys=True).encode("utf-8")
    out = bytearray()
    out += struct.pack("<III", MAGIC, VERSION, len(hb))
    out += hb
    out += struct.pack("<I", len(tensors))
    seen = set()
    for name, a in tensors:
        assert name not in seen, name
        seen.add(name)
        nb = name.encode("utf-8")
        if a.dtype == np.float32:
            dt = DTYPE_F32
        elif a.dtype == np.int32:
            dt = DTYPE_I32
        else:
            raise TypeError(f"{name}: unsupported dtype {a.dtype}")
        out += struct.pack("<I", len(nb)) + nb
        out += struct.pack("<II", dt, a.ndim)
        out += struct.pack("<%dq" % a.ndim, *a.shape)
        out += np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(out)
    return len(out)


def f32(t):
    return t.detach().cpu().to(torch.float32).numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/gpt_tiny.bin")
    args = ap.parse_args()

    cfg = CONFIG
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)

    # Initialise in float32 so the stored float32 params are exactly the
    # starting point of the float64 truth.
    model = GPT(cfg)
    model.init_weights(generator=gen, noise=True)
    names = [n for n, _ in model.named_parameters()]
    assert names == canonical_names(cfg["n_layer"]), names
    init_params = {n: p.detach().clone() for n, p in model.named_parameters()}

    B, T, V = cfg["B"], cfg["T"], cfg["vocab_size"]
    tokens = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)

    model = model.double()

    # --- one forward/backward from zero grads -------------------------------
    model.zero_grad(set_to_none=True)
    logits, loss = model(tokens, targets)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    logits = logits.detach().clone()
    loss_val = loss.detach().clone()

    # --- 10 AdamW steps on the same batch, from the initial params ----------
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(init_params[n].double())
    model.zero_grad(set_to_none=True)
    opt = make_optimizer(model, cfg["lr"], cfg["weight_decay"],
                         cfg["beta1"], cfg["beta2"], cfg["eps"])
    losses, lrs, norms = [], [], []
    for s in range(1, cfg["steps"] + 1):
        opt.zero_grad(set_to_none=True)
        _, l = model(tokens, targets)
        l.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        lr = lr_at(s, cfg["lr"], cfg["min_lr"], cfg["warmup_steps"], cfg["lr_decay_steps"])
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        losses.append(l.item())
        lrs.append(lr)
        norms.append(float(norm))

    header = dict(cfg)
    header.update({
        "generator": os.path.basename(__file__),
        "torch": torch.__version__,
        "dtype_of_truth": "float64",
        "seed": SEED,
    })

    tensors = []
    for n in names:
        tensors.append(("param/" + n, f32(init_params[n])))
    tensors.append(("input/tokens", tokens.to(torch.int32).numpy()))
    tensors.append(("input/targets", targets.to(torch.int32).numpy()))
    tensors.append(("out/logits", f32(logits)))
    tensors.append(("out/loss", f32(loss_val.reshape(1))))
    for n in names:
        tensors.append(("grad/" + n, f32(grads[n])))
    tensors.append(("train/losses", np.array(losses, dtype=np.float32)))
    tensors.append(("train/lrs", np.array(lrs, dtype=np.float32)))
    tensors.append(("train/grad_norms", np.array(norms, dtype=np.float32)))

    size = write_fixture(args.out, header, tensors)
    print(f"wrote {args.out}: {size} bytes, {len(tensors)} tensors, "
          f"loss {loss_val.item():.6f}, train losses {losses[0]:.4f} -> {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
