#!/usr/bin/env python3
"""Write gym/testdata/golden_fingerprint.json: NeMo Gym content fingerprints (version 3).

An independent implementation of the published algorithm of NeMo Gym's
assistant_fingerprint (nemo_gym/token_id_capture/fingerprint.py, FINGERPRINT_VERSION 3),
written from its description in gym/fingerprint.go's header, with Python's own str(),
truthiness, json.loads and hashlib. Gym serializes non-text content and tool arguments
with orjson.dumps(OPT_SORT_KEYS); orjson is not a Debian package, so canonical() below is
this script's own serializer of that format (orjson 3.8: compact, sorted keys, UTF-8
output, \\uXXXX only for control characters, 64-bit integers only, NaN/inf as null,
floats in Rust ryu's shortest form, at most 255 levels). scripts/gym_differential.py
re-runs every case through Gym's real fingerprint.py and reports any difference.

Each case stores the items as JSON text (read back with json.loads, so NaN, big integers
and lone surrogates survive), the expected hex digest, and the error class Gym's code
raises: "value" (ValueError/TypeError: the content witness abstains) or "crash"
(AttributeError: escapes Gym's resolve_terminal). The Go test (gym/fingerprint_test.go)
reads this file and never rewrites it. Run: make golden (with /usr/bin/python3).
"""
import hashlib
import json
import math
import os
import platform
import random
import struct

SCRIPT = "scripts/golden_fingerprint.py"
SEED = 20261130
VERSION = 3
DOMAIN = b"nemo-gym-lineage"
OUT = os.path.join(os.path.dirname(__file__), "..", "gym", "testdata", "golden_fingerprint.json")


class Crash(Exception):
    """Gym's code would raise AttributeError here."""


class Refused(Exception):
    """Gym's code would raise ValueError or TypeError here."""


# ---- orjson.dumps(v, option=OPT_SORT_KEYS), reimplemented ----

def ryu(f):
    if f == 0:
        return "-0.0" if math.copysign(1.0, f) < 0 else "0.0"
    sign = "-" if f < 0 else ""
    r = repr(abs(f))  # shortest round-trip digits
    mant, _, exp = r.partition("e")
    exp = int(exp) if exp else 0
    if "." in mant:
        ip, fp = mant.split(".")
    else:
        ip, fp = mant, ""
    digits = (ip + fp).lstrip("0")
    # position of the decimal point relative to the digit string
    point = len(ip) + exp
    lead_zeros = len(ip + fp) - len((ip + fp).lstrip("0"))
    point -= lead_zeros
    digits = digits.rstrip("0") or "0"
    n = len(digits)
    kk = point
    k = kk - n
    if k >= 0 and kk <= 16:
        return sign + digits + "0" * (kk - n) + ".0"
    if 0 < kk <= 16:
        return sign + digits[:kk] + "." + digits[kk:]
    if -5 < kk <= 0:
        return sign + "0." + "0" * (-kk) + digits
    body = digits if n == 1 else digits[0] + "." + digits[1:]
    return sign + body + "e" + str(kk - 1)


def jstr(s):
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise Refused("surrogate")
    out = ['"']
    names = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
    for ch in s:
        if ch in names:
            out.append(names[ch])
        elif ord(ch) < 0x20:
            out.append("\\u%04x" % ord(ch))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def canonical(v, depth=0):
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, int):
        if not -(2**63) <= v < 2**64:
            raise Refused("Integer exceeds 64-bit range")
        return str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return "null"
        return ryu(v)
    if isinstance(v, str):
        return jstr(v)
    if isinstance(v, list):
        if depth >= 255:
            raise Refused("Recursion limit reached")
        return "[" + ",".join(canonical(x, depth + 1) for x in v) + "]"
    if isinstance(v, dict):
        if depth >= 255:
            raise Refused("Recursion limit reached")
        keys = sorted(v)
        return "{" + ",".join(jstr(k) + ":" + canonical(v[k], depth + 1) for k in keys) + "}"
    raise Refused("type")


# ---- the fingerprint ----

def field(tag, s):
    try:
        b = s.encode("utf-8")
    except UnicodeEncodeError:
        raise Refused("surrogate")
    return bytes([tag]) + struct.pack(">Q", len(b)) + b


def args_of(v):
    if v is None:
        return ""
    if isinstance(v, str):
        try:
            parsed = json.loads(v)
        except (ValueError, RecursionError):
            return v.strip()
        return canonical(parsed)
    return canonical(v)


def model_authored(m):
    return m.get("role") == "assistant" or m.get("type") == "function_call"


def parts_of(c):
    if c is None:
        return []
    if isinstance(c, str):
        return [("text", c)] if c else []
    if not isinstance(c, list):
        raise Refused("content")
    out = []
    for b in c:
        if isinstance(b, str):
            if b:
                out.append(("text", b))
            continue
        if not isinstance(b, dict):
            raise Refused("block")
        t = str(b.get("type") or "")
        if t in ("tool_use", "tool_result"):
            continue
        if isinstance(b.get("text"), str) and t in ("", "text", "input_text", "output_text"):
            if b["text"]:
                out.append(("text", b["text"]))
            continue
        if not t:
            raise Refused("untyped block")
        out.append((t, canonical(b)))
    return out


def calls_of(m):
    out = []
    if m.get("type") == "function_call":
        name = str(m["name"]) if "name" in m else ""
        if m.get("namespace"):
            name = str(m["namespace"]) + "__" + name
        ident = m.get("call_id") or m.get("id") or ""
        out.append((str(ident), name, args_of(m.get("arguments"))))
    c = m.get("content")
    if isinstance(c, list):
        for b in c:
            if isinstance(b, dict) and b.get("type") == "tool_use":
                out.append((str(b.get("id") or ""), str(b["name"]) if "name" in b else "", args_of(b.get("input"))))
    tc = m.get("tool_calls")
    if tc:
        if isinstance(tc, (int, float)):  # bool included
            raise Refused("not iterable")
        for call in tc:  # a list's elements, a dict's keys, a str's characters
            if not call:
                call = {}
            elif not isinstance(call, dict):
                raise Crash("no attribute get")
            fn = call.get("function")
            if not fn:
                fn = {}
            elif not isinstance(fn, dict):
                raise Crash("no attribute get")
            out.append((str(call.get("id") or ""), str(fn["name"]) if "name" in fn else "", args_of(fn.get("arguments"))))
    return out


def fingerprint(items):
    h = hashlib.sha256(DOMAIN)
    n = 0
    for m in items:
        if not isinstance(m, dict):
            raise Refused("item")
        if not model_authored(m):
            continue
        n += 1
        for t, p in parts_of(m.get("content")):
            h.update(field(0, t))
            h.update(field(1, p))
        for ident, name, args in calls_of(m):
            h.update(field(2, ident))
            h.update(field(3, name))
            h.update(field(4, args))
    return h.hexdigest() if n else ""


# ---- cases ----

def fixed_cases():
    big = 2**64
    return [
        ("empty", []),
        ("no_model_authored", [{"role": "user", "content": "hi"}, {"type": "function_call_output", "output": "x"}]),
        ("chat_text", [{"role": "assistant", "content": "The answer is 4."}]),
        ("chat_empty_text", [{"role": "assistant", "content": ""}]),
        ("chat_null_content", [{"role": "assistant", "content": None}]),
        ("responses_message", [{"type": "message", "role": "assistant", "id": "msg_1",
                                "content": [{"type": "output_text", "text": "ok", "annotations": []}]}]),
        ("untyped_text_block", [{"role": "assistant", "content": [{"text": "a"}, "b", ""]}]),
        ("refusal_block", [{"role": "assistant", "content": [{"type": "refusal", "refusal": "no", "z": 1.5e-5, "a": 1e16}]}]),
        ("image_block", [{"role": "assistant", "content": [{"type": "image", "source": {"data": "\u00e9\u2028\x7f\x01", "n": -0.0}}]}]),
        ("reasoning_excluded", [{"type": "reasoning", "summary": [{"text": "think"}]},
                                {"type": "message", "role": "assistant", "content": "x"}]),
        ("chat_tool_calls", [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"b\": 2, \"a\": 1.0}"}},
            {"id": "call_2", "function": {"name": "mul", "arguments": " not json  "}}]}]),
        ("chat_tool_calls_falsy_entries", [{"role": "assistant", "tool_calls": [None, {}, 0, "", {"function": None}]}]),
        ("chat_tool_calls_dict_empty_key", [{"role": "assistant", "tool_calls": {"": 1}}]),
        ("chat_tool_calls_dict_key_crash", [{"role": "assistant", "tool_calls": {"k": 1}}]),
        ("chat_tool_calls_string_crash", [{"role": "assistant", "tool_calls": "abc"}]),
        ("chat_tool_calls_int_refused", [{"role": "assistant", "tool_calls": 3}]),
        ("chat_tool_calls_true_refused", [{"role": "assistant", "tool_calls": True}]),
        ("chat_function_string_crash", [{"role": "assistant", "tool_calls": [{"id": "x", "function": "f"}]}]),
        ("responses_function_call", [{"type": "function_call", "call_id": "fc_1", "id": "item_1", "name": "search",
                                      "arguments": "{\"q\":\"x\",\"k\":[1,2,{\"z\":null,\"a\":true}]}"}]),
        ("responses_function_call_namespace", [{"type": "function_call", "id": "i", "namespace": "mcp", "name": "go",
                                                "arguments": {"x": 1}}]),
        ("responses_function_call_no_name", [{"type": "function_call", "call_id": "c"}]),
        ("responses_function_call_null_name", [{"type": "function_call", "call_id": "c", "name": None, "arguments": None}]),
        ("nonstring_ids_and_names", [{"type": "function_call", "call_id": 7, "name": 1.5, "namespace": True, "arguments": "[]"}]),
        ("container_name_repr", [{"type": "function_call", "call_id": [1, "a'b"], "name": {"k": "d\"q", "\u00e9": [None, 1e22]},
                                  "arguments": "null"}]),
        ("string_repr_quotes", [{"type": "function_call", "call_id": ["it's", "x\ty\\\u0007\u00ff\u0100\U0001f600\u200b"], "name": "n"}]),
        ("anthropic_tool_use", [{"role": "assistant", "content": [
            {"type": "text", "text": "calling"}, {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"b": [1.0, 2], "a": "s"}}]}]),
        ("anthropic_tool_result_skipped", [{"role": "assistant", "content": [{"type": "tool_result", "content": "r"}]}]),
        ("content_dict_refused", [{"role": "assistant", "content": {"text": "x"}}]),
        ("content_int_block_refused", [{"role": "assistant", "content": [3]}]),
        ("untyped_block_refused", [{"role": "assistant", "content": [{"text": 5}]}]),
        ("numeric_type_block", [{"role": "assistant", "content": [{"type": 5, "v": 1}]}]),
        ("args_float_forms", [{"type": "function_call", "call_id": "c", "name": "f",
                               "arguments": "[1e16, 1e15, 1.5e-05, 1e-07, 0.0001, 123456789012345678, 1E2, -0.0, 5e-324, 1.7976931348623157e308]"}]),
        ("args_nan_inf", [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[NaN, Infinity, -Infinity, 1e400]"}]),
        ("args_int_64bit_edges", [{"type": "function_call", "call_id": "c", "name": "f",
                                   "arguments": "[18446744073709551615, -9223372036854775808]"}]),
        ("args_int_too_big_refused", [{"type": "function_call", "call_id": "c", "name": "f", "arguments": str(big)}]),
        ("args_value_int_too_big_refused", [{"type": "function_call", "call_id": "c", "name": "f", "arguments": [big]}]),
        ("args_duplicate_keys", [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{\"a\":1,\"b\":2,\"a\":3}"}]),
        ("args_strip_python_space", [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "\x1c\u3000 x y \u2029\x1f"}]),
        ("args_escapes", [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "\"\\ud83d\\ude00\\u00e9\\n\\/\""}]),
        ("args_lone_surrogate_refused", [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "\"\\ud800\""}]),
        ("text_lone_surrogate_refused", [{"role": "assistant", "content": "a\ud800"}]),
        ("args_deep_refused", [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[" * 300 + "]" * 300}]),
        ("args_deep_ok", [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[" * 254 + "]" * 254}]),
        ("args_trailing_garbage", [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{} x"}]),
        ("args_leading_zero", [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "01"}]),
        ("merged_transcript", [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a1"},
                               {"role": "tool", "content": "r", "tool_call_id": "t"},
                               {"role": "assistant", "content": "a2", "tool_calls": []}]),
        ("role_not_string", [{"role": ["assistant"], "content": "x"}]),
    ]


def random_item(rng, depth=0):
    texts = ["", "x", "hello world", "\u00e9t\u00e9", "tab\tquote\"", "{\"a\": 1}", " 1.50 ", "[1, 2.0]", "null", "\x1f"]
    kind = rng.randrange(5)
    if kind == 0:
        return {"role": "assistant", "content": rng.choice(texts + [None])}
    if kind == 1:
        blocks = []
        for _ in range(rng.randrange(4)):
            t = rng.choice(["text", "output_text", "", "refusal", "image", "tool_use"])
            b = {"type": t} if t else {}
            if t in ("text", "output_text", "") or rng.random() < 0.3:
                b["text"] = rng.choice(texts)
            if t == "tool_use":
                b.update({"id": "tu%d" % rng.randrange(9), "name": rng.choice(["a", "b"]),
                          "input": rng.choice([{"k": rng.random()}, "[1]", None, 3])})
            if t in ("refusal", "image"):
                b["v"] = rng.choice([rng.random() * 10 ** rng.randrange(-8, 20), rng.randrange(-5, 5), "s", None])
            blocks.append(b)
        return {"role": "assistant", "content": blocks}
    if kind == 2:
        calls = []
        for _ in range(rng.randrange(1, 3)):
            calls.append({"id": "call%d" % rng.randrange(99), "type": "function",
                          "function": {"name": rng.choice(["f", "g"]),
                                       "arguments": rng.choice(texts + ["{\"b\":[1,2],\"a\":{\"y\":1e-9}}"])}})
        return {"role": "assistant", "content": rng.choice(["", "using tools", None]), "tool_calls": calls}
    if kind == 3:
        item = {"type": "function_call", "name": rng.choice(["f", "g", "h"]),
                "arguments": rng.choice(texts + ["{\"x\": 12345678901234567890}"])}
        if rng.random() < 0.7:
            item["call_id"] = "fc%d" % rng.randrange(99)
        if rng.random() < 0.5:
            item["id"] = "it%d" % rng.randrange(99)
        if rng.random() < 0.3:
            item["namespace"] = rng.choice(["ns", ""])
        return item
    return rng.choice([{"role": "user", "content": rng.choice(texts)},
                       {"type": "function_call_output", "call_id": "x", "output": "r"},
                       {"type": "reasoning", "summary": []},
                       {"role": "system", "content": "sys"}])


def main():
    rng = random.Random(SEED)
    cases = fixed_cases()
    for i in range(200):
        cases.append(("random_%03d" % i, [random_item(rng) for _ in range(rng.randrange(1, 5))]))
    out = []
    for name, items in cases:
        text = json.dumps(items, ensure_ascii=True, allow_nan=True)
        assert json.loads(text) == items or name in ("args_nan_inf",), name
        try:
            fp, err = fingerprint(json.loads(text)), ""
        except Refused:
            fp, err = "", "value"
        except Crash:
            fp, err = "", "crash"
        out.append({"name": name, "items": text, "fingerprint": fp, "error": err})
    meta = {
        "script": SCRIPT,
        "seed": SEED,
        "python": platform.python_version(),
        "fingerprint_version": VERSION,
        "reference": "independent implementation of NeMo Gym fingerprint.py assistant_fingerprint "
                     "(FINGERPRINT_VERSION 3) with a reimplemented orjson 3.8 OPT_SORT_KEYS serializer",
    }
    with open(OUT, "w") as f:
        json.dump({"meta": meta, "cases": out}, f, indent=1, ensure_ascii=True)
        f.write("\n")
    print("wrote %s (%d cases)" % (os.path.normpath(OUT), len(out)))


if __name__ == "__main__":
    main()
