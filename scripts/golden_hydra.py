#!/usr/bin/python3
"""Golden results of Hydra overrides where Python and OmegaConf decide.

NeMo RL applies its command line's Hydra overrides to the composed recipe in
struct mode (nemo_rl/utils/config.py: parse_hydra_overrides calls Hydra's
ConfigLoaderImpl._apply_overrides_to_config, Hydra 1.3.2 in NeMo RL's
uv.lock). That function is a few rules on top of OmegaConf:

    key=v    OmegaConf.update(cfg, key, v, merge=True) (struct mode: the
             key, and any key inside a dict v, must exist)
    +key=v   allowed when OmegaConf.select(cfg, key) is None (absent or
             null) or v is a dict or a list; then update(..., force_add=True)
    ++key=v  update(..., merge=True, force_add=True)
    ~key[=v] select(cfg, key) must not be None, and (with v) v == the value,
             Python's ==; then the key is deleted

and its casts are Python's: int(v), float(v); str(v), lower-cased for a bool;
bool(v), with a string only "true"/"false" in any case.

This script applies those rules with Debian's OmegaConf to each case below:
the value each override's text means (after Hydra's grammar) is written as a
Python expression, so that Python itself computes int(3.7), 1 == 1.0, and the
rest. It records the config after the override, or the class of the error.
config's TestHydraGolden parses the same override text with tracegrpo's
grammar, applies it, and compares. Hydra itself is not packaged by Debian,
so its grammar is not run here (config/hydra_test.go's cases follow the
grammar's documentation); what this golden pins is the arithmetic and the
update, delete and struct-mode rules.

Writes config/testdata/golden_hydra.json. Run with /usr/bin/python3:
    /usr/bin/python3 scripts/golden_hydra.py
"""

import json
import math
import os
import platform
import sys

import omegaconf
from omegaconf import OmegaConf, open_dict

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "config", "testdata", "golden_hydra.json")
SEED = None  # deterministic: no randomness


def h_str(v):
    """Hydra's str(): Python's, lower-cased for a bool."""
    return str(v).lower() if isinstance(v, bool) else str(v)


def h_bool(v):
    """Hydra's bool(): a string must be true or false (any case)."""
    if isinstance(v, str):
        if v.lower() in ("true", "false"):
            return v.lower() == "true"
        raise ValueError(f"Cannot cast '{v}' to bool")
    return bool(v)


# (name, base yaml, override text, op, key, python value or None for none).
CASES = [
    # Struct mode: key=v cannot add keys, not even inside a dict value.
    ("change/dict_with_new_nested_key", "key: {x: 1}\n", "key={y: {w: 2}}", "=", "key", "{'y': {'w': 2}}"),
    ("change/dict_with_existing_keys", "key: {x: 1, y: {w: 1, z: 3}}\n", "key={y: {w: 2}}", "=", "key", "{'y': {'w': 2}}"),
    ("change/absent_key", "key: 1\n", "nope=1", "=", "nope", "1"),
    ("change/absent_nested_key", "key: {x: 1}\n", "key.y=1", "=", "key.y", "1"),
    ("change/scalar_over_dict", "key: {x: 1}\n", "key=5", "=", "key", "5"),
    ("change/list_over_list", "key: [1, 2, 3]\n", "key=[4]", "=", "key", "[4]"),
    ("change/list_over_dict", "key: {a: 1}\n", "key=[4]", "=", "key", "[4]"),
    ("change/dict_over_list", "key: [1]\n", "key={a: 1}", "=", "key", "{'a': 1}"),
    ("change/dict_over_scalar", "key: 1\n", "key={a: 1}", "=", "key", "{'a': 1}"),
    ("change/dict_over_null", "key: null\n", "key={a: 1}", "=", "key", "{'a': 1}"),
    # +key=v: over an existing key only with a dict or a list value, or over null.
    ("add/list_over_list", "key: [1, 2]\n", "+key=[4]", "+", "key", "[4]"),
    ("add/list_over_dict", "key: {a: 1}\n", "+key=[4]", "+", "key", "[4]"),
    ("add/dict_over_dict", "key: {a: 1}\n", "+key={b: 2}", "+", "key", "{'b': 2}"),
    ("add/dict_over_scalar", "key: 1\n", "+key={b: 2}", "+", "key", "{'b': 2}"),
    ("add/dict_over_list", "key: [1]\n", "+key={b: 2}", "+", "key", "{'b': 2}"),
    ("force_add/list_over_dict", "key: {a: 1}\n", "++key=[4]", "++", "key", "[4]"),
    ("force_add/dict_over_dict_new_key", "key: {a: 1}\n", "++key={b: {c: 1}}", "++", "key", "{'b': {'c': 1}}"),
    ("add/scalar_over_scalar", "key: 1\n", "+key=5", "+", "key", "5"),
    ("add/scalar_over_null", "key: null\n", "+key=5", "+", "key", "5"),
    ("add/new_nested", "key: {a: 1}\n", "+key.b.c=5", "+", "key.b.c", "5"),
    ("force_add/new_nested", "key: {a: 1}\n", "++other.b.c=5", "++", "other.b.c", "5"),
    ("force_add/over_scalar", "key: 1\n", "++key=5", "++", "key", "5"),
    # ~key[=v]: Python's == decides.
    ("delete/int_as_float", "key: 1\nk2: 2\n", "~key=1.0", "~", "key", "1.0"),
    ("delete/float_as_int", "key: 2.0\nk2: 2\n", "~key=2", "~", "key", "2"),
    ("delete/bool_as_int", "key: true\nk2: 2\n", "~key=1", "~", "key", "1"),
    ("delete/str_not_int", "key: '1'\nk2: 2\n", "~key=1", "~", "key", "1"),
    ("delete/other_value", "key: 1\nk2: 2\n", "~key=2", "~", "key", "2"),
    ("delete/list_equal", "key: [1, 2]\nk2: 2\n", "~key=[1.0, 2]", "~", "key", "[1.0, 2]"),
    ("delete/dict_equal", "key: {a: 1}\nk2: 2\n", "~key={a: 1.0}", "~", "key", "{'a': 1.0}"),
    ("delete/dict_other_order", "key: {a: 1, b: 2}\nk2: 2\n", "~key={b: 2, a: 1}", "~", "key", "{'b': 2, 'a': 1}"),
    ("delete/int_not_inexact_float", "key: 9007199254740993\nk2: 2\n", "~key=9007199254740992.0", "~", "key", "9007199254740992.0"),
    ("delete/nan_never_equal", "key: .nan\nk2: 2\n", "~key=nan", "~", "key", "math.nan"),
    ("delete/null_value", "key: null\nk2: 2\n", "~key", "~", "key", None),
    ("delete/absent", "k2: 2\n", "~key", "~", "key", None),
    ("delete/nested", "key: {a: 1, b: 2}\n", "~key.a", "~", "key.a", None),
    # Casts: Python's int() and float(); Hydra's str() and bool().
    ("cast/int_positive_float", "key: 0\n", "key=int(3.7)", "=", "key", "int(3.7)"),
    ("cast/int_negative_float", "key: 0\n", "key=int(-3.7)", "=", "key", "int(-3.7)"),
    ("cast/int_half", "key: 0\n", "key=int(-0.5)", "=", "key", "int(-0.5)"),
    ("cast/int_bool", "key: 0\n", "key=int(true)", "=", "key", "int(True)"),
    ("cast/int_str", "key: 0\n", "key=int('42')", "=", "key", "int('42')"),
    ("cast/int_str_underscores", "key: 0\n", "key=int('1_000')", "=", "key", "int('1_000')"),
    ("cast/int_str_blanks", "key: 0\n", "key=int(' 7 ')", "=", "key", "int(' 7 ')"),
    ("cast/int_str_sign", "key: 0\n", "key=int('+5')", "=", "key", "int('+5')"),
    ("cast/int_str_float", "key: 0\n", "key=int('3.7')", "=", "key", "int('3.7')"),
    ("cast/int_str_hex", "key: 0\n", "key=int('0x10')", "=", "key", "int('0x10')"),
    ("cast/int_str_double_underscore", "key: 0\n", "key=int('1__0')", "=", "key", "int('1__0')"),
    ("cast/int_huge_float", "key: 0\n", "key=int(1e20)", "=", "key", "int(1e20)"),
    ("cast/int_largest", "key: 0\n", "key=int(9.2233720368547748e18)", "=", "key", "int(9.2233720368547748e18)"),
    ("cast/int_inf", "key: 0\n", "key=int(inf)", "=", "key", "int(math.inf)"),
    ("cast/int_nan", "key: 0\n", "key=int(nan)", "=", "key", "int(math.nan)"),
    ("cast/float_int", "key: 0\n", "key=float(10)", "=", "key", "float(10)"),
    ("cast/float_str", "key: 0\n", "key=float('2.5')", "=", "key", "float('2.5')"),
    ("cast/float_str_underscores", "key: 0\n", "key=float('1_0.5')", "=", "key", "float('1_0.5')"),
    ("cast/float_str_exponent", "key: 0\n", "key=float(' 1e3 ')", "=", "key", "float(' 1e3 ')"),
    ("cast/float_str_infinity", "key: 0\n", "key=float('-Infinity')", "=", "key", "float('-Infinity')"),
    ("cast/float_str_hex", "key: 0\n", "key=float('0x10')", "=", "key", "float('0x10')"),
    ("cast/float_str_hex_float", "key: 0\n", "key=float('0x1p-2')", "=", "key", "float('0x1p-2')"),
    ("cast/float_str_word", "key: 0\n", "key=float('abc')", "=", "key", "float('abc')"),
    ("cast/str_float", "key: 0\n", "key=str(1e-5)", "=", "key", "h_str(1e-5)"),
    ("cast/str_big_float", "key: 0\n", "key=str(1e16)", "=", "key", "h_str(1e16)"),
    ("cast/str_bool", "key: 0\n", "key=str(true)", "=", "key", "h_str(True)"),
    ("cast/str_int", "key: 0\n", "key=str(10)", "=", "key", "h_str(10)"),
    ("cast/bool_str_upper", "key: 0\n", "key=bool('TRUE')", "=", "key", "h_bool('TRUE')"),
    ("cast/bool_str_yes", "key: 0\n", "key=bool('yes')", "=", "key", "h_bool('yes')"),
    ("cast/bool_zero_float", "key: 0\n", "key=bool(0.0)", "=", "key", "h_bool(0.0)"),
    ("cast/bool_two", "key: 0\n", "key=bool(2)", "=", "key", "h_bool(2)"),
    ("cast/int_list", "key: [0]\n", "key=int([1.5, -2.5])", "=", "key", "[int(1.5), int(-2.5)]"),
]


def typed(v):
    """A JSON form that keeps Python's types (int, float, bool, None, str)."""
    if isinstance(v, bool):
        return {"bool": v}
    if isinstance(v, int):
        return {"int": str(v)}
    if isinstance(v, float):
        return {"float": "nan" if math.isnan(v) else repr(v)}
    if v is None:
        return {"null": True}
    if isinstance(v, str):
        return {"str": v}
    if isinstance(v, dict):
        return {"map": [[str(k), typed(x)] for k, x in v.items()]}
    if isinstance(v, (list, tuple)):
        return {"list": [typed(x) for x in v]}
    raise TypeError(f"unexpected {type(v).__name__}: {v!r}")


def apply(cfg, op, key, value, has_value):
    """Hydra 1.3.2's rules for one override (see the module doc)."""
    OmegaConf.set_struct(cfg, True)
    if op == "~":
        current = OmegaConf.select(cfg, key, throw_on_missing=False)
        if current is None:
            raise KeyError(f"could not delete {key}: it does not exist")
        if has_value and value != current:
            raise ValueError(f"could not delete {key}: its value is {current}, not {value}")
        parent, _, last = key.rpartition(".")
        with open_dict(cfg):
            node = OmegaConf.select(cfg, parent) if parent else cfg
            del node[last]
    elif op == "+":
        if OmegaConf.select(cfg, key, throw_on_missing=False) is None or isinstance(value, (dict, list)):
            OmegaConf.update(cfg, key, value, merge=True, force_add=True)
        else:
            raise ValueError(f"could not append to config: an item is already at {key}")
    elif op == "++":
        OmegaConf.update(cfg, key, value, merge=True, force_add=True)
    else:
        OmegaConf.update(cfg, key, value, merge=True)


def main():
    out = []
    env = {"math": math, "h_str": h_str, "h_bool": h_bool}
    for name, base, text, op, key, expr in CASES:
        case = {"name": name, "yaml": base, "override": text}
        try:
            value = eval(expr, env) if expr is not None else None  # the case list's own expressions
            case["value"] = typed(value)
            cfg = OmegaConf.create(base)
            apply(cfg, op, key, value, expr is not None)
            case["want"] = typed(OmegaConf.to_container(cfg, resolve=False))
        except Exception as e:  # the class is the golden
            case["error"] = type(e).__name__
        out.append(case)
    doc = {
        "meta": {
            "script": "scripts/golden_hydra.py",
            "omegaconf": omegaconf.__version__,
            "python": platform.python_version(),
            "seed": SEED,
            "hydra_rules": "Hydra 1.3.2's ConfigLoaderImpl._apply_overrides_to_config, as NeMo RL's uv.lock pins it",
        },
        "cases": out,
    }
    tmp = OUT + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, OUT)
    print(f"golden_hydra: {len(out)} cases (OmegaConf {omegaconf.__version__}, Python {platform.python_version()}) -> {os.path.relpath(OUT)}")


if __name__ == "__main__":
    sys.exit(main())
