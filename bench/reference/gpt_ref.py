"""Reference GPT-2 model in PyTorch, used by make_fixture.py (golden fixture)
and torch_bench.py (CPU throughput baseline).

The architecture, parameter names and parameter order match troupe's C++
model exactly; the order of named_parameters() is the canonical order:

  wte, wpe,
  h.{l}.ln_1.weight, h.{l}.ln_1.bias,
  h.{l}.attn.qkv.weight (3C,C), h.{l}.attn.qkv.bias (3C),
  h.{l}.attn.proj.weight (C,C), h.{l}.attn.proj.bias (C),
  h.{l}.ln_2.weight, h.{l}.ln_2.bias,
  h.{l}.mlp.fc.weight (4C,C), h.{l}.mlp.fc.bias (4C),
  h.{l}.mlp.proj.weight (C,4C), h.{l}.mlp.proj.bias (C),   for l in 0..L-1
  ln_f.weight, ln_f.bias

No dropout. LM head tied to wte. LayerNorm eps 1e-5.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        assert n_embd % n_head == 0
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=True)
        self.proj = nn.Linear(n_embd, n_embd, bias=True)

    def forward(self, x):
        B, T, C = x.shape
        NH = self.n_head
        HS = C // NH
        qkv = self.qkv(x)                      # (B, T, 3C) = [q | k | v]
        q, k, v = qkv.split(C, dim=2)
        # head h uses channels h*HS .. (h+1)*HS-1 of each of q, k, v
        q = q.view(B, T, NH, HS).transpose(1, 2)   # (B, NH, T, HS)
        k = k.view(B, T, NH, HS).transpose(1, 2)
        v = v.view(B, T, NH, HS).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))  # (B, NH, T, T)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v                                # (B, NH, T, HS)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd, bias=True)
        self.proj = nn.Linear(4 * n_embd, n_embd, bias=True)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        # registration order == canonical parameter order
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    """cfg: dict with n_layer, n_head, n_embd, block_size, vocab_size."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = dict(cfg)
        L, NH, C = cfg["n_layer"], cfg["n_head"], cfg["n_embd"]
        V, BS = cfg["vocab_size"], cfg["block_size"]
        self.wte = nn.Parameter(torch.empty(V, C))
        self.wpe = nn.Parameter(torch.empty(BS, C))
        self.h = nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)

    @torch.no_grad()
    def init_weights(self, generator=None, noise=True):
        """N(0,0.02) for embeddings and Linear weights, N(0,0.02/sqrt(2L)) for
        the residual output projections (attn.proj.weight, mlp.proj.weight).
        LayerNorm weight=1, bias=0, Linear bias=0; with noise=True then add
        N(0,0.1) to every LayerNorm weight and bias and N(0,0.02) to every
        Linear bias, so that every gradient is exercised.

        Parameters are drawn in canonical order from `generator`."""
        L = self.cfg["n_layer"]
        std = 0.02
        proj_std = 0.02 / math.sqrt(2 * L)

        def normal_(p, s):
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * s)

        for name, p in self.named_parameters():
            if name in ("wte", "wpe"):
                normal_(p, std)
            elif name.endswith("ln_1.weight") or name.endswith("ln_2.weight") \
                    or name == "ln_f.weight":
                p.fill_(1.0)
                if noise:
                    p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.1)
            elif name.endswith("ln_1.bias") or name.endswith("ln_2.bias") \
                    or name == "ln_f.bias":
                p.zero_()
                if noise:
                    p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.1)
            elif name.endswith("attn.proj.weight") or name.endswith("mlp.proj.weight"):
                normal_(p, proj_std)
            elif name.endswith(".weight"):      # attn.qkv.weight, mlp.fc.weight
                normal_(p, std)
            elif name.endswith(".bias"):        # Linear biases
                p.zero_()
                if noise:
                    p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.02)
            else:
                raise RuntimeError(f"unhandled parameter {name}")

    def forward(self, tokens, targets=None):
        B, T = tokens.shape
        assert T <= self.cfg["block_size"]
        x = self.wte[tokens] + self.wpe[:T]
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        logits = x @ self.wte.t()               # tied LM head, (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))
        return logits, loss


def canonical_names(n_layer):
    names = ["wte", "wpe"]
    for l in range(n_layer):
        p = f"h.{l}."
        names += [p + s for s in (
            "ln_1.weight", "ln_1.bias",
            "attn.qkv.weight", "attn.qkv.bias",
            "attn.proj.weight", "attn.proj.bias",
            "ln_2.weight", "ln_2.bias",
            "mlp.fc.weight", "mlp.fc.bias",
            "mlp.proj.weight", "mlp.proj.bias")]
    names += ["ln_f.weight", "ln_f.bias"]
    return names


def lr_at(step, lr, min_lr, warmup_steps, lr_decay_steps):
    """Learning rate for 1-based step `step`: linear warmup, then cosine
    decay to min_lr over lr_decay_steps, flat afterwards."""
    if step <= warmup_steps:
        return lr * step / warmup_steps
    p = min(1.0, (step - warmup_steps) / (lr_decay_steps - warmup_steps))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * p)) * (lr - min_lr)


def make_optimizer(model, lr, weight_decay, beta1, beta2, eps):
    """AdamW with weight decay on params with dim >= 2 (wte, wpe, Linear
    weights) and none on the rest."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(beta1, beta2), eps=eps)
