#!/usr/bin/env python3
"""Write gym/testdata/golden_digest.json: NeMo Gym token digests computed with hashlib.

An independent implementation of the digest in docs/multitrace-grpo.md §2.1, written from the
spec text only:
  - domain b"nemo-gym-tokens", DIGEST_VERSION = 1;
  - compute_digest([]) = hex(sha256(domain)) (the domain alone, no header);
  - otherwise hex(sha256(domain || u8(1) || u64be(n) || u64be(t_0) || ... || u64be(t_{n-1}))).
The Go tests (gym/digest_test.go) read this file and never rewrite it. Run: make golden.
"""
import hashlib
import json
import os
import platform
import random
import struct

SCRIPT = "scripts/golden_digest.py"
SEED = 20261129
DOMAIN = b"nemo-gym-tokens"
VERSION = 1


def digest(tokens):
    if not tokens:
        return hashlib.sha256(DOMAIN).hexdigest()
    for t in tokens:
        if t < 0:
            raise ValueError("negative token")
    payload = struct.pack(">B", VERSION) + struct.pack(">Q", len(tokens))
    payload += b"".join(struct.pack(">Q", t) for t in tokens)
    return hashlib.sha256(DOMAIN + payload).hexdigest()


def main():
    rng = random.Random(SEED)
    cases = [
        ("empty", []),
        ("zero", [0]),
        ("one", [1]),
        ("small", [1, 2, 3]),
        ("worked_example_a_cum", [1, 2, 10, 11]),
        ("worked_example_b_cum", [1, 2, 10, 11, 3, 12]),
        ("int32_max", [2**31 - 1]),
        ("byte_edges", [255, 256, 65535, 65536, 2**24 - 1, 2**24]),
        ("repeated", [7] * 1000),
    ]
    for n in (2, 5, 17, 64, 511, 512, 513, 4096):
        cases.append((f"random_{n}", [rng.randrange(0, 2**31) for _ in range(n)]))
    for n in (3, 100):
        cases.append((f"vocab_{n}", [rng.randrange(0, 151936) for _ in range(n)]))
    out = {
        "metadata": {
            "script": SCRIPT,
            "seed": SEED,
            "library": "hashlib (CPython %s)" % platform.python_version(),
            "spec": "docs/multitrace-grpo.md §2.1",
        },
        "vectors": [{"name": name, "tokens": toks, "digest": digest(toks)} for name, toks in cases],
    }
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "gym", "testdata", "golden_digest.json")
    with open(path, "w") as f:
        # One vector per line keeps the file reviewable.
        f.write('{"metadata": %s,\n "vectors": [\n' % json.dumps(out["metadata"]))
        f.write(",\n".join("  " + json.dumps(v) for v in out["vectors"]))
        f.write("\n]}\n")
    print("wrote", path, len(cases), "vectors")


if __name__ == "__main__":
    main()
