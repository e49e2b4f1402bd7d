package main

import (
	"fmt"
	"io"

	"github.com/tracegrpo/tracegrpo/grpo"
	"github.com/tracegrpo/tracegrpo/trainer"
)

func init() {
	register(command{
		name:    "config",
		summary: "print the effective configuration (NeMo RL recipe + overrides) as YAML",
		run:     runConfig,
	})
}

func runConfig(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("config", "train config [--config FILE]... [--set key.path=value]... [--check]", stdout)
	files := fs.StringArray("config", nil, "NeMo RL recipe YAML (repeatable; later files merge over earlier ones; none: the built-in job, as train runs it)")
	sets := fs.StringArray("set", nil, "override one key after the files, typed by the schema, e.g. grpo.num_prompts_per_step=4 (repeatable)")
	check := fs.Bool("check", false, "also run the capability guards and fail on a refused combination")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	l, _, err := trainer.LoadRecipe(*files, *sets)
	if err != nil {
		return err
	}
	if *check {
		if err := grpo.CheckConfig(&l.Config); err != nil {
			return err
		}
		if _, _, err := l.Config.Optim(); err != nil {
			return err
		}
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
