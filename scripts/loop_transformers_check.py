#!/usr/bin/env python3
"""loop_transformers_check.py DIR SEQS SCORE: transformers loads a tracegrpo weights directory (W/step_<N>) as it is
and its log-probabilities of SEQS ({"token_ids": [...]} lines) are train score's (SCORE: train score's output for
the same lines: "logprobs"[i] is token i+1's log-probability given the tokens before it).

Loaded in float32 (the bf16 weights exactly, fp32 math; TF32 off), the two differ by summation order only: within
FP32_ATOL. Loaded in bfloat16 (as a server computes), within BF16_ATOL: bf16's 8-bit mantissa puts ~0.4% relative
error on each matmul's output, a few hundredths of a logprob for these logits; 0.1 is a chosen bound, not a
measured one (this script has not run on a GPU yet). Part of scripts/gpu-check-loop.sh (gpu-check.sh's optional
stage GPU_CHECK_LOOP=1). Prints one PASS or FAIL line per dtype; exit status 1 on a failure.
"""
import json
import sys

import torch
import transformers

FP32_ATOL = 2e-4
BF16_ATOL = 0.1


def main() -> int:
    path, seqs_path, score_path = sys.argv[1:4]
    with open(seqs_path) as f:
        seqs = [json.loads(line)["token_ids"] for line in f if line.strip()]
    with open(score_path) as f:
        want = [json.loads(line)["logprobs"] for line in f if line.strip()]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    status = 0
    for name, dtype, atol in (("float32", torch.float32, FP32_ATOL), ("bfloat16", torch.bfloat16, BF16_ATOL)):
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        except TypeError:  # transformers < 4.56 names it torch_dtype
            model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype)
        model.to(device).eval()
        worst, where = 0.0, ""
        with torch.no_grad():
            for s, (ids, lp) in enumerate(zip(seqs, want)):
                logits = model(torch.tensor([ids], device=device)).logits.float()[0]
                got = torch.log_softmax(logits, dim=-1)[:-1].gather(1, torch.tensor(ids[1:], device=device)[:, None])[:, 0]
                d = (got.cpu() - torch.tensor(lp)).abs()
                if d.max().item() > worst:
                    worst, where = d.max().item(), f"sequence {s} token {int(d.argmax()) + 1}"
        ok = worst <= atol
        status |= 0 if ok else 1
        print(f"{'PASS' if ok else 'FAIL'}: loop: transformers {transformers.__version__} loads {path} in {name} on {device}: "
              f"log-probabilities of {len(seqs)} sequences within {worst:.3g} of train score's (bound {atol:g}; worst at {where})")
    return status


if __name__ == "__main__":
    sys.exit(main())
