// Package loop is the file protocol between tracegrpo's trainer and a
// generator (vLLM serving the policy, NeMo Gym collecting rollouts with it)
// in synchronous GRPO. It deals in names, bytes and hashes only and imports
// no model code: the trainer streams its weights into a Pending file, a
// generator reads them back with any Hugging Face loader. docs/loop.md is
// the user's account of the same protocol.
//
// # Weights: the trainer's side (--weights-out W)
//
//	W/step_<N>/config.json          the HF model config (torch_dtype = the weights' dtype)
//	W/step_<N>/model.safetensors    the weights in the generation dtype (bfloat16 by default)
//	W/step_<N>/tokenizer*, generation_config.json, ...
//	                                copied from the initial weights' directory (CopyFiles)
//	W/step_<N>/DONE                 Done (JSON): format, version, step, dtype and every
//	                                other file's size and sha256; written last
//
// step_0 holds the initial weights, published before the trainer first waits
// for rollouts; step_<N> the weights after step N's update, published before
// the trainer waits for step_<N+1>.jsonl. No optimizer state is written. Every
// file is mode 0644 whatever the umask, so a server running as another user
// reads them.
//
// A step directory is written under W/.tmp-step_<N>-<random>/: each file is
// fsynced as it is closed, then the directory; it is renamed to step_<N>
// (an existing step_<N>, from a run that is redoing the step after a resume,
// is first renamed aside to .trash-) and W is fsynced; only then is DONE
// written (temp file, fsync, rename) and step_<N> fsynced. A directory
// without DONE is incomplete: a reader waits, and the next Publisher removes
// it. Retention keeps the Keep newest complete directories at or below the
// step just published (so the one just published, the newest a generator
// can want, is never deleted); directories above it are left for the run to
// replace as it redoes those steps.
//
// # Rollouts: the generator's side (--rollouts R)
//
//	R/step_<N>.meta.json   Meta: {"policy_step": K, "weights_sha256": "<hex>"}, the weights
//	                       that generated step N (K = N-1 in synchronous GRPO; the sha256 of
//	                       W/step_<K>/model.safetensors as the generator loaded it)
//	R/step_<N>.jsonl       train_global_batch_size rollout records, whole task groups
//
// WriteStep writes both whole (temp file, fsync, rename; the sidecar first),
// so that the trainer, which waits for step_<N>.jsonl, finds its sidecar
// beside it. Captures (the Gym token-ID capture store the records correlate
// with) are written before the records that name them.
//
// # Versions
//
// CheckMeta is the trainer's check: policy_step must be N-1 and
// weights_sha256 the hash of the weights the trainer published as step N-1;
// either difference stops the run before the step trains, naming the file
// and both values. A step file without a sidecar is trained unchecked (the
// trainer warns once).
package loop
