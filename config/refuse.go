package config

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// KeyInfo is one key of the loaded configuration with its class: a Used key
// (a value Config types; guarded ones say Refused with a Guard rule), an
// Ignored key (a subtree once, by its root), a Refused key outside Config
// (with its value, for the check), or an Unclassified key accepted with a
// warning (ForwardCompatible).
type KeyInfo struct {
	Path  string // with list indices, e.g. "policy.dtensor_cfg.lora_cfg"
	Class Class
	Why   string
	Rule  *KeyRule   // nil when Unclassified
	Where string     // file:line, "--set", "override" or "defaults"
	Value *yaml.Node // the resolved value (Refused keys only)
}

// Refusal is a configuration tracegrpo refuses: a key, its value, and why.
// The check (trainer.Check) returns one per refused key.
type Refusal struct {
	Key, Value, Why string
	Where           string // file:line of the key, when known
}

func (e *Refusal) Error() string {
	if e.Where != "" {
		return fmt.Sprintf("config: %s: %s = %s: %s", e.Where, e.Key, e.Value, e.Why)
	}
	return fmt.Sprintf("config: %s = %s: %s", e.Key, e.Value, e.Why)
}

// RefusedKey names the refused key.
func (e *Refusal) RefusedKey() string { return e.Key }

// A Refuser is an error that refuses a configuration naming a key (a
// *Refusal, a grpo guard's error).
type Refuser interface {
	error
	RefusedKey() string
}

// SplitRefusals flattens err (errors.Join trees) into the refusals that name
// a key and every other error.
func SplitRefusals(err error) (refused []Refuser, other []error) {
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		if r, ok := e.(Refuser); ok {
			refused = append(refused, r)
			return
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, c := range j.Unwrap() {
				walk(c)
			}
			return
		}
		var r Refuser
		if errors.As(e, &r) {
			refused = append(refused, r)
			return
		}
		other = append(other, e)
	}
	walk(err)
	return refused, other
}

// Experts is what is known of the model's experts when the refusals are
// decided: a key that configures experts (KeyRule.MoEOnly) changes nothing
// on a dense model, so it is refused only when the model has experts.
type Experts int

const (
	// ExpertsUnknown: the model is not at hand (train config --check without
	// --init-from); MoE-only keys are left undecided (Loaded.Undecided).
	ExpertsUnknown Experts = iota
	// ExpertsNone: a dense model; MoE-only keys are accepted.
	ExpertsNone
	// ExpertsSome: a sparse model; MoE-only keys are refused unless neutral.
	ExpertsSome
	// ExpertsBiased: a sparse model whose routers have a selection bias
	// (Nemotron-H's e_score_correction_bias), which aux-loss-free load
	// balancing updates; otherwise as ExpertsSome.
	ExpertsBiased
)

// Refusals are the recipe's Refused keys whose values are not neutral, one
// *Refusal each (joined), or nil, for a model whose experts are unknown:
// RefusalsFor(ExpertsUnknown).
func (l *Loaded) Refusals() error { return l.RefusalsFor(ExpertsUnknown) }

// RefusalsFor is Refusals for a model with or without experts: a MoE-only
// key is refused only when the model has experts (and left out, see
// Undecided, when that is unknown). The capability guards of package grpo
// refuse the typed keys; trainer.Check runs both.
func (l *Loaded) RefusalsFor(e Experts) error {
	var errs []error
	for _, k := range l.Keys {
		if !l.IsRefused(k) || k.Rule.MoEOnly && e < ExpertsSome {
			continue
		}
		errs = append(errs, l.refusal(k))
	}
	return errors.Join(errs...)
}

// Undecided are the refusals of MoE-only keys that are not neutral: made
// when the model has experts, and accepted when it is dense. Without the
// model (ExpertsUnknown) they cannot be decided.
func (l *Loaded) Undecided() []*Refusal {
	var out []*Refusal
	for _, k := range l.Keys {
		if l.IsRefused(k) && k.Rule.MoEOnly {
			out = append(out, l.refusal(k))
		}
	}
	return out
}

func (l *Loaded) refusal(k KeyInfo) *Refusal {
	why := k.Rule.Why
	if k.Rule.Neutral != nil {
		why += " (accepted: " + k.Rule.Neutral.Desc + ")"
	}
	if k.Rule.MoEOnly {
		why += "; refused because the model has experts (a dense model has none for it to change)"
	}
	return &Refusal{Key: k.Path, Value: flowText(k.Value), Why: why, Where: k.Where}
}

// IsRefused reports whether key k is refused by its value: a Refused key
// outside the typed schema whose value is not neutral. (Typed refused keys
// are refused by the guards of package grpo; a MoE-only key only when the
// model has experts.)
func (l *Loaded) IsRefused(k KeyInfo) bool {
	return k.Class == Refused && k.Rule != nil && !k.Rule.Guard && !k.Rule.Neutral.Accepts(k.Value, l.root)
}

// maxWarnings is the number of unknown keys Warnings names one by one.
const maxWarnings = 20

// Warnings are the keys in no class that loading accepted (in sections that
// carry no training math), one line each: the first maxWarnings, then one
// line counting the rest (train config --keys lists every one).
func (l *Loaded) Warnings() []string {
	var out []string
	n := 0
	for _, k := range l.Keys {
		if k.Class != Unclassified {
			continue
		}
		if n++; n <= maxWarnings {
			out = append(out, fmt.Sprintf("%s: %s: %s", k.Where, k.Path, k.Why))
		}
	}
	if n > maxWarnings {
		out = append(out, fmt.Sprintf("... and %d more unknown keys (the first %d are shown; train config --keys lists them all)", n-maxWarnings, maxWarnings))
	}
	return out
}

// maxFlowText bounds a value printed in a refusal.
const maxFlowText = 120

// flowText is n as one line of flow-style YAML.
func flowText(n *yaml.Node) string {
	if n == nil {
		return "null"
	}
	c := deepCopy(n)
	setFlow(c)
	b, err := yaml.Marshal(c)
	s := strings.TrimSpace(string(b))
	if err != nil {
		s = describe(n)
	}
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > maxFlowText {
		n := maxFlowText
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s = fmt.Sprintf("%s... (%d bytes)", s[:n], len(s))
	}
	return s
}

func setFlow(n *yaml.Node) {
	if n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode {
		n.Style = yaml.FlowStyle
	}
	n.HeadComment, n.LineComment, n.FootComment = "", "", ""
	for _, c := range n.Content {
		setFlow(c)
	}
}

// OtherLoggers are the logger back ends the recipe switches on that
// tracegrpo does not write (logger.<name>_enabled: true, and
// logger.monitor_gpus), one line each saying so; tensorboard_enabled is
// written (Logger.TensorboardEnabled).
func (l *Loaded) OtherLoggers() []string {
	lg := lookup(l.root, []string{"logger"})
	if lg == nil || lg.Kind != yaml.MappingNode {
		return nil
	}
	var out []string
	for i := 0; i < len(lg.Content); i += 2 {
		k, v := lg.Content[i].Value, lg.Content[i+1]
		if k == "tensorboard_enabled" || !strings.HasSuffix(k, "_enabled") && k != "monitor_gpus" {
			continue
		}
		on, ok := boolValue(v)
		switch {
		case ok && on:
			out = append(out, fmt.Sprintf("logger.%s is true: tracegrpo does not write that back end (metrics.jsonl has every metric; logger.tensorboard_enabled writes TensorBoard event files)", k))
		case !ok && v.Kind == yaml.ScalarNode && strings.Contains(v.Value, "${"):
			out = append(out, fmt.Sprintf("logger.%s is %s: tracegrpo does not write that back end", k, quoted(v.Value)))
		}
	}
	return out
}
