#!/usr/bin/env python3
"""PyTorch CPU training-step throughput for troupe's GPT-2 architecture
(bench/reference/gpt_ref.py), float32: the baseline troupe is measured against.

One step = zero_grad, forward, backward, clip_grad_norm_(1.0), AdamW step, on
a random batch of tokens. Prints one JSON line:
    {"tokens_per_s": ..., "ms_per_step": ..., "torch": ..., "threads": n, ...}

Run with Debian's python3 (it has torch), e.g.
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 \\
        /usr/bin/python3 bench/reference/torch_bench.py --threads 2
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_ref import GPT, make_optimizer  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n_layer", type=int, default=4)
    ap.add_argument("--n_embd", type=int, default=256)
    ap.add_argument("--n_head", type=int, default=4)
    ap.add_argument("--seq_len", type=int, default=128)
    ap.add_argument("--vocab_size", type=int, default=8192)
    ap.add_argument("--batch_size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    cfg = {"n_layer": args.n_layer, "n_head": args.n_head, "n_embd": args.n_embd,
           "block_size": args.seq_len, "vocab_size": args.vocab_size}
    model = GPT(cfg)                     # float32
    model.init_weights(generator=gen, noise=False)
    model.train()
    opt = make_optimizer(model, lr=1e-3, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8)

    B, T, V = args.batch_size, args.seq_len, args.vocab_size
    tokens = torch.randint(0, V, (B, T), generator=gen)
    targets = torch.randint(0, V, (B, T), generator=gen)

    def step():
        opt.zero_grad(set_to_none=True)
        _, loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        loss = step()
    dt = time.perf_counter() - t0

    ms_per_step = 1000.0 * dt / args.iters
    print(json.dumps({
        "tokens_per_s": round(B * T * args.iters / dt, 1),
        "ms_per_step": round(ms_per_step, 2),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "n_params": sum(p.numel() for p in model.parameters()),
        "config": {"n_layer": args.n_layer, "n_embd": args.n_embd, "n_head": args.n_head,
                   "seq_len": T, "vocab_size": V, "batch_size": B,
                   "warmup": args.warmup, "iters": args.iters},
        "final_loss": round(loss, 4),
        "env": {k: os.environ[k] for k in sorted(os.environ) if k.startswith(("OPENBLAS_", "OMP_", "MKL_"))},
    }))


if __name__ == "__main__":
    main()
