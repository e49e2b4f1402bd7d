// Package config loads NeMo RL GRPO recipes as tracegrpo's configuration.
//
// A recipe is YAML with NeMo RL's keys (spec §9, docs/multitrace-grpo.md). Loading
// follows NeMo RL's own loader and OmegaConf:
//
//   - defaults: a top-level `defaults:` key (a string or a list of strings) names
//     parent files, relative to the directory of the file that names them. Parents
//     load recursively; a cycle is an error. The child is deep-merged over its
//     parents: mappings merge key by key, anything else (scalars, lists, null)
//     replaces the parent's value, so `optimizer: null` removes a parent block.
//   - Several files given to Load merge the same way, later over earlier, and all
//     of them over Default(), the NeMo RL defaults of every key tracegrpo uses.
//   - --set a.b=v overrides (Load's sets) apply after every file, in order. The
//     value is typed by the schema: a string field keeps "123" as a string, an
//     integer field refuses "1.5", a nullable field accepts "null"; lists and
//     mappings are written in YAML flow style ("[0.9, 0.95]"); a mapping value
//     deep-merges into the mapping it overrides, as a file would.
//   - ${a.b} interpolation and the ${mul:x,y} resolver are resolved last, over the
//     whole merged tree, so a reference sees overrides (OmegaConf semantics). A
//     value that is exactly one ${a.b} takes the referenced value with its type;
//     one embedded in text is concatenated as a string. Resolvers: mul (product of
//     two numbers; an integer when both are integers).
//
// Every key is then one of three kinds. A key of the typed schema (Config) is
// decoded with its type checked. A key that configures an engine tracegrpo does
// not use (policy.dtensor_cfg other than its activation_checkpointing, vllm_cfg,
// Megatron parallel sizes, data, logger back ends, environment blocks other than
// nemo_gym, ...) is accepted and listed once in Loaded.Ignored. Any other key is an error that names the file, the line,
// the key path and the nearest known key.
//
// Keys that would change the trained objective in a way tracegrpo does not
// implement are never ignored: they are typed here and refused by the capability
// guards of package grpo.
//
// The optimizer and its schedule are normalized by (*Config).Optim into Optimizer
// and Schedule, for both recipe kinds: policy.megatron_cfg.{optimizer,scheduler}
// when policy.megatron_cfg.enabled, else policy.optimizer (torch.optim.AdamW
// kwargs) and policy.scheduler (a list of LinearLR / ConstantLR with milestones).
package config
