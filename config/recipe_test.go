package config

import (
	"strings"
	"testing"
)

func TestLoadOverMergesBaseUnderFilesAndSets(t *testing.T) {
	base := Recipe{Name: "builtin.yaml", Data: []byte("grpo:\n  num_prompts_per_step: 3\n  num_generations_per_prompt: 5\npolicy:\n  train_global_batch_size: ${mul:${grpo.num_prompts_per_step},${grpo.num_generations_per_prompt}}\n")}
	ld, err := LoadOver(base, nil, []string{"grpo.num_prompts_per_step=4"})
	if err != nil {
		t.Fatal(err)
	}
	c := ld.Config
	if c.GRPO.NumPromptsPerStep != 4 || c.GRPO.NumGenerationsPerPrompt != 5 || c.Policy.TrainGlobalBatchSize != 20 {
		t.Fatalf("prompts %d gens %d gbs %d, want 4 5 20", c.GRPO.NumPromptsPerStep, c.GRPO.NumGenerationsPerPrompt, c.Policy.TrainGlobalBatchSize)
	}
	if ld.Files[0] != "builtin.yaml" {
		t.Errorf("Files = %v, want the recipe's name first", ld.Files)
	}
	_, err = LoadOver(Recipe{Name: "builtin.yaml", Data: []byte("grpo:\n  num_prompts_per_stepp: 3\n")}, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "builtin.yaml") {
		t.Fatalf("unknown key in the base recipe: %v, want an error naming builtin.yaml", err)
	}
	if _, err := LoadOver(Recipe{Name: "b.yaml", Data: []byte("defaults: x.yaml\n")}, nil, nil); err == nil {
		t.Fatal("defaults: in an in-memory recipe accepted")
	}
}
