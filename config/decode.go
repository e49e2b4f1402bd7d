package config

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// ignoredKeys are the keys accepted and not used. "a.b" covers that key and its
// subtree; "a.*" covers every key under a that the schema does not know.
// Keys that change the trained objective never belong here (see package doc).
var ignoredKeys = []string{
	// grpo: the validation loop, multi-turn and epoch limits of NeMo RL's driver.
	"grpo.max_rollout_turns", "grpo.max_num_epochs", "grpo.val_period", "grpo.val_at_start",
	"grpo.val_at_end", "grpo.max_val_samples", "grpo.val_batch_size",
	"grpo.async_grpo.*", "grpo.reward_shaping.*", "grpo.reward_scaling.*",
	// dynamic sampling's knobs (refused by the guards when it is enabled).
	"grpo.batch_multiplier", "grpo.dynamic_sampling_max_gen_batches",
	// loss_fn: none; every loss key changes the objective.
	// policy: engines, batching for other engines, tokenizer source.
	"policy.tokenizer", "policy.generation_batch_size", "policy.logprob_batch_size",
	"policy.logprob_chunk_size", "policy.dtensor_cfg.*", "policy.dynamic_batching",
	"policy.sequence_packing", "policy.make_sequence_length_divisible_by",
	"policy.megatron_cfg.*",
	"policy.megatron_cfg.optimizer.bf16", "policy.megatron_cfg.optimizer.fp16",
	"policy.megatron_cfg.optimizer.params_dtype", "policy.megatron_cfg.optimizer.sgd_momentum",
	"policy.megatron_cfg.optimizer.use_distributed_optimizer",
	"policy.megatron_cfg.optimizer.use_precision_aware_optimizer",
	"policy.megatron_cfg.optimizer.optimizer_cpu_offload", "policy.megatron_cfg.optimizer.optimizer_offload_fraction",
	"policy.megatron_cfg.optimizer.loss_scale", "policy.megatron_cfg.optimizer.initial_loss_scale",
	"policy.megatron_cfg.optimizer.min_loss_scale", "policy.megatron_cfg.optimizer.loss_scale_window",
	"policy.megatron_cfg.optimizer.hysteresis",
	"policy.megatron_cfg.scheduler.override_opt_param_scheduler",
	"policy.megatron_cfg.scheduler.use_checkpoint_opt_param_scheduler",
	"policy.optimizer.kwargs.foreach", "policy.optimizer.kwargs.fused",
	"policy.router_replay.*",
	"policy.generation.backend", "policy.generation.stop_token_ids", "policy.generation.stop_strings",
	"policy.generation.vllm_cfg", "policy.generation.vllm_kwargs", "policy.generation.colocated",
	// checkpointing: best-checkpoint metrics and formats of other engines.
	"checkpointing.metric_name", "checkpointing.higher_is_better", "checkpointing.checkpoint_must_save_by",
	"checkpointing.model_save_format", "checkpointing.save_consolidated", "checkpointing.save_optimizer",
	// data sets are the Gym side's business; environments other than nemo_gym.
	"data", "env.nemo_gym.*",
	// Gym capture settings that do not change what is trained (spec §2.6).
	"env.nemo_gym.token_id_capture.sink_kwargs", "env.nemo_gym.token_id_capture.lineage_store",
	"env.nemo_gym.token_id_capture.lineage_store_kwargs", "env.nemo_gym.token_id_capture.rebuild_response",
	"env.nemo_gym.token_id_capture.allow_unresolved_continuations",
	"env.nemo_gym.token_id_capture.delta_records", "env.nemo_gym.token_id_capture.max_mask_fraction",
	"env.nemo_gym.token_id_capture.mask_fraction_min_samples",
	"env.nemo_gym.token_id_capture.external_staging_backend",
	"env.nemo_gym.token_id_capture.control_auth_token_env",
	"env.nemo_gym.token_id_capture.mask_incomplete_when_attributed",
	"data_plane.*",
	// logger back ends.
	"logger",
}

// walker decodes a resolved tree into the typed schema, classifying keys.
type walker struct {
	ld      *loader
	ignored map[string]bool
	errs    []error
	// more counts the errors past maxErrors, reported as a count only: a
	// recipe with 64k unknown keys must fail in milliseconds with a
	// readable message, not compute 64k suggestions into a 7 MB one.
	more int
}

// maxErrors is the number of configuration errors reported one by one.
const maxErrors = 20

// result is the walker's errors, the ones past maxErrors counted.
func (w *walker) result() error {
	if len(w.errs) == 0 {
		return nil
	}
	errs := w.errs
	if w.more > 0 {
		errs = append(errs[:len(errs):len(errs)], fmt.Errorf("config: ... and %d more errors of the same recipe (the first %d are shown)", w.more, maxErrors))
	}
	return errors.Join(errs...)
}

func valueOf(p any) reflect.Value { return reflect.ValueOf(p).Elem() }

func (w *walker) fail(n *yaml.Node, format string, args ...any) {
	if len(w.errs) >= maxErrors {
		w.more++
		return
	}
	w.errs = append(w.errs, fmt.Errorf("config: %s: %s", w.ld.where(n), fmt.Sprintf(format, args...)))
}

// decodeStruct decodes mapping n into struct v at path.
func (w *walker) decodeStruct(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		v.Set(reflect.Zero(v.Type()))
		return
	}
	if n.Kind != yaml.MappingNode {
		w.fail(n, "%s: want a mapping, found %s", orRoot(path), describe(n))
		return
	}
	fields := fieldsOf(v.Type())
	for i := 0; i < len(n.Content); i += 2 {
		k, c := n.Content[i], n.Content[i+1]
		p := join(path, k.Value)
		fi, ok := fields[k.Value]
		if !ok {
			if ig, ok := isIgnored(p, c); ok {
				w.ignored[ig] = true
				continue
			}
			if len(w.errs) >= maxErrors {
				w.more++ // no suggestion computed for an error not shown
				continue
			}
			w.fail(k, "unknown key %s%s", p, suggest(p))
			continue
		}
		w.decode(c, v.Field(fi), p)
	}
}

func orRoot(p string) string {
	if p == "" {
		return "top level"
	}
	return p
}

// decode decodes n into v (any kind) at path.
func (w *walker) decode(n *yaml.Node, v reflect.Value, path string) {
	t := v.Type()
	switch {
	case t.Kind() == reflect.Pointer:
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			v.Set(reflect.Zero(t))
			return
		}
		nv := reflect.New(t.Elem())
		w.decode(n, nv.Elem(), path)
		v.Set(nv)
	case t.Kind() == reflect.Struct:
		w.decodeStruct(n, v, path)
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			v.Set(reflect.Zero(t))
			return
		}
		if n.Kind != yaml.SequenceNode {
			w.fail(n, "%s: want a list, found %s", path, describe(n))
			return
		}
		if len(n.Content) == 0 {
			// [] and null are the same list: decode both to nil, so that a
			// config marshals and loads back to the same value.
			v.Set(reflect.Zero(t))
			return
		}
		s := reflect.MakeSlice(t, len(n.Content), len(n.Content))
		for i, e := range n.Content {
			w.decodeStruct(e, s.Index(i), fmt.Sprintf("%s.%d", path, i))
		}
		v.Set(s)
	default:
		if t.Kind() != reflect.Interface && t.Kind() != reflect.Slice && n.Kind != yaml.ScalarNode {
			w.fail(n, "%s: want %s, found %s", path, typeName(t), describe(n))
			return
		}
		if !tagFits(n, t) {
			w.fail(n, "%s: want %s, found %s", path, typeName(t), describe(n))
			return
		}
		nv := reflect.New(t)
		if t.Kind() == reflect.String && n.ShortTag() != "!!binary" {
			// OmegaConf converts any scalar into a string field.
			nv.Elem().SetString(n.Value)
			v.Set(nv.Elem())
			return
		}
		if err := n.Decode(nv.Interface()); err != nil {
			w.fail(n, "%s: want %s, found %s", path, typeName(t), describe(n))
			return
		}
		v.Set(nv.Elem())
	}
}

// tagFits reports whether scalar n may decode into kind t without loss: yaml.v3
// alone would truncate 1.5 into an integer field.
func tagFits(n *yaml.Node, t reflect.Type) bool {
	if n.Kind != yaml.ScalarNode {
		return true
	}
	tag := n.ShortTag()
	switch t.Kind() {
	case reflect.Bool:
		return tag == "!!bool"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return tag == "!!int"
	case reflect.Float32, reflect.Float64:
		return tag == "!!int" || tag == "!!float"
	case reflect.String:
		return tag != "!!null"
	}
	return true
}

func typeName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "an integer"
	case reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice:
		return "a list of " + strings.TrimPrefix(strings.TrimPrefix(typeName(t.Elem()), "a "), "an ") + "s"
	case reflect.Pointer:
		return typeName(t.Elem()) + " or null"
	}
	return t.String()
}

// fieldsOf maps yaml key names to field indices.
func fieldsOf(t reflect.Type) map[string]int {
	m := map[string]int{}
	for i := 0; i < t.NumField(); i++ {
		tag := t.Field(i).Tag.Get("yaml")
		name, _, _ := strings.Cut(tag, ",")
		if name != "" && name != "-" {
			m[name] = i
		}
	}
	return m
}

// normPath drops list indices: "policy.scheduler.0.name" -> "policy.scheduler.name".
func normPath(p string) string {
	segs := splitPath(p)
	out := segs[:0:0]
	for _, s := range segs {
		if _, ok := index(s); ok {
			continue
		}
		out = append(out, s)
	}
	return strings.Join(out, ".")
}

// isIgnored reports whether key path p (value c) is accepted unused, and the
// path to report it under.
func isIgnored(p string, c *yaml.Node) (string, bool) {
	np := normPath(p)
	for _, pat := range ignoredKeys {
		if pat == np || strings.HasPrefix(np, pat+".") {
			return p, true
		}
		if parent, ok := strings.CutSuffix(pat, ".*"); ok {
			if rest, ok := strings.CutPrefix(np, parent+"."); ok && !strings.Contains(rest, ".") {
				return p, true
			}
		}
	}
	// env.<name>: a mapping is another environment's block (env.math, ...).
	if rest, ok := strings.CutPrefix(np, "env."); ok && !strings.Contains(rest, ".") && c != nil && c.Kind == yaml.MappingNode {
		return p, true
	}
	return "", false
}

// knownPaths are every key path of the schema and of ignoredKeys (for
// suggestions).
var knownPaths = func() []string {
	var out []string
	var walk func(t reflect.Type, path string)
	walk = func(t reflect.Type, path string) {
		for t.Kind() == reflect.Pointer || (t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct) {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return
		}
		for i := 0; i < t.NumField(); i++ {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
			p := join(path, name)
			out = append(out, p)
			walk(t.Field(i).Type, p)
		}
	}
	walk(reflect.TypeOf(Config{}), "")
	for _, k := range ignoredKeys {
		if !strings.HasSuffix(k, ".*") {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}()

// suggest names the known key nearest to p by edit distance.
func suggest(p string) string {
	np := normPath(p)
	best, bd := "", 1<<30
	for _, k := range knownPaths {
		if d := levenshtein(np, k); d < bd {
			best, bd = k, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (nearest known key: %s)", best)
}

func levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := prev[j-1]
			if a[i-1] != b[j-1] {
				c++
			}
			c = min(c, prev[j]+1, cur[j-1]+1)
			cur[j] = c
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
