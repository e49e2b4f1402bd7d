#!/usr/bin/python3
"""Writes internal/safetensors/testdata goldens with an independent author.

PyTorch (Debian python3-torch) rounds float32 values to bfloat16 and float16 and
widens them back; this script lays the bytes out in the safetensors format by
hand from HF's specification (u64 LE header length, JSON header padded with
spaces to 8 bytes, tensors ordered by dtype alignment then name). The Go tests
check their conversions against torch's and their writer against these bytes.

Run: /usr/bin/python3 scripts/golden_safetensors.py   (or `make golden`)
"""
import json
import os
import struct

import numpy as np
import torch

SEED = 1234
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "internal", "safetensors", "testdata")
META = {
    "format": "pt",
    "golden_script": "scripts/golden_safetensors.py",
    "golden_seed": str(SEED),
    "golden_torch": torch.__version__,
}
RANK = {"F16": 11, "BF16": 12, "I32": 13, "F32": 15}


def raw(t):
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().astype("<i2").tobytes()
    if t.dtype == torch.float16:
        return t.contiguous().numpy().astype("<f2").tobytes()
    if t.dtype == torch.float32:
        return t.contiguous().numpy().astype("<f4").tobytes()
    if t.dtype == torch.int32:
        return t.contiguous().numpy().astype("<i4").tobytes()
    raise ValueError(t.dtype)


def dtname(t):
    return {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int32: "I32"}[t.dtype]


def save(path, tensors, meta):
    items = sorted(tensors.items(), key=lambda kv: (-RANK[dtname(kv[1])], kv[0]))
    header = {"__metadata__": dict(sorted(meta.items()))}
    blobs, off = [], 0
    for name, t in items:
        b = raw(t)
        header[name] = {"dtype": dtname(t), "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    g = torch.Generator().manual_seed(SEED)
    special = torch.tensor([
        0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), 65504.0, 65520.0, 65519.0, 1e5, -1e5,
        6.1e-5, 5.96e-8, 2.98e-8, 2.99e-8, 1e-9, 1e-40, -1e-40, 3.4e38, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8,
        1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 0.1, 1.0 / 3.0,
    ], dtype=torch.float32)
    rnd = torch.randn(200, generator=g) * torch.exp(torch.randn(200, generator=g) * 6)
    src = torch.cat([special, rnd]).contiguous()
    nan = torch.tensor([float("nan")], dtype=torch.float32)
    tensors = {
        "src": src,
        "src.bf16": src.to(torch.bfloat16),
        "src.f16": src.to(torch.float16),
        "bf16.widened": src.to(torch.bfloat16).float(),
        "f16.widened": src.to(torch.float16).float(),
        "nan": nan,
        "nan.bf16": nan.to(torch.bfloat16),
        "nan.f16": nan.to(torch.float16),
        "matrix": torch.randn(3, 5, generator=g),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
    }
    os.makedirs(OUT, exist_ok=True)
    save(os.path.join(OUT, "golden_mixed.safetensors"), tensors, META)

    # A two-shard checkpoint with its index, as transformers' save_pretrained
    # writes one.
    shard_dir = os.path.join(OUT, "sharded")
    os.makedirs(shard_dir, exist_ok=True)
    a = {"model.embed_tokens.weight": torch.randn(4, 3, generator=g).to(torch.bfloat16)}
    b = {"model.norm.weight": torch.randn(3, generator=g).to(torch.bfloat16),
         "lm_head.weight": torch.randn(4, 3, generator=g).to(torch.bfloat16)}
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    save(os.path.join(shard_dir, names[0]), a, META)
    save(os.path.join(shard_dir, names[1]), b, META)
    wm = {k: names[0] for k in a}
    wm.update({k: names[1] for k in b})
    total = sum(len(raw(t)) for t in list(a.values()) + list(b.values()))
    with open(os.path.join(shard_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}, f, indent=2)
        f.write("\n")
    # The expected float32 values of the sharded tensors.
    save(os.path.join(shard_dir, "expected.f32.safetensors.golden"),
         {k: v.float() for k, v in list(a.items()) + list(b.items())}, META)


if __name__ == "__main__":
    main()
