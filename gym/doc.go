// Package gym reads NeMo Gym token-ID captures and turns them into training
// traces exactly as NeMo Gym and NeMo RL do (spec docs/multitrace-grpo.md
// §1–§3, §8): TokenEntry schema v3 (and schema 1, what NeMo Gym's main
// writes today: builder_v1.go), the capture digest, the file capture store,
// rollout correlation, the prefix_merging and per_request builders, the
// training_traces v1 envelope and rollout finalization.
//
// The package deals in names, tokens and bytes only; it imports no model code.
//
// # Data flow
//
//	rollout record (RecordReader) ──RolloutIDFromRecord──▶ rollout id
//	capture store (Reader or Writer: Source) ──Snapshot──▶ []TokenEntry
//	Build (PrefixMerging | PerRequest) ──▶ BuildOutput ──ProjectTrainingTraces──▶ TrainingTraceBatch
//	Finalize: the record gains training_traces, or mask_sample + _ng_token_capture.error/reason
//
// # File capture store (spec §2.2)
//
// One directory; for each rollout id rid (validated against
// ^[A-Za-z0-9][A-Za-z0-9._-]*$ before any path is formed):
//
//	rid.tokens.jsonl       one TokenEntry per line: a sorted-key JSON object, '\n'-terminated,
//	                       fsync'd before Put returns (or rid.tokens.jsonl.zst: the same bytes, zstd)
//	rid.tokens.intents     one model_call_id per line from BeginCall; "-id" cancels an intent
//	rid.tokens.incomplete  one model_call_id per line from MarkIncomplete (its existence marks the rollout)
//	rid.tokens.state.json  {"frozen","retired","incomplete","snapshot_id","version",
//	                        "entry_digests":{call: sha256 hex of the line},"indexed_size"}
//
// A snapshot is incomplete when the marker exists, the state says so, an
// intent has no entry, or the entries file ends in a torn line.
//
// The same store can be kept in memory (NewMemoryWriter, and
// Writer.Reader to read it): the same files holding the same bytes, written
// by the same Writer code and read back by the same parser, index checks
// and builders (storefs.go puts the file operations behind one small
// interface). Its paths read "(memory)/<rid>.tokens.jsonl" in messages.
//
// # Digest (spec §2.1)
//
// ComputeDigest(t) = hex(sha256("nemo-gym-tokens" || 0x01 || u64be(len t) ||
// u64be(t[0]) || ...)), and hex(sha256("nemo-gym-tokens")) for the empty list.
//
// # Invariants
//
// A delivered envelope satisfies every rule of spec §2.5 (Validate): aligned
// non-empty arrays, loss_mask[0] == 0, binary masks, non-negative tokens,
// finite logprobs, spans that exactly cover the loss mask without overlap,
// unique trace ids, exactly one owner per sampled call across the whole
// envelope, and an owner for every referenced call. The owned (tokens,
// logprobs) of each call are the captured ones, byte for byte, and are the
// same under both builders; the envelope does not depend on capture order.
//
// # Errors versus masks (spec §8)
//
// Finalize returns an error for: a missing or malformed correlation key; an
// attached training_traces that violates the wire contract or names another
// rollout; a capture directory that cannot be listed. Everything else that
// makes a rollout untrainable is a mask with a Reason* code, counted per
// code by its callers: capture_incomplete, nothing_recorded (zero-call
// capture: an inert rollout), capture_retired, invalid_capture,
// unsupported_schema, invalid_state, index_mismatch, conflicting_payloads,
// not_a_regular_file, capture_unreadable, mixed_models,
// terminal_unavailable, terminal_disagreement, proof_mismatch,
// unresolved_custody, multiple_chains, foreign_rollout, routed_experts, empty_prompt,
// no_trainable_calls, invalid_envelope, masked_upstream. Damage to one
// rollout's files (a CaptureDamage) masks that rollout and no other.
//
// # Reading a rollout's files (store_read.go)
//
// Every capture path is Lstat'ed first: a regular file, or a symlink to a
// regular file inside the capture directory, is opened (O_NONBLOCK, then
// fstat'ed to be the same regular file) and read no further than the size
// it states; a FIFO, device, socket, directory, dangling symlink or symlink
// out of the directory masks the rollout (not_a_regular_file). The state
// document is read as Gym reads it (flags by truthiness; entry_digests and
// indexed_size only when typed as Gym requires, otherwise the whole file is
// re-indexed). The entries file must hold at least indexed_size bytes, and
// indexed_size must end a line; every line before it is acknowledged and
// must hash (sha256 of the line without its ASCII white space) to its
// entry_digests value, and every digest must have its line
// (index_mismatch, naming the offset). Lines after indexed_size are the
// unacknowledged tail Gym re-indexes. Two lines for one model_call_id that
// differ in any byte are conflicting durable payloads (conflicting_payloads);
// byte-identical repeats are de-duplicated by the builders.
//
// # Decisions where the sources are silent (spec INFERRED points)
//
//   - prompt_is_delta defaults to false (spec §2.1).
//   - Decoding is type-exact everywhere: an integer field takes only a JSON
//     integer (not 3.0, 1e2 or true), a float field any finite JSON number.
//     NaN, Infinity and null are rejected with the field and position. Token
//     ids must be non-negative and fit int32 (the trainer's token type).
//     Duplicate keys in one object are an error (Python would keep the last).
//   - A store line that does not decode masks that rollout (invalid_capture,
//     naming file, line and field), as Gym's finalizer masks a failed read;
//     a schema_version other than 1 or 3 masks it too (unsupported_schema),
//     as does a snapshot mixing schema-1 and schema-3 lines.
//   - Schema 1 (NeMo Gym main, records.py at 07d6b0d07): its fields are
//     read, every other field (a parent_call_id, a digest) is an extra kept
//     verbatim and never interpreted, as Gym main's reader keeps it. Its
//     calls are chained by token prefixes as Gym main's prefix_merging
//     chains them (PrefixMergingV1), and the rollout is trained only when
//     Gym main's consumer would deliver it: one root, one chain, every retry
//     resolved (else unresolved_custody or multiple_chains); the trace is
//     exactly Gym main's rebuilt response.output. Terminal attribution does
//     not apply (Gym main has none). per_request trains each call that
//     admission keeps on its own full prompt. A line without
//     schema_version is read as schema 3.
//   - An unacknowledged last line that is not JSON (Gym's torn write) is
//     dropped and marks the snapshot incomplete: the call it held was lost,
//     so the rollout is masked rather than trained without it (Gym truncates
//     the line and trains on the rest). The Reader never truncates it (it
//     never modifies a file); the Writer truncates it on its next write to
//     that rollout, as Gym does.
//   - Both rid.tokens.jsonl and rid.tokens.jsonl.zst present masks the
//     rollout (invalid_capture), as does a corrupt .zst; Gym's store reads
//     no .zst.
//   - Without a state file a snapshot's SnapshotID is the first 32 hex digits
//     of sha256 over the entries file and its Version the number of entries.
//   - A retired (dropped) capture masks the rollout (capture_retired).
//   - Store file names use the correlation pattern (first character
//     alphanumeric), stricter than Gym's store, so "." and ".." never name a file.
//   - Correlation: _ng_rollout_id null counts as absent, "" is malformed;
//     indices must be JSON integers; negative indices are malformed.
//   - Mixed models: any two entries of a snapshot whose model differs
//     (including "" against a name) mask the rollout.
//   - Terminal attribution implements Gym's four witnesses (explicit,
//     declared, response_id, content); the content witness is Gym's
//     FINGERPRINT_VERSION 3 fingerprint byte for byte (fingerprint.go,
//     pyvalue.go). Leaving it out would not have been safe: with two
//     retries of one prompt, a response whose id is one call's and whose
//     content is the other's would have attributed (and trained) the wrong
//     one. Witnesses that name different token sequences mask the rollout
//     (terminal_disagreement); Gym attributes nothing there and masks only
//     when a retry then stays unresolved (docs/gym.md, Departures). Where Gym's
//     own fingerprint raises AttributeError (malformed tool_calls), the
//     rollout is masked (terminal_unavailable).
//   - A record whose mask_sample is already true stays masked
//     (masked_upstream) and loses any stale training_traces. A record that
//     already carries training_traces is validated, not rebuilt (Finalize);
//     Refinalize rebuilds from the capture, as Gym's finalizer does.
//   - An envelope's schema_version may be omitted (it defaults to 1); its
//     rollout_id must equal the record's capture key.
//   - _ng_token_capture counts lists (unresolved_parent_calls,
//     empty_generation_calls, quarantined_calls) and adds builder, traces,
//     unresolved_retries and reason.
//   - Gym's legacy main_chain delivery (rebuilding response.output) is not
//     implemented: tracegrpo consumes all_traces envelopes only.
//     PrefixMerging(..., allTraces=false) keeps the legacy chain rules for
//     parity tests.
//   - The Writer serializes writers within one process; it takes no
//     cross-process lock, so use one Writer per directory.
package gym
