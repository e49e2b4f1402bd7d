// Package config loads NeMo RL GRPO recipes as tracegrpo's configuration.
//
// A recipe is YAML with NeMo RL's keys (spec §9, docs/multitrace-grpo.md).
// Loading (LoadSources) follows NeMo RL's loader (nemo_rl/utils/config.py),
// OmegaConf 2.2 and Hydra, in NeMo RL's order:
//
//   - YAML is typed as OmegaConf types it (YAML 1.1 through PyYAML, plus
//     OmegaConf's float rule): yes/on are booleans, 012 is octal, 1e-6 a float
//     (yaml11.go).
//   - defaults: a top-level `defaults:` key (a string or a list of strings)
//     names parent files, relative to the directory of the file that names
//     them. Parents load recursively; a cycle is an error. Files compose with
//     NeMo RL's merge_with_override: OmegaConf's merge (mappings merge key by
//     key, anything else replaces, and a mandatory "???" keeps the value below
//     it), except that a top-level section holding `_override_: true` replaces
//     the section below instead of merging into it. Several files merge the
//     same way, later over earlier.
//   - Hydra overrides (Sources.Overrides: key=v, +key=v, ++key=v, ~key, with
//     Hydra's value grammar; hydra.go) apply to the composed recipe, as
//     examples/run_grpo.py applies its command line's: in struct mode.
//   - The recipe then goes over Default(), NeMo RL's defaults of every key
//     tracegrpo reads, and --set a.b=v (Sources.Sets) apply, typed by the
//     schema: a string field keeps "123" as a string, an integer field
//     refuses "1.5"; lists and mappings are flow YAML, a mapping merges.
//   - Interpolations are resolved as OmegaConf resolves them (grammar.go,
//     interp.go; config/testdata/golden_omegaconf.json is OmegaConf itself on
//     each case): ${a.b}, ${a[0]}, relative ${.x} and ${..x}, nested
//     ${a.${k}}, inside strings (Python's str() of each value), escapes, and
//     the resolvers NeMo RL registers (add, mul, div, max: Python's a+b, a*b,
//     a/b, max(a, b)) and OmegaConf's oc.env, oc.select and oc.decode. They
//     are resolved when the decoder reads a key, as OmegaConf resolves on
//     access: keys tracegrpo ignores are never resolved. A "???" still there
//     in a key tracegrpo reads is an error naming the file and line.
//
// Every key is then in exactly one class (keys.go, one rule per key or
// subtree, the most specific winning): Used (decoded into Config, its type
// checked), Ignored (an engine or service tracegrpo does not run, or a key
// NeMo RL never reads or overwrites before use; listed once in
// Loaded.Ignored), or Refused (it changes the math or the model and
// tracegrpo does not do it; kept with its value, and refused by
// trainer.Check unless the value is Neutral, such as enabled: false; a
// MoEOnly key only when the model has experts, see Experts). Typed refused
// keys are refused by the capability guards of package grpo. A key in no
// class follows ForwardCompatible: an error naming the file, line, key and
// nearest known key where it may change the math, a warning elsewhere (the
// first 20 by name, then a count). A literal dotted key ("grpo.seed": 1) is
// refused: OmegaConf keeps it as one key, which NeMo RL never reads.
//
// gen_nemorl_keys.tsv lists every key of NeMo RL's GRPO schema and recipes
// at a recorded commit, with whether NeMo RL's Python reads it
// (scripts/nemorl_schema.py reads that Python with ast); it is embedded
// (keys_nemorl.go): a key NeMo RL never reads is Ignored whatever its rule,
// a KnownOnly section covers only NeMo RL's keys there, and the nearest-key
// search (suggest.go: an index by length, at most 20 searches a load) knows
// them all. The tests require each key in a class.
//
// Hostile input is bounded: aliases by maxTreeNodes, every resolved value
// by a byte budget (maxValueBytes, maxResolvedBytes), a failed resolution is
// kept on its node and reported once, and values quoted in messages are cut
// (internal/quote).
//
// The optimizer and its schedule are normalized by (*Config).Optim into Optimizer
// and Schedule, for both recipe kinds: policy.megatron_cfg.{optimizer,scheduler}
// when policy.megatron_cfg.enabled, else policy.optimizer (torch.optim.AdamW
// kwargs) and policy.scheduler (a list of LinearLR / ConstantLR with milestones).
// A capability they lack is a *Refusal naming the key.
package config
