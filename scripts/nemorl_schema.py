#!/usr/bin/python3
"""NeMo RL's GRPO configuration keys, read from NeMo RL's own source and recipes.

NeMo RL declares its configuration as Python classes: TypedDicts (PolicyConfig,
ClippedPGLossConfig, ...) and pydantic models (MasterConfig, GRPOConfig, ...). This
script reads them with Python's `ast` module (nothing of NeMo RL is imported or
run), walks the GRPO MasterConfig of nemo_rl/algorithms/grpo.py field by field,
and adds every key path that NeMo RL's GRPO recipes write. The recipes are the
GRPO configs of the repository: every YAML file (outside .github/) whose name
contains "grpo", or that has a grpo: block of its own or through its defaults:
chain.

It also reads how NeMo RL's Python uses each key (READS, below): whether any
of it reads the key's name, and which modules write it. A key that nothing
reads cannot change what NeMo RL trains, so tracegrpo ignores it, with that
reason (config's keys.go reads this column).

It writes config/gen_nemorl_keys.tsv, one key path per line (list indices
dropped), with where NeMo RL declares it and its declared type, whether its
Python reads it, where it writes it, and the upstream commit in the header.
config's tests check that every key is in exactly one of tracegrpo's
classes (used, ignored, refused).

READS. The Python of nemo_rl/ and examples/ is parsed with `ast` (never
imported or run). A key's last segment NAME counts as read when NAME appears
as a whole string constant (cfg["NAME"], cfg.get("NAME"), "NAME" in cfg, a
list of names looped over; also a segment of a dotted constant such as
"grpo.NAME"), or as an attribute read (config.grpo.NAME, for the pydantic
models); declarations (the TypedDict and BaseModel fields) do not count. A
key also counts as read, "via" its section, when that section is consumed
whole: splatted (**cfg["kwargs"]), iterated (.items(), .keys(), .values(),
for ... in), or handed to dict(); the section is the last name of the
expression (a subscript's constant, an attribute, or what a local variable
was assigned from). Every other key is "no": nothing reads it. The rule errs
towards "read": a name read anywhere counts for every key of that name.
Writes are stores: cfg["NAME"] = ... (the modules are listed).

With --recipes-out DIR it also copies the GRPO recipes themselves (each at its
path in the repository, so that defaults: chains resolve) into DIR, with
DIR/MANIFEST.tsv naming the commit, each file and its sha256. config's and
trainer's tests load every one of them (make schema refreshes both).

    /usr/bin/python3 scripts/nemorl_schema.py [--repo GITDIR] [--rev REV] [--out FILE] [--recipes-out DIR]

GITDIR is a clone's git directory (default: the mirror at
/work/.mirror/NVIDIA-NeMo+RL/repo; `fetch github:NVIDIA-NeMo/RL` brings one).
Only Python's standard library and PyYAML (Debian's python3-yaml) are used.
"""

import argparse
import ast
import hashlib
import os
import shutil
import subprocess
import sys
from collections import defaultdict

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_REPO = "/work/.mirror/NVIDIA-NeMo+RL/repo"
DEFAULT_OUT = os.path.join(HERE, "..", "config", "gen_nemorl_keys.tsv")
ROOT_MODULE = "nemo_rl/algorithms/grpo.py"
ROOT_CLASS = "MasterConfig"
CONFIG_BASES = {"TypedDict", "BaseModel"}
MAX_DEPTH = 12


def git(repo, *args):
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True).stdout


class Source:
    """The files of one revision of a git repository."""

    def __init__(self, repo, rev):
        self.repo = repo
        self.commit = git(repo, "rev-parse", rev + "^{commit}").decode().strip()
        self.date = git(repo, "log", "-1", "--format=%cI", self.commit).decode().strip()
        self.paths = git(repo, "ls-tree", "-r", "--name-only", self.commit).decode().splitlines()
        self._cache = {}

    def read(self, path):
        if path not in self._cache:
            try:
                self._cache[path] = git(self.repo, "show", f"{self.commit}:{path}")
            except subprocess.CalledProcessError:
                self._cache[path] = None
        return self._cache[path]


class Module:
    def __init__(self, path, tree):
        self.path = path
        self.classes = {}
        self.imports = {}  # local name -> (module path, name)
        pkg = os.path.dirname(path).split("/")  # the package of this module (also for an __init__.py)
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level:
                    base = pkg[: len(pkg) - (node.level - 1)]
                    mod = ".".join(base + ([mod] if mod else []))
                for a in node.names:
                    self.imports[a.asname or a.name] = (mod, a.name)


class Schema:
    def __init__(self, src):
        self.src = src
        self.modules = {}
        for p in src.paths:
            if p.startswith("nemo_rl/") and p.endswith(".py"):
                data = src.read(p)
                try:
                    tree = ast.parse(data)
                except SyntaxError as e:
                    sys.exit(f"nemorl_schema: {p}: {e}")
                self.modules[p] = Module(p, tree)

    def module_of(self, dotted):
        base = dotted.replace(".", "/")
        for cand in (base + ".py", base + "/__init__.py"):
            if cand in self.modules:
                return self.modules[cand]
        return None

    def lookup(self, mod, name, seen=None):
        """The (module, ClassDef) that name means in mod, following imports."""
        seen = seen or set()
        if (mod.path, name) in seen:
            return None
        seen.add((mod.path, name))
        if name in mod.classes:
            return mod, mod.classes[name]
        if name in mod.imports:
            target, orig = mod.imports[name]
            m = self.module_of(target)
            if m is not None:
                return self.lookup(m, orig, seen)
        return None

    def is_config(self, mod, cls, depth=0):
        if depth > MAX_DEPTH:
            return False
        for b in cls.bases:
            name = b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else None
            if name in CONFIG_BASES:
                return True
            if name:
                found = self.lookup(mod, name)
                if found and self.is_config(*found, depth + 1):
                    return True
        return False

    def fields(self, mod, cls, depth=0):
        """(name, annotation, module) of cls and its config bases, bases first."""
        out = []
        if depth > MAX_DEPTH:
            return out
        for b in cls.bases:
            name = b.id if isinstance(b, ast.Name) else None
            if name and name not in CONFIG_BASES:
                found = self.lookup(mod, name)
                if found:
                    out += self.fields(*found, depth + 1)
        for st in cls.body:
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                n = st.target.id
                if n.startswith("model_config") or type_name(st.annotation).startswith("ClassVar"):
                    continue
                out.append((n, st.annotation, mod))
        return out


def type_name(a):
    return ast.unparse(a) if a is not None else "Any"


SCALARS = {"int": "int", "float": "float", "str": "str", "bool": "bool", "None": "null", "Any": "any", "object": "any", "Path": "str"}


def strip(a):
    """Drops NotRequired/Required/Annotated/Optional wrappers; returns the alternatives of a union."""
    if isinstance(a, ast.Constant) and isinstance(a.value, str):
        try:
            a = ast.parse(a.value, mode="eval").body
        except SyntaxError:
            return [a]
    if isinstance(a, ast.BinOp) and isinstance(a.op, ast.BitOr):
        return strip(a.left) + strip(a.right)
    if isinstance(a, ast.Subscript):
        head = type_name(a.value).split(".")[-1]
        sl = a.slice
        if head in ("NotRequired", "Required", "ReadOnly"):
            return strip(sl)
        if head == "Annotated":
            return strip(sl.elts[0] if isinstance(sl, ast.Tuple) else sl)
        if head == "Optional":
            return strip(sl) + [ast.Constant(None)]
        if head == "Union":
            out = []
            for e in (sl.elts if isinstance(sl, ast.Tuple) else [sl]):
                out += strip(e)
            return out
    return [a]


class Walker:
    def __init__(self, schema):
        self.s = schema
        self.keys = {}  # path -> (source, types set)

    def add(self, path, source, typ):
        src, types = self.keys.setdefault(path, (source, set()))
        types.add(typ)

    def walk_class(self, mod, cls, path, depth):
        for name, ann, fmod in self.s.fields(mod, cls):
            p = f"{path}.{name}" if path else name
            self.walk_type(fmod, ann, p, f"{fmod.path}:{cls.name}", depth + 1)

    def walk_type(self, mod, ann, path, source, depth):
        if depth > MAX_DEPTH:
            return
        for alt in strip(ann):
            self.walk_alt(mod, alt, path, source, depth)

    def walk_alt(self, mod, a, path, source, depth):
        if isinstance(a, ast.Constant):
            self.add(path, source, "null" if a.value is None else repr(a.value))
            return
        if isinstance(a, ast.Subscript):
            head = type_name(a.value).split(".")[-1]
            if head == "Literal":
                self.add(path, source, type_name(a))
                return
            if head in ("list", "List", "Sequence", "tuple", "Tuple", "set"):
                self.add(path, source, "list")
                el = a.slice.elts[0] if isinstance(a.slice, ast.Tuple) else a.slice
                # Elements of a list of mappings share the list's key path.
                self.walk_type(mod, el, path, source, depth + 1)
                return
            if head in ("dict", "Dict", "Mapping"):
                self.add(path, source, "mapping(any key)")
                return
            self.add(path, source, type_name(a))
            return
        name = a.id if isinstance(a, ast.Name) else a.attr if isinstance(a, ast.Attribute) else None
        if name in SCALARS:
            self.add(path, source, SCALARS[name])
            return
        if name:
            found = self.s.lookup(mod, name)
            if found and self.s.is_config(*found):
                self.add(path, source, "mapping")
                self.walk_class(found[0], found[1], path, depth)
                return
        self.add(path, source, type_name(a))


READ_ROOTS = ("nemo_rl/", "examples/")
WHOLE_METHODS = {"items", "keys", "values"}
def section_of(e, aliases):
    """The section an expression names: the last constant subscript, .get() key or attribute."""
    if isinstance(e, ast.Subscript):
        sl = e.slice
        if isinstance(sl, ast.Constant) and isinstance(sl.value, str):
            return sl.value
        return None
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr in ("get", "pop", "setdefault"):
        if e.args and isinstance(e.args[0], ast.Constant) and isinstance(e.args[0].value, str):
            return e.args[0].value
        return None
    if isinstance(e, ast.Attribute):
        return e.attr
    if isinstance(e, ast.Name):
        return aliases.get(e.id)
    if isinstance(e, ast.BoolOp):  # cfg.get("x") or {}
        return section_of(e.values[0], aliases)
    return None


class ReadScan:
    """How NeMo RL's Python uses configuration names (see READS in the module doc)."""

    def __init__(self):
        self.names = set()  # names read
        self.whole = set()  # sections consumed whole
        self.writes = defaultdict(set)  # name -> modules that store it

    def scan(self, path, tree):
        decl = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for st in node.body:
                    if isinstance(st, ast.AnnAssign):
                        decl.add(id(st.target))
        for fn in [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            aliases = {}
            body = fn.body
            for node in self.own_nodes(body):
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    sec = section_of(node.value, aliases)
                    if sec:
                        aliases[node.targets[0].id] = sec
            for node in self.own_nodes(body):
                self.visit(path, node, aliases, decl)

    @staticmethod
    def own_nodes(body):
        """The nodes of a body, not descending into nested functions or classes."""
        stack = list(body)
        while stack:
            n = stack.pop()
            yield n
            for c in ast.iter_child_nodes(n):
                if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                    stack.append(c)

    def visit(self, path, node, aliases, decl):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            v = node.value
            self.names.add(v)
            if "." in v and all(p.isidentifier() for p in v.split(".")):
                self.names.update(v.split("."))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and id(node) not in decl:
            self.names.add(node.attr)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            sl = node.slice
            if isinstance(sl, ast.Constant) and isinstance(sl.value, str):
                self.writes[sl.value].add(path)
        if isinstance(node, ast.keyword) and node.arg is None:
            self.consume(node.value, aliases)
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if k is None:
                    self.consume(v, aliases)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WHOLE_METHODS and not node.args:
            self.consume(node.func.value, aliases)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and len(node.args) == 1:
            self.consume(node.args[0], aliases)
        elif isinstance(node, (ast.For, ast.comprehension)):
            self.consume(node.iter, aliases)

    def consume(self, e, aliases):
        sec = section_of(e, aliases)
        if sec:
            self.whole.add(sec)


def read_scan(src):
    rs = ReadScan()
    for p in src.paths:
        if p.startswith(READ_ROOTS) and p.endswith(".py"):
            try:
                tree = ast.parse(src.read(p))
            except SyntaxError as e:
                sys.exit(f"nemorl_schema: {p}: {e}")
            rs.scan(p, tree)
    return rs


def reads_of(rs, key):
    """yes, via SECTION, or no (see READS)."""
    segs = key.split(".")
    if segs[-1] in rs.names:
        return "yes"
    for s in reversed(segs[:-1]):
        if s in rs.whole:
            return f"via {s}"
    return "no"


def grpo_configs(src):
    """The GRPO recipes (see the module doc), each with its defaults chain."""
    docs = {}

    def load(p):
        if p not in docs:
            data = src.read(p)
            try:
                d = yaml.safe_load(data) if data is not None else None
            except yaml.YAMLError:
                d = None
            docs[p] = d if isinstance(d, dict) else None
        return docs[p]

    def chain(p, seen):
        d = load(p)
        if d is None or p in seen:
            return []
        out = []
        ds = d.get("defaults")
        for parent in [ds] if isinstance(ds, str) else ds if isinstance(ds, list) else []:
            if isinstance(parent, str):
                q = parent if parent.startswith("/") else os.path.normpath(os.path.join(os.path.dirname(p), parent))
                out += chain(q, seen | {p})
        return out + [p]

    recipes = []
    for p in src.paths:
        if not p.endswith((".yaml", ".yml")) or p.startswith(".github/"):
            continue
        d = load(p)
        if d is None:
            continue
        ch = chain(p, frozenset())
        if "grpo" in os.path.basename(p) or any("grpo" in (load(q) or {}) for q in ch):
            recipes.append((p, ch))
    return recipes, load


def recipe_keys(d, path, out):
    if isinstance(d, dict):
        for k, v in d.items():
            if path == "" and k == "defaults":
                continue
            if k == "_override_":
                continue
            p = f"{path}.{k}" if path else str(k)
            out.add(p)
            recipe_keys(v, p, out)
    elif isinstance(d, list):
        for e in d:
            recipe_keys(e, path, out)


def write_recipes(src, recipes, files, out):
    """Copies the GRPO recipes (and their parents) into out, replacing it."""
    tmp = out + ".tmp"
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    grpo = {p for p, _ in recipes}
    lines = []
    for p in files:
        data = src.read(p)
        dst = os.path.join(tmp, p)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "wb") as f:
            f.write(data)
        lines.append(f"{p}\t{'grpo' if p in grpo else 'parent'}\t{hashlib.sha256(data).hexdigest()}\n")
    with open(os.path.join(tmp, "MANIFEST.tsv"), "w") as f:
        f.write("# NeMo RL's GRPO configs, copied by scripts/nemorl_schema.py (make schema); do not edit.\n")
        f.write(f"# upstream: NVIDIA-NeMo/RL {src.commit} ({src.date})\n")
        f.write("# GRPO config: every YAML file outside .github/ whose name contains \"grpo\", or with a grpo: block of its own or from its defaults: chain\n")
        f.write("# columns: path in the repository, grpo (a GRPO config) or parent (only inherited), sha256\n")
        f.writelines(lines)
    if os.path.exists(out):
        shutil.rmtree(out)
    os.replace(tmp, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", default=DEFAULT_REPO)
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--recipes-out", default=None)
    args = ap.parse_args()

    src = Source(args.repo, args.rev)
    schema = Schema(src)
    root = schema.modules.get(ROOT_MODULE)
    if root is None or ROOT_CLASS not in root.classes:
        sys.exit(f"nemorl_schema: {ROOT_MODULE} has no {ROOT_CLASS} at {src.commit}")
    w = Walker(schema)
    w.walk_class(root, root.classes[ROOT_CLASS], "", 0)

    recipes, load = grpo_configs(src)
    used_by = defaultdict(int)
    files = sorted({q for _, ch in recipes for q in ch})
    for q in files:
        ks = set()
        recipe_keys(load(q), "", ks)
        for k in ks:
            used_by[k] += 1

    rs = read_scan(src)
    rows = []
    for k in sorted(set(w.keys) | set(used_by)):
        if k in w.keys:
            source, types = w.keys[k]
            typ = " | ".join(sorted(types))
        else:
            source, typ = "recipes", ""
        writes = ",".join(sorted(rs.writes.get(k.split(".")[-1], ()))) or "-"
        rows.append((k, source, typ, used_by.get(k, 0), reads_of(rs, k), writes))

    out = os.path.abspath(args.out)
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write("# gen_nemorl_keys.tsv: generated by scripts/nemorl_schema.py (make schema); do not edit.\n")
        f.write(f"# upstream: NVIDIA-NeMo/RL {src.commit} ({src.date})\n")
        f.write(f"# root: {ROOT_MODULE}:{ROOT_CLASS}; recipes: {len(recipes)} GRPO configs ({len(files)} files with their defaults chains)\n")
        f.write("# columns: key path (list indices dropped), where NeMo RL declares it (or \"recipes\"), declared type, GRPO recipe files that write it,\n")
        f.write("#   whether NeMo RL's Python reads it (yes; via SECTION: the section is consumed whole; no: nothing reads it), the modules that store it (- for none)\n")
        for k, source, typ, n, reads, writes in rows:
            f.write(f"{k}\t{source}\t{typ}\t{n}\t{reads}\t{writes}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)
    if args.recipes_out:
        write_recipes(src, recipes, files, os.path.abspath(args.recipes_out))
    never = sum(1 for r in rows if r[4] == "no")
    print(f"nemorl_schema: {len(rows)} keys ({len(w.keys)} declared, {len(used_by)} in {len(files)} recipe files, {never} never read) from {src.commit[:12]} -> {os.path.relpath(out)}")


if __name__ == "__main__":
    main()
