package docs

import (
	"fmt"
	"strings"
)

// The plan of Nemotron-3-Super-120B-A12B with multi-token prediction at
// its Gym recipe's shape and at the largest micro-batches that fit
// (docs/memory.md).
func init() {
	register(Generator{Name: "plan-super-mtp",
		From: "train plan --config nemotron-3-super/stage1_rlvr.yaml --config multitrace_override.yaml --model nemotron-3-super-120b-a12b --rollouts x --shard full --world-size W --set policy.max_total_sequence_length=T --json",
		Gen:  genSuperMTPPlan})
}

func genSuperMTPPlan(e *Env) (string, error) {
	var b strings.Builder
	b.WriteString("| tokens per micro-batch | one rank of | weights + bf16 + grads + Adam | gathered + reduce | activations (of which MTP) | total |\n|---|---|---|---|---|---|\n")
	g := func(n int64) string { return fmt.Sprintf("%.2f", float64(n)/(1<<30)) }
	base := []string{"--config", nemorl + "/examples/nemo_gym/nemotron-3-super/stage1_rlvr.yaml", "--config", "config/testdata/multitrace_override.yaml",
		"--set", "grpo.overlong_filtering=false", "--model", published + "/nemotron-3-super-120b-a12b.config.json", "--rollouts", "x", "--shard", "full"}
	for _, r := range []struct{ seq, world int }{{65536, 64}, {65536, 128}, {20480, 64}, {16384, 48}, {16384, 40}} {
		args := append(append([]string(nil), base...), "--world-size", fmt.Sprint(r.world), "--set", fmt.Sprintf("policy.max_total_sequence_length=%d", r.seq))
		p, err := e.plan(args...)
		if err != nil {
			return "", err
		}
		// Without MTP a Nemotron-H packs token tries under
		// shared_prefix=auto: the share is against the same packing.
		q, err := e.plan(append(args, "--set", "policy.megatron_cfg.mtp_num_layers=0", "--set", "policy.shared_prefix=off")...)
		if err != nil {
			return "", err
		}
		act := p.bytes("activations")
		fmt.Fprintf(&b, "| %d | %d (%d nodes) | %s + %s + %s + %s GiB | %s + %s GiB | %s (%s) GiB | **%s GiB** |\n", r.seq, r.world, r.world/8,
			g(p.bytes("weights")), g(p.bytes("weights_bf16")), g(p.bytes("gradients")), g(p.bytes("adam_moments")),
			g(p.bytes("gathered_weights")), g(p.bytes("gradient_reduce")), g(act), g(act-q.bytes("activations")), g(p.Total))
	}
	return b.String(), nil
}
