package config

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
)

// TestOverrideMarker: NeMo RL's _override_ (nemo_rl/utils/config.py,
// merge_with_override): a top-level section of a file merged over its
// parents replaces the parents' section when it holds _override_: true; a
// marker below the top level is a plain key (NeMo RL merges that section),
// listed as ignored.
func TestOverrideMarker(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "parent.yaml", `
loss_fn: {ratio_clip_min: 0.1, ratio_clip_max: 0.3}
policy:
  megatron_cfg: {enabled: true, activation_checkpointing: true}
checkpointing: {save_period: 7, keep_top_k: 2}
`)
	writeFile(t, dir, "second.yaml", "checkpointing: {_override_: true, save_period: 9}\n")
	child := writeFile(t, dir, "child.yaml", `
defaults: [parent.yaml, second.yaml]
loss_fn: {_override_: true, ratio_clip_max: 0.25}
policy:
  megatron_cfg: {_override_: true, enabled: false}
`)
	l := mustLoad(t, []string{child})
	c := l.Config
	checks := []struct {
		name      string
		got, want any
	}{
		{"replaced section keeps only the child's keys", c.LossFn.RatioClipMax, 0.25},
		{"a key only the parent set is back to NeMo RL's default", c.LossFn.RatioClipMin, 0.2},
		{"nested marker: merged, child's value", c.Policy.MegatronCfg.Enabled, false},
		{"nested marker: merged, parent's key kept", c.Policy.MegatronCfg.ActivationCheckpointing, true},
		{"a parent's marker replaces the earlier parent's section", c.Checkpointing.SavePeriod, 9},
		{"the earlier parent's other key is gone", *c.Checkpointing.KeepTopK, 3},
		{"nested marker listed as ignored", slices.Contains(l.Ignored, "policy.megatron_cfg._override_"), true},
		{"popped markers are not keys", slices.Contains(l.Ignored, "loss_fn._override_"), false},
	}
	for _, ck := range checks {
		if d := cmp.Diff(ck.want, ck.got); d != "" {
			t.Errorf("%s: (-want +got)\n%s", ck.name, d)
		}
	}
	// Files given one after another merge the same way.
	over := writeFile(t, dir, "over.yaml", "loss_fn: {_override_: true, ratio_clip_min: 0.05}\n")
	c = mustLoad(t, []string{child, over}).Config
	if c.LossFn.RatioClipMin != 0.05 || c.LossFn.RatioClipMax != 0.2 {
		t.Errorf("a later file's _override_: ratio_clip_min %v, max %v; want 0.05 and the default 0.2", c.LossFn.RatioClipMin, c.LossFn.RatioClipMax)
	}
	// _override_: false is no marker: the section merges (the key stays).
	f := writeFile(t, dir, "false.yaml", "defaults: parent.yaml\nloss_fn: {_override_: false, ratio_clip_max: 0.4}\n")
	l = mustLoad(t, []string{f})
	if l.Config.LossFn.RatioClipMin != 0.1 || !slices.Contains(l.Ignored, "loss_fn._override_") {
		t.Errorf("_override_: false: ratio_clip_min %v (want the parent's 0.1), ignored %v", l.Config.LossFn.RatioClipMin, l.Ignored)
	}
}

// TestMandatoryValues: ??? is an error only when it is still missing after
// every file and override, in a key tracegrpo reads.
func TestMandatoryValues(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "base.yaml", "policy:\n  model_name: ???\n  precision: bfloat16\nlogger:\n  wandb:\n    name: ???\n")
	child := writeFile(t, dir, "child.yaml", "defaults: base.yaml\npolicy:\n  model_name: my/model\n")
	keep := writeFile(t, dir, "keep.yaml", "defaults: child.yaml\npolicy:\n  model_name: ???\n  precision: ???\n")
	bare := writeFile(t, dir, "bare.yaml", "defaults: base.yaml\n")
	for _, c := range []struct {
		name      string
		files     []string
		overrides []string
		sets      []string
		model     OptionalString
		err       string
	}{
		{"a child fills it", []string{child}, nil, nil, "my/model", ""},
		{"??? in a child keeps the parent's value", []string{keep}, nil, nil, "my/model", ""},
		{"an override fills it", []string{bare}, []string{"policy.model_name=o/m"}, nil, "o/m", ""},
		{"--set fills it", []string{bare}, nil, []string{"policy.model_name=s/m"}, "s/m", ""},
		{"still missing", []string{bare}, nil, nil, "", "base.yaml:2"},
	} {
		l, err := LoadSources(Sources{Files: c.files, Overrides: c.overrides, Sets: c.sets})
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), "policy.model_name: mandatory value (???)") {
				t.Errorf("%s: error %v, want one naming %s and policy.model_name", c.name, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if l.Config.Policy.ModelName != c.model {
			t.Errorf("%s: model_name %q, want %q", c.name, l.Config.Policy.ModelName, c.model)
		}
		// logger.wandb.name stays ???: an ignored key is not read.
	}
}

// TestSchedulerNullPrintsNull: policy.scheduler null and [] print as written
// and load back the same.
func TestSchedulerNullPrintsNull(t *testing.T) {
	for _, c := range []struct{ set, want string }{
		{"policy.scheduler=null", "  scheduler: null\n"},
		{"policy.scheduler=[]", "  scheduler: []\n"},
	} {
		l := mustLoad(t, []string{recipeBase}, c.set)
		b, err := l.YAML()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), c.want) {
			t.Errorf("%s: the effective config lacks %q", c.set, c.want)
		}
		p := writeFile(t, t.TempDir(), "e.yaml", string(b))
		if d := cmp.Diff(l.Config, mustLoad(t, []string{p}).Config); d != "" {
			t.Errorf("%s: reloaded (-want +got)\n%s", c.set, d)
		}
		if _, s, err := l.Config.Optim(); err != nil || s.LR(0) != 5e-6 {
			t.Errorf("%s: no scheduler is a constant learning rate: LR(0) = %v, %v", c.set, s.LR(0), err)
		}
	}
}

// TestTestdataRecipesKeysClassified: every key of every recipe in
// config/testdata (today's NeMo RL recipes, October 2025's and tracegrpo's
// own) is in a class; a key in none fails here, naming the file.
func TestTestdataRecipesKeysClassified(t *testing.T) {
	n := 0
	err := filepath.Walk("testdata", func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() || !strings.HasSuffix(p, ".yaml") && !strings.HasSuffix(p, ".yml") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		root, err := parseTree(p, b)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			return nil
		}
		n++
		var walk func(n *yaml.Node, path string)
		walk = func(n *yaml.Node, path string) {
			switch n.Kind {
			case yaml.MappingNode:
				for i := 0; i < len(n.Content); i += 2 {
					k := n.Content[i].Value
					if path == "" && k == "defaults" || k == overrideMarker {
						continue
					}
					q := join(path, k)
					isMap := func(x string) bool { return x == normPath(q) && n.Content[i+1].Kind == yaml.MappingNode }
					cls, _, at := Classify(q, isMap)
					if cls == Unclassified && !(at == normPath(q) && rulesBeneath(q) && n.Content[i+1].Kind == yaml.MappingNode) {
						t.Errorf("%s:%d: key %s is in no class", p, n.Content[i].Line, q)
						continue
					}
					walk(n.Content[i+1], q)
				}
			case yaml.SequenceNode:
				for i, c := range n.Content {
					walk(c, join(path, strconv.Itoa(i)))
				}
			}
		}
		walk(root, "")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 250 {
		t.Errorf("%d recipes checked; config/testdata holds more", n)
	}
	t.Logf("%d recipes, every key classified", n)
}

// TestRefusalNamesWhereTheValueWasSet: a refused value names the file and
// line that set it, not the parent that first had the key.
func TestRefusalNamesWhereTheValueWasSet(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "parent.yaml", "policy:\n  dtensor_cfg:\n    lora_cfg: {enabled: false, dim: 8}\n  draft: {enabled: false}\n")
	child := writeFile(t, dir, "child.yaml", "defaults: parent.yaml\npolicy:\n  dtensor_cfg:\n    lora_cfg:\n      enabled: true\n  draft: true\n")
	err := mustLoad(t, []string{child}).Refusals()
	for _, want := range []string{"child.yaml:5: policy.dtensor_cfg.lora_cfg = {enabled: true, dim: 8}", "child.yaml:6: policy.draft = true"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("refusals %v lack %q", err, want)
		}
	}
}
