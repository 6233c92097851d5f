#!/usr/bin/env python3
"""Writes a large text corpus (troupe's text format: documents separated by a blank line)
built from the real sources of configs/blend.toml (scripts/get-sources.sh), with the kinds of
noise cleaning must handle. Deterministic for a given seed.

usage: bench/make_corpus.py OUT [--bytes N] [--seed S]

Each document is 8..60 sentences drawn at random from the pooled sentences of the
speeches, the Brown corpus, the mail bodies and lines of the Python sources, so documents
are distinct. Planted on top, per document: 3% exact copies of an earlier document, 3%
near copies (5% of the words replaced), 2% junk (symbols, short lines, ellipses) and 0.5%
with a stray non-UTF-8 byte (a config with utf8 = "replace" keeps them)."""
import argparse
import json
import os
import random
import re


def sentences(root):
    pool = []
    with open(os.path.join(root, "sotu.txt"), encoding="utf-8") as f:
        pool += re.split(r"(?<=[.!?])\s+", f.read())
    with open(os.path.join(root, "brown.txt"), encoding="utf-8") as f:
        pool += re.split(r"(?<=[.!?])\s+", f.read())
    with open(os.path.join(root, "mail.jsonl"), encoding="utf-8") as f:
        for line in f:
            body = json.loads(line)["text"].split("\n\n", 1)[-1]
            pool += [s for s in re.split(r"(?<=[.!?])\s+", body) if len(s) > 20]
    for dirpath, _, files in os.walk(os.path.join(root, "python")):
        for name in sorted(files):
            with open(os.path.join(dirpath, name), encoding="utf-8", errors="replace") as f:
                pool += [l for l in f.read().split("\n") if len(l.strip()) > 10]
    return [s.strip() for s in pool if s.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--bytes", type=int, default=1 << 30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default="data")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    pool = sentences(a.data)
    written = 0
    docs = []  # a window of recent documents to copy from
    with open(a.out + ".part", "wb") as out:
        while written < a.bytes:
            r = rng.random()
            if r < 0.03 and docs:
                doc = rng.choice(docs)
            elif r < 0.06 and docs:
                words = rng.choice(docs).split(" ")
                for _ in range(max(1, len(words) // 20)):
                    words[rng.randrange(len(words))] = rng.choice(pool).split(" ")[0]
                doc = " ".join(words)
            elif r < 0.08:
                doc = "\n".join("#" * rng.randint(1, 5) + " ... " + rng.choice(pool)[:20] + "..." for _ in range(rng.randint(3, 30)))
            else:
                doc = " ".join(rng.choice(pool) for _ in range(rng.randint(8, 60)))
            doc = re.sub(r"\n\s*\n", "\n", doc).strip()
            data = doc.encode("utf-8")
            if rng.random() < 0.005:
                cut = rng.randrange(len(data) + 1)
                data = data[:cut] + b"\xff" + data[cut:]
            out.write(data + b"\n\n")
            written += len(data) + 2
            docs.append(doc)
            if len(docs) > 1000:
                docs.pop(rng.randrange(len(docs)))
    os.replace(a.out + ".part", a.out)
    print(json.dumps({"name": "bench_corpus", "bytes": written, "sentences_pool": len(pool)}))


if __name__ == "__main__":
    main()
