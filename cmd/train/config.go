package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/trainer"
)

func init() {
	register(command{
		name:    "config",
		summary: "print the effective configuration (NeMo RL recipe + overrides) as YAML; --check refuses what train refuses",
		run:     runConfig,
	})
}

const configSynopsis = `train config [--config FILE]... [OVERRIDE]... [--set key.path=value]... [--check [--init-from DIR] [--rollouts PATH]] [--keys]

Loads NeMo RL recipes as NeMo RL does and prints the configuration train would
use, as YAML, with a header naming the files, the keys ignored and any warning.

Loading: each file is composed with its defaults: chain (parents first; a
top-level section holding _override_: true replaces the one it would merge
into, as nemo_rl/utils/config.py does), later files over earlier ones. Then the
OVERRIDEs apply to the composed recipe, then it goes over NeMo RL's defaults,
then each --set applies, and interpolations are resolved as OmegaConf
resolves them: ${a.b}, relative ${.x} and ${..x}, nested ${a.${k}}, inside
strings, and the resolvers add, mul, div, max (NeMo RL's), oc.env, oc.select
and oc.decode. A mandatory ??? still missing in a key train reads is an error.

OVERRIDEs are Hydra's, as examples/run_grpo.py takes them:
  key=value      change a key the recipe has (an error if it has none)
  +key=value     add a key the recipe lacks (an error if it already has one)
  ++key=value    add or change
  ~key           delete a key (~key=value: only if it has that value)
Values: 10, 1.5e-6, true, null, inf keep their type; other text is a string
(quote it as 'a b' or "1,2" to keep commas, brackets or a type out; escape
one character as \, \[ \= ...); [1, 2] is assigned, {a: 1} merges into the
mapping it overrides; ${...} is resolved with the recipe (quote one holding
braces: 'key="${mul:${a},2}"'); int(), float(), str(), bool() and
extend_list() work; sweeps (a,b, choice(), range()) and config groups do not.
--set applies after the overrides, over the defaults: any key of tracegrpo's
schema, typed by it.

Every key is in one class (--keys lists the recipe's): used (honoured),
ignored (an engine or service tracegrpo does not run; listed once), or
refused (it changes the math or the model, and tracegrpo does not do it;
accepted only with a value that asks for nothing, such as enabled: false). A
key in no class is an error in grpo, loss_fn, policy, env and the other
sections that carry training math, and a warning in cluster, checkpointing,
data_plane, async_rl, logger and data.

--check runs every refusal train runs on the configuration before any work
(trainer.Check: refused keys, capability guards, the multi-trace opt-in,
optimizer, schedule, precision), and, when the model is at hand (the built-in
model, a policy.model_name directory, or --init-from DIR), the model's
config.json with policy.hf_config_overrides and the checks train makes of it
(the built-in job's token ids and the padding token within its vocabulary;
--rollouts says the run reads Gym's rollouts instead). Keys that configure a
model's experts (the MoE router's) are refused only when the model has
experts; without the model --check says it could not decide them.

NeMo RL keys its Python never reads (scripts/nemorl_schema.py finds them),
and keys it overwrites before use (policy.megatron_cfg.train_iters), are
ignored whatever their value: they cannot change what NeMo RL trains.

Flags:`

func runConfig(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("config", configSynopsis, stdout)
	files := fs.StringArray("config", nil, "NeMo RL recipe YAML (repeatable; later files merge over earlier ones; none: the built-in job, as train runs it)")
	sets := fs.StringArray("set", nil, "override one key after the files and overrides, typed by the schema, e.g. grpo.num_prompts_per_step=4 (repeatable)")
	check := fs.Bool("check", false, "also run every refusal train runs before any work, and fail on the first recipe train would refuse")
	initFrom := fs.String("init-from", "", "with --check: the Hugging Face model directory train would start from (its config.json is checked)")
	rollouts := fs.String("rollouts", "", "with --check: the run reads NeMo Gym rollouts, not the built-in job's tasks (the path is not read)")
	keys := fs.Bool("keys", false, "list the recipe's keys outside the typed schema with their classes (ignored, refused, unknown) and why, instead of the YAML")
	if err := parseFlags(fs, args, -1); err != nil {
		return err
	}
	overrides, err := overrideArgs(fs)
	if err != nil {
		return err
	}
	l, _, err := trainer.LoadRecipeWith(*files, overrides, *sets)
	if err != nil {
		return err
	}
	for _, w := range l.Warnings() {
		fmt.Fprintf(stderr, "train config: warning: %s\n", w)
	}
	if *check {
		if err := runCheck(l, *initFrom, *rollouts == "", stderr); err != nil {
			return err
		}
	}
	if *keys {
		return printKeys(l, stdout)
	}
	b, err := l.YAML()
	if err != nil {
		return err
	}
	if _, err := stdout.Write(b); err != nil {
		return fmt.Errorf("config: write the output: %w", err)
	}
	return nil
}

// runCheck runs every refusal train runs before any work: the recipe's
// (trainer.CheckFor), deciding the keys that configure experts by the
// model when it is at hand (the built-in model, a policy.model_name
// directory, or --init-from DIR), and the model's own checks with
// policy.hf_config_overrides (trainer.CheckModel). Without the model it
// says which keys it could not decide. builtin: the run is the built-in
// job (no --rollouts).
func runCheck(l *config.Loaded, initFrom string, builtin bool, stderr io.Writer) error {
	c := &l.Config
	mc, known, merr := modelAtHand(c, initFrom)
	experts := config.ExpertsUnknown
	if known && merr == nil {
		experts = trainer.ExpertsOf(mc)
	}
	if err := trainer.CheckFor(l, 0, experts); err != nil {
		return err
	}
	if merr != nil {
		return merr
	}
	if known {
		return trainer.CheckModel(mc, builtin)
	}
	fmt.Fprintf(stderr, "train config: note: the model was not checked: policy.model_name %q is not a directory with a config.json here (train needs --init-from DIR for it; give it to --check too)\n", c.Policy.ModelName)
	if u := append(l.Undecided(), trainer.UndecidedExpertBias(c)...); len(u) > 0 {
		fmt.Fprintf(stderr, "train config: note: could not decide %d key(s) that configure a model's experts without the model: train refuses them if it has experts, and accepts them if it is dense (give --init-from DIR to decide):\n", len(u))
		for _, r := range u {
			fmt.Fprintf(stderr, "  %s\n", r.Error())
		}
	}
	return nil
}

// modelAtHand resolves the model train would build (with the recipe's
// hf_config_overrides) when it is at hand; known is false when it is not.
func modelAtHand(c *config.Config, initFrom string) (mc model.Config, known bool, err error) {
	if name := string(c.Policy.ModelName); initFrom == "" && !trainer.IsBuiltinModel(name) {
		if st, err := os.Stat(filepath.Join(name, "config.json")); name == "" || err != nil || st.IsDir() {
			return model.Config{}, false, nil
		}
	}
	mc, _, err = trainer.ModelConfig(c, initFrom)
	return mc, true, err
}

// printKeys writes the recipe's keys outside the typed schema, one per line:
// class, key, where it came from, and why.
func printKeys(l *config.Loaded, w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLASS\tKEY\tFROM\tWHY")
	for _, k := range l.Keys {
		why := k.Why
		if k.Class == config.Refused && k.Rule != nil && k.Rule.Neutral != nil {
			state := "neutral here"
			if l.IsRefused(k) {
				state = "REFUSED by --check and train"
			}
			why = fmt.Sprintf("%s [%s; accepted: %s]", why, state, k.Rule.Neutral.Desc)
		}
		cls := k.Class.String()
		if k.Class == config.Unclassified {
			cls = "unknown"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", cls, k.Path, k.Where, why)
	}
	return tw.Flush()
}
