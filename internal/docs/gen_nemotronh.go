package docs

import (
	"fmt"
	"strings"
)

// The plan of Nemotron-3-Nano-30B-A3B at its Gym recipe's shape
// (docs/memory.md): one rank of 8, part by part.
func init() {
	register(Generator{Name: "plan-nano",
		From: "train plan --config nemo_gym/grpo_nanov3.yaml --config multitrace_override.yaml --set grpo.overlong_filtering=false --model nemotron-3-nano-30b-a3b --rollouts x --shard full --world-size 8 --set policy.max_total_sequence_length=49152 --json",
		Gen:  genNanoPlan})
}

// nanoPlanArgs are the plan's arguments (cmd/train's TestNanoV3PlanFits
// plans the same).
var nanoPlanArgs = []string{"--config", nemorl + "/examples/nemo_gym/grpo_nanov3.yaml", "--config", "config/testdata/multitrace_override.yaml",
	"--set", "grpo.overlong_filtering=false", "--model", published + "/nemotron-3-nano-30b-a3b.config.json", "--rollouts", "x",
	"--shard", "full", "--world-size", "8", "--set", "policy.max_total_sequence_length=49152"}

func genNanoPlan(e *Env) (string, error) {
	p, err := e.plan(nanoPlanArgs...)
	if err != nil {
		return "", err
	}
	if !p.Ckpt {
		return "", fmt.Errorf("the nano-v3 plan has activation checkpointing off")
	}
	var b strings.Builder
	b.WriteString("| part | one rank of 8 |\n|---|---|\n")
	g := func(n int64) string { return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30)) }
	for _, c := range p.Components {
		fmt.Fprintf(&b, "| `%s` | %s |\n", c.Name, g(c.Bytes))
	}
	fmt.Fprintf(&b, "| **total** | **%s** (%.1f GB) |\n", g(p.Total), float64(p.Total)/1e9)
	fmt.Fprintf(&b, "\n%d parameters; activations %s with checkpointing (%s without).\n", p.Params, g(p.ActWith), g(p.ActWithout))
	return b.String(), nil
}
