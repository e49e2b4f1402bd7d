#!/usr/bin/python3
"""Golden values of OmegaConf's YAML typing, interpolation grammar and resolvers.

NeMo RL loads recipes with OmegaConf, registers four resolvers (add, mul, div,
max: Python's a + b, a * b, a / b, max(a, b)), and resolves the whole config
with OmegaConf.to_container(resolve=True). This script runs OmegaConf itself
(Debian's python3-omegaconf) on each case below and records the resolved
config, typed, or the class of the error OmegaConf raises. config's
TestOmegaConfGoldens loads the same YAML with tracegrpo's loader and compares.

The resolvers are registered here from their definition in NeMo RL's
nemo_rl/utils/config.py (register_omegaconf_resolvers: each is one Python
operator); nothing of NeMo RL is imported.

Writes config/testdata/golden_omegaconf.json. Run with /usr/bin/python3:
    /usr/bin/python3 scripts/golden_omegaconf.py
"""

import json
import math
import os
import platform
import sys
import warnings

import omegaconf
from omegaconf import OmegaConf

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "config", "testdata", "golden_omegaconf.json")
SEED = None  # deterministic: no randomness

# The environment every case sees (and nothing else named TG_*).
ENV = {"TG_HOME": "/home/tg", "TG_EMPTY": "", "TG_NUM": "42"}

# (name, yaml). Each case's YAML is a whole config; the golden is the config
# resolved, or the error.
CASES = [
    # YAML 1.1 scalar typing by OmegaConf's loader (PyYAML SafeLoader + its float rule).
    ("yaml/bools", "a: yes\nb: No\nc: on\nd: OFF\ne: true\nf: False\ng: y\nh: n\n"),
    ("yaml/ints", "a: 012\nb: 0x1F\nc: 0b101\nd: 1_000\ne: 1:20\nf: +7\ng: -0\nh: 09\ni: 0o17\n"),
    ("yaml/floats", "a: 1e-6\nb: 1.0e-6\nc: 5.0e-7\nd: .5\ne: -.5\nf: 1.\ng: .inf\nh: -.Inf\ni: 1e6\nj: 1_0.5\nk: 6.5e+3\nl: 2.5E3\nm: 1:30.5\n"),
    ("yaml/nulls_and_strings", "a: ~\nb: null\nc:\nd: NULL\ne: 2001-12-14\nf: '012'\ng: \"yes\"\nh: !!str 12\ni: Null\n"),
    # Absolute and relative node interpolation.
    ("interp/absolute", "a: {b: 3}\nc: ${a.b}\n"),
    ("interp/relative_sibling", "g:\n  temperature: 0.7\n  val_temperature: ${.temperature}\n  top_k: null\n  val_top_k: ${.top_k}\n"),
    ("interp/relative_parent", "x: 2\na:\n  x: 1\n  b:\n    y: ${..x}\n    z: ${...x}\n"),
    ("interp/relative_in_list", "l:\n- 10\n- ${.0}\n- '${.0}'\n"),
    ("interp/relative_too_far", "a:\n  b: ${...x}\n"),
    ("interp/list_index", "l: [a, b, c]\ni: ${l.1}\nj: ${l[2]}\n"),
    ("interp/bracket_keys", "a: {b: {c: 4}}\nd: ${a[b].c}\ne: ${[a].b[c]}\n"),
    ("interp/nested_key", "k: b\na: {b: 5, c: 6}\nr: ${a.${k}}\nw: ${a.${oc.env:TG_NOPE,c}}\n"),
    ("interp/whitespace", "a: 1\nb: ${ a }\n"),
    ("interp/container", "a: {x: 1, y: [2, 3]}\nb: ${a}\nc: ${a.y}\n"),
    ("interp/chain", "a: ${b}\nb: ${c}\nc: 7\n"),
    ("interp/missing_key", "a: ${nope.x}\n"),
    ("interp/cycle", "a: ${b}\nb: ${a}\n"),
    ("interp/unterminated", "a: ${b\nb: 1\n"),
    ("interp/type_kept", "i: 3\nf: 2.5\nt: true\nn: null\ns: '007'\nci: ${i}\ncf: ${f}\nct: ${t}\ncn: ${n}\ncs: ${s}\n"),
    # Interpolation inside strings: Python's str() of each value.
    ("string/concat", "lr: 5.0e-6\nbig: 1.0e16\nmid: 1.0e15\nsmall: 0.0001\ntiny: 0.00001\nn: 3\nt: true\nz: null\nf: 2.0\n"
     "s: 'lr=${lr} big=${big} mid=${mid} small=${small} tiny=${tiny} n=${n} t=${t} z=${z} f=${f}'\n"),
    ("string/path", "policy: {model_name: Qwen/Qwen2.5-1.5B}\ndir: results/${policy.model_name}/ckpt\n"),
    ("string/escapes", "a: 1\nb: '\\${a}'\nc: '\\\\${a}'\nd: 'x\\y${a}'\ne: 'trailing\\\\'\nf: '$a ${a}$'\ng: '\\\\\\${a}'\n"),
    ("string/container_in_string", "a: {x: 1}\nb: 'v=${a}'\n"),
    # NeMo RL's resolvers.
    ("resolver/add", "a: 2\nb: 0.5\ni: ${add:${a},3}\nf: ${add:${a},${b}}\ns: ${add:ab,cd}\nt: ${add:true,1}\nq: ${add:'x','y'}\n"),
    ("resolver/mul", "p: 32\ng: 16\ngbs: ${mul:${p},${g}}\nf: ${mul:1.5,2}\nr: ${mul:ab,3}\nr2: ${mul:2,xy}\nw: '${mul: 4 , 5 }'\nnested: ${mul:${mul:2,3},${add:1,1}}\n"),
    ("resolver/div", "a: ${div:7,2}\nb: ${div:4,2}\nc: ${div:1,3}\nd: ${div:1.5,0.5}\n"),
    ("resolver/div_by_zero", "a: ${div:1,0}\n"),
    ("resolver/max", "a: ${max:1,2}\nb: ${max:2.5,1}\nc: ${max:1,1.0}\nd: ${max:abc,abd}\ne: ${max:-3,-7}\nf: ${max:true,0}\n"),
    ("resolver/max_mixed", "a: ${max:1,abc}\n"),
    # max keeps the first of equal values (Python's max), whatever their type.
    ("resolver/max_ties", "a: ${max:true,1}\nb: ${max:1,true}\nc: ${max:1,1.0}\nd: ${max:1.0,1}\ne: ${max:false,0}\nf: ${max:0,false}\ng: ${max:0.0,-0.0}\nh: ${max:-0.0,0.0}\n"),
    # int against float is compared exactly (2^53 + 1 > 2^53 as a float).
    ("resolver/max_exact", "a: ${max:9007199254740992.0,9007199254740993}\nb: ${max:9007199254740993,9007199254740992.0}\nc: ${max:9223372036854775807,9.223372036854775807e18}\n"),
    # Python's ints do not overflow; tracegrpo refuses what 64 bits cannot hold.
    ("resolver/add_overflow", "a: ${add:9223372036854775807,1}\n"),
    ("resolver/add_overflow_negative", "a: ${add:-9223372036854775808,-1}\n"),
    ("resolver/mul_overflow", "a: ${mul:4294967296,4294967296}\n"),
    ("resolver/mul_min_by_minus_one", "a: ${mul:-9223372036854775808,-1}\n"),
    ("resolver/add_at_the_limit", "a: ${add:9223372036854775806,1}\nb: ${add:-9223372036854775807,-1}\n"),
    ("resolver/add_str_int", "a: ${add:abc,1}\n"),
    ("resolver/add_three_args", "a: ${add:1,2,3}\n"),
    ("resolver/arg_typing", "a: ${add:1_000,1}\nb: ${add:1e3,1}\nc: ${add:-2,+3}\nd: ${mul:inf,1}\ne: ${add:.5,1}\nf: ${add:foo-bar,_x}\ng: ${add:a/b,.c}\n"),
    ("resolver/arg_strings", "a: ${add:a b,' c'}\nb: ${add:'',x}\nc: ${add:\"q\\\"q\",x}\nd: ${add:a\\,b,c}\n"),
    ("resolver/unknown", "a: ${nosuch:1}\n"),
    ("resolver/in_string", "n: 4\ns: 'n2=${mul:${n},2}, half=${div:${n},8}'\n"),
    # OmegaConf's built-in resolvers.
    ("oc.env/set", "h: ${oc.env:TG_HOME}\nn: ${oc.env:TG_NUM}\ne: ${oc.env:TG_EMPTY}\np: '${oc.env:TG_HOME}/cache'\n"),
    ("oc.env/default", "a: ${oc.env:TG_NOPE,5}\nb: ${oc.env:TG_NOPE,null}\nc: ${oc.env:TG_NOPE,'x y'}\nd: ${oc.env:TG_NOPE,1.5}\ne: ${oc.env:TG_HOME,zzz}\nf: ${oc.env:TG_NOPE,true}\n"),
    ("oc.env/missing", "a: ${oc.env:TG_NOPE}\n"),
    ("oc.select/present", "a: {b: 3}\nx: ${oc.select:a.b,9}\ny: ${oc.select:a.b}\n"),
    ("oc.select/absent", "a: {b: 3}\nx: ${oc.select:a.c,9}\ny: ${oc.select:a.c}\nz: ${oc.select:nope.deep,'d'}\nl: ${oc.select:nope,[1,2]}\n"),
    ("oc.select/relative", "g:\n  t: 0.5\n  v: ${oc.select:.t,1.0}\n  w: ${oc.select:.u,1.0}\n"),
    ("oc.select/missing_value", "a: ???\nx: ${oc.select:a,4}\ny: ${oc.select:a}\n"),
    ("oc.decode", "a: \"${oc.decode:'[1, 2.5, x]'}\"\nb: \"${oc.decode:'{k: 3}'}\"\nc: ${oc.decode:'123'}\nd: ${oc.decode:null}\n"),
    # Mandatory values.
    ("missing/interpolated", "a: ???\nb: ${a}\n"),
    ("missing/plain", "a: ???\nb: 1\n"),
    # A dotted key stays one key of that name; ${grpo.max_num_steps} is the nested one.
    ("yaml/dotted_key", "\"grpo.max_num_steps\": 3\ngrpo: {max_num_steps: 5}\nx: ${grpo.max_num_steps}\n"),
]

# (name, base yaml, over yaml): OmegaConf.merge(base, over), unresolved.
MERGES = [
    ("merge/missing_keeps_base", "a: 1\nb: {c: 2}\n", "a: ???\nb:\n  c: ???\n"),
    ("merge/fills_missing", "a: ???\n", "a: 3\n"),
    ("merge/null_replaces_mapping", "a: {b: 1}\n", "a: null\n"),
    ("merge/mapping_over_null", "a: null\n", "a: {b: 1}\n"),
    ("merge/list_replaces", "a: [1, 2, 3]\n", "a: [4]\n"),
    ("merge/scalar_over_mapping", "a: {b: 1}\n", "a: 5\n"),
    ("merge/deep", "a: {b: {c: 1, d: 2}, e: 3}\n", "a: {b: {c: 9}, f: 4}\n"),
    ("merge/interpolation_replaces", "a: 1\nb: 2\n", "b: ${a}\n"),
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


def register():
    # nemo_rl/utils/config.py: register_omegaconf_resolvers.
    OmegaConf.register_new_resolver("add", lambda a, b: a + b)
    OmegaConf.register_new_resolver("mul", lambda a, b: a * b)
    OmegaConf.register_new_resolver("div", lambda a, b: a / b)
    OmegaConf.register_new_resolver("max", lambda a, b: max(a, b))


def main():
    for k in list(os.environ):
        if k.startswith("TG_"):
            del os.environ[k]
    os.environ.update(ENV)
    register()
    warnings.simplefilter("ignore")
    out = []
    for name, text in CASES:
        case = {"name": name, "yaml": text}
        try:
            cfg = OmegaConf.create(text)
            case["want"] = typed(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False))
        except Exception as e:  # the class is the golden
            case["error"] = type(e).__name__
        out.append(case)
    for name, base, over in MERGES:
        case = {"name": name, "yaml": base, "over": over}
        try:
            cfg = OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(over))
            case["want"] = typed(OmegaConf.to_container(cfg, resolve=False))
        except Exception as e:
            case["error"] = type(e).__name__
        out.append(case)
    doc = {
        "meta": {
            "script": "scripts/golden_omegaconf.py",
            "omegaconf": omegaconf.__version__,
            "python": platform.python_version(),
            "seed": SEED,
            "env": ENV,
            "resolvers": "add, mul, div, max as in NeMo RL's nemo_rl/utils/config.py",
        },
        "cases": out,
    }
    tmp = OUT + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, OUT)
    print(f"golden_omegaconf: {len(out)} cases (OmegaConf {omegaconf.__version__}) -> {os.path.relpath(OUT)}")


if __name__ == "__main__":
    sys.exit(main())
