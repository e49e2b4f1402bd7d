// Package checkpoint saves and restores everything a run needs to continue
// bit for bit: model weights, Adam moments, trainer state, every RNG state and
// the rollout-source cursor. It deals in names, shapes and bytes only and
// imports no model or kernel code: the caller hands over named tensors, the
// raw HF config.json bytes, and its own state as opaque JSON and bytes.
//
// # Layout
//
// A run directory holds one directory per saved step:
//
//	<dir>/step_<N>/model.safetensors      HF weights (with config.json, any HF tool loads the directory)
//	<dir>/step_<N>/config.json            the HF model config, bytes as given
//	<dir>/step_<N>/optimizer.safetensors  Adam moments, fp32 (optimizer.safetensors.zst when compressed;
//	                                      none when trainer_state.json says no_optimizer)
//	<dir>/step_<N>/trainer_state.json     TrainerState (format_version 1)
//	<dir>/step_<N>/manifest.json          Manifest: size and sha256 of each file above
//	<dir>/step_<N>/DONE                   "sha256:<hex of manifest.json>\n", written last
//
// N is the decimal step without leading zeros. Both safetensors files carry
// "tracegrpo_format" ("checkpoint-model", "checkpoint-optimizer"),
// "tracegrpo_version" and "step" in __metadata__.
//
// A fully sharded run writes, in place of optimizer.safetensors, one shard
// file per rank and one index (shards.go has the layout):
//
//	<dir>/step_<N>/shards.index.json                    every parameter's pieces (rank, element range)
//	<dir>/step_<N>/shard-<RRRRR>-of-<WWWWW>.safetensors  a rank's part of each parameter and of its Adam moments
//
// Tensors reads either layout by element ranges.
//
// # Atomicity
//
// Save writes every file into <dir>/.tmp-step_<N>-<random>/, fsyncs each file
// and the temporary directory, renames it to step_<N> and fsyncs <dir>. A
// step_<N> directory therefore either does not exist or is complete; a crash
// leaves at most a .tmp- directory, which the next Save removes. Replacing an
// existing step_<N> first renames it to .trash-step_<N>-<random>. Retention
// (KeepTopK) renames the oldest complete checkpoints to .trash- before
// deleting them, so a half-deleted checkpoint never carries a step_ name.
//
// # Loading
//
// Load refuses a checkpoint whose DONE marker is missing or does not match
// manifest.json, whose files are missing, extra, of another size or another
// sha256 than the manifest says, or whose trainer_state.json has another
// format version or step; each error names the file and what differs.
// Latest and LoadLatest consider the newest step_<N>; they fall back to an
// older complete checkpoint only when LoadOptions.Fallback is set. A config
// that differs from LoadOptions.ExpectConfig is an error naming the fields.
package checkpoint
