package docs

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/trainer"
)

// Generator writes the body of the generated parts named Name.
type Generator struct {
	Name string
	// From says which command prints what the part says, for messages.
	From string
	Gen  func(e *Env) (string, error)
	// Same reports whether two bodies say the same thing; nil compares
	// bytes. A part whose command prints timings compares without them, so
	// that make docs rewrites it only when something else changed.
	Same func(a, b string) bool
}

// Generators are the generators of every part the docs may hold, by name,
// but for the parts named output-*: the stdout of the shell block just
// before the part (OutputPrefix).
var Generators = map[string]Generator{}

// OutputPrefix starts the name of a part that holds the stdout of the shell
// block before it, in a text fence.
const OutputPrefix = "output-"

// BlockBefore returns the last shell block of blocks that opens before the
// part's line.
func BlockBefore(blocks []Block, p Part) (Block, bool) {
	var last Block
	found := false
	for _, b := range blocks {
		if b.Shell() && b.Line < p.Line {
			last, found = b, true
		}
	}
	return last, found
}

// Output runs the shell block b with bash in e.Root and returns its stdout
// as a part's body: in a text fence. A failure is an error with stderr.
func (e *Env) Output(bash string, b Block) (string, error) {
	cmd := exec.Command(bash, "-e", "-o", "pipefail", "-c", b.Text)
	cmd.Dir = e.Root
	var o, s strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &s
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: %v\n%s", b, err, s.String())
	}
	return "```text\n" + o.String() + "```\n", nil
}

func register(g Generator) {
	if _, dup := Generators[g.Name]; dup {
		panic("docs: generator registered twice: " + g.Name)
	}
	Generators[g.Name] = g
}

func init() {
	register(Generator{Name: "builtin-job", From: "make run (bin/train --out runs/builtin) and train plan --json", Gen: genBuiltinJob, Same: sameBuiltinJob})
	register(Generator{Name: "models-table", From: "train plan --model model/testdata/published/*.config.json --json", Gen: genModelsTable})
	register(Generator{Name: "recipe-counts", From: "train config --check's checks (trainer.Check) on config/testdata/nemo-rl", Gen: genRecipeCounts})
	register(Generator{Name: "plans-recipes", From: "train plan --config RECIPE --model CONFIG --rollouts x --world-size W --shard full|none --json", Gen: genRecipePlans})
	register(Generator{Name: "plan-moe", From: "train plan --config grpo-qwen3-30ba3b-8n8g-megatron.yaml --model qwen3-30b-a3b --world-size 8|16 --shard full --json", Gen: genMoEPlan})
	register(Generator{Name: "plan-moments", From: "train plan --model llama-3.1-8b --world-size 8 --shard full --json, with Adam's moments in float32 and with FusedAdam's bfloat16 ones", Gen: genMomentsPlan})
	register(Generator{Name: "model-caps", From: "package model's size caps (model.MaxLayers, ..., model.MaxTokens)", Gen: genModelCaps})
	register(Generator{Name: "gymdiff-traces", From: "train traces on gym/testdata/gymdiff (its stderr)", Gen: genGymdiffTraces})
}

// plan is the part of train plan --json the docs quote.
type plan struct {
	Model      string `json:"model"`
	Params     int64  `json:"params"`
	Total      int64  `json:"total_bytes"`
	ActWith    int64  `json:"activations_with_checkpointing_bytes"`
	ActWithout int64  `json:"activations_without_checkpointing_bytes"`
	Ckpt       bool   `json:"activation_checkpointing"`
	Components []struct {
		Name  string `json:"name"`
		Bytes int64  `json:"bytes"`
	} `json:"components"`
}

func (p plan) bytes(names ...string) int64 {
	var n int64
	for _, c := range p.Components {
		for _, want := range names {
			if c.Name == want {
				n += c.Bytes
			}
		}
	}
	return n
}

func (e *Env) plan(args ...string) (plan, error) {
	out, _, err := e.Run(append(append([]string{"plan"}, args...), "--json")...)
	if err != nil {
		return plan{}, err
	}
	var p plan
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		return plan{}, fmt.Errorf("train plan %s --json: %v", strings.Join(args, " "), err)
	}
	return p, nil
}

// wrapWidth is where generated prose breaks its lines, as the docs do.
const wrapWidth = 116

// wrap breaks a paragraph into lines of at most wrapWidth characters
// (longer words stand alone), each ending in a newline.
func wrap(text string) string {
	var b strings.Builder
	n := 0
	for _, w := range strings.Fields(text) {
		switch {
		case n == 0:
		case n+1+len([]rune(w)) > wrapWidth:
			b.WriteString("\n")
			n = 0
		default:
			b.WriteString(" ")
			n++
		}
		b.WriteString(w)
		n += len([]rune(w))
	}
	b.WriteString("\n")
	return b.String()
}

func gib(b int64) string { return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30)) }

func mib(b int64) string { return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20)) }

// comma writes n with thousands separators.
func comma(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + comma(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// ---- the built-in job ---------------------------------------------------

// builtinRun is where the generator runs the built-in job, as make run
// does (its own run: README's make run block prints its lines to the test).
const builtinRun = "runs/docs-builtin"

func genBuiltinJob(e *Env) (string, error) {
	dir := filepath.Join(e.Root, builtinRun)
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	_, log, err := e.Run("--out", builtinRun)
	if err != nil {
		return "", err
	}
	if _, _, err := e.Run("plot", "--out", builtinRun); err != nil {
		return "", err
	}
	p, err := e.plan()
	if err != nil {
		return "", err
	}
	ms, torn, err := trainer.ReadMetrics(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		return "", err
	}
	if torn != "" || len(ms) < 2 {
		return "", fmt.Errorf("%s/metrics.jsonl: %d steps (torn tail %q): want the built-in job's whole run", builtinRun, len(ms), torn)
	}
	n, first, last := trainer.RewardEnds(ms)
	files, size := 0, int64(0)
	err = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		files++
		size += info.Size()
		return nil
	})
	if err != nil {
		return "", err
	}
	mid := len(ms) / 2
	line := ""
	for _, l := range strings.Split(log, "\n") {
		if strings.HasPrefix(l, fmt.Sprintf("step %d/", mid)) {
			line = l
		}
	}
	if line == "" {
		return "", fmt.Errorf("the built-in job printed no line for step %d:\n%s", mid, log)
	}
	prose := wrap(fmt.Sprintf("The model, `%s`, has %s parameters. Its %d steps take the mean reward from %.3f over the first %d "+
		"steps to %.3f over the last %d, the same bit for bit on every run on one machine; `runs/builtin` then holds "+
		"`metrics.jsonl`, `config.yaml`, the last two checkpoints and `curves.png`, %.1f MB in %d files. Each step prints a "+
		"line, as step %d did:", p.Model, comma(p.Params), len(ms), first, n, last, n, float64(size)/1e6, files, mid))
	return prose + "\n```text\n" + line + "\n```\n", nil
}

// timingRE matches the parts of the built-in job's part that change from
// run to run: tokens per second, the step's time and the ETA, and the run
// directory's size (metrics.jsonl holds the timings).
var timingRE = regexp.MustCompile(`\d+ tok/s|\| [0-9.]+s, eta [0-9hms.]+|[0-9.]+ MB`)

func sameBuiltinJob(a, b string) bool {
	return timingRE.ReplaceAllString(a, "T") == timingRE.ReplaceAllString(b, "T")
}

// ---- models -------------------------------------------------------------

// published is where the published configs are.
const published = "model/testdata/published"

// supportedRE reads the families train lists when it refuses a model_type.
var supportedRE = regexp.MustCompile(`is not supported; supported: ([a-z0-9_, ]+)`)

func genModelsTable(e *Env) (string, error) {
	probe := filepath.Join(e.Root, "runs", "docs-probe.config.json")
	if err := os.MkdirAll(filepath.Dir(probe), 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(probe, []byte(`{"model_type": "no-such-family"}`), 0o644); err != nil {
		return "", err
	}
	_, stderr, err := e.Run("plan", "--model", probe)
	m := supportedRE.FindStringSubmatch(stderr)
	if err == nil || m == nil {
		return "", fmt.Errorf("train plan of a config with an unknown model_type: %v, stderr %q: want the refusal that lists the families", err, stderr)
	}
	fams := strings.Split(m[1], ", ")
	cfgs, err := filepath.Glob(filepath.Join(e.Root, published, "*.config.json"))
	if err != nil {
		return "", err
	}
	sort.Strings(cfgs)
	byFam := map[string][]string{}
	for _, c := range cfgs {
		var hdr struct {
			ModelType string `json:"model_type"`
		}
		b, err := os.ReadFile(c)
		if err != nil {
			return "", err
		}
		if err := json.Unmarshal(b, &hdr); err != nil {
			return "", fmt.Errorf("%s: %v", c, err)
		}
		rel := published + "/" + filepath.Base(c)
		p, err := e.plan("--model", rel, "--rows", "1", "--seq", "16")
		if err != nil {
			return "", err
		}
		name := strings.TrimSuffix(filepath.Base(c), ".config.json")
		byFam[hdr.ModelType] = append(byFam[hdr.ModelType], fmt.Sprintf("`%s` (%s)", name, comma(p.Params)))
	}
	var b strings.Builder
	b.WriteString("| `model_type` | published configs that load (parameters) |\n|---|---|\n")
	for _, f := range fams {
		list := strings.Join(byFam[f], ", ")
		if list == "" {
			list = "none committed"
		}
		fmt.Fprintf(&b, "| `%s` | %s |\n", f, list)
		delete(byFam, f)
	}
	for f := range byFam {
		return "", fmt.Errorf("%s holds a %s config, which train does not list as a family", published, f)
	}
	return b.String(), nil
}

// genModelCaps states the sizes model.Config.Validate refuses beyond.
func genModelCaps(*Env) (string, error) {
	return wrap(fmt.Sprintf("%s layers, hidden size %s, intermediate size %s, %s heads (and key-value heads) of at most %s "+
		"dimensions, a vocabulary of %s, %s experts a layer and %s in all; a micro-batch "+
		"(`train_micro_batch_size × max_total_sequence_length`, or `--rows × --seq`) holds at most %s tokens (positions "+
		"and offsets are int32).",
		comma(model.MaxLayers), comma(model.MaxHiddenSize), comma(model.MaxIntermediateSize), comma(model.MaxHeads),
		comma(model.MaxHeadDim), comma(model.MaxVocabSize), comma(model.MaxExperts), comma(model.MaxExpertMLPs),
		comma(model.MaxTokens))), nil
}

// ---- recipes ------------------------------------------------------------

// nemorl holds NeMo RL's GRPO configs and their MANIFEST.tsv.
const nemorl = "config/testdata/nemo-rl"

// multiTraceOptIn is the smallest multi-trace opt-in, as NeMo RL's
// command-line overrides.
var multiTraceOptIn = []string{
	"++grpo.gym_multi_trace=true",
	"++env.nemo_gym.token_id_capture.enabled=true",
	"++env.nemo_gym.token_id_capture.all_agents=true",
	"++env.nemo_gym.token_id_capture.delivery=all_traces",
	"++env.nemo_gym.token_id_capture.builder=per_request",
}

func genRecipeCounts(e *Env) (string, error) {
	dir := filepath.Join(e.Root, nemorl)
	recipes, commit, date, err := manifest(filepath.Join(dir, "MANIFEST.tsv"))
	if err != nil {
		return "", err
	}
	loads, refused := 0, 0
	byKey := map[string]int{}
	var wrong []string
	for _, r := range recipes {
		keys, err := classify(filepath.Join(dir, r))
		switch {
		case err != nil:
			wrong = append(wrong, fmt.Sprintf("%s: %v", r, err))
		case keys == nil:
			loads++
		default:
			refused++
			for _, k := range keys {
				byKey[k]++
			}
		}
	}
	if len(wrong) > 0 {
		return "", fmt.Errorf("%d recipes fail otherwise than by a refusal:\n%s", len(wrong), strings.Join(wrong, "\n"))
	}
	type kc struct {
		k string
		n int
	}
	var top []kc
	for k, n := range byKey {
		top = append(top, kc{k, n})
	}
	sort.Slice(top, func(i, j int) bool { return top[i].n > top[j].n || top[i].n == top[j].n && top[i].k < top[j].k })
	var most []string
	for _, x := range top[:min(5, len(top))] {
		most = append(most, fmt.Sprintf("`%s` %d", x.k, x.n))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| GRPO configs of NVIDIA-NeMo/RL `%s` (%s), with the multi-trace opt-in | recipes |\n|---|---|\n", commit[:7], date)
	fmt.Fprintf(&b, "| load and pass every check `train` runs before any work | %d |\n", loads)
	fmt.Fprintf(&b, "| refused before any work, naming what they need that tracegrpo does not do (most often: %s) | %d |\n", strings.Join(most, ", "), refused)
	fmt.Fprintf(&b, "| fail otherwise | 0 |\n| all | %d |\n", len(recipes))
	return b.String(), nil
}

// manifest reads the GRPO configs of MANIFEST.tsv, the upstream commit and
// its date.
func manifest(p string) (recipes []string, commit, date string, err error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, "", "", fmt.Errorf("docs: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# upstream: NVIDIA-NeMo/RL "); ok {
			commit, rest, _ = strings.Cut(rest, " ")
			date = strings.Trim(rest, "()")
			date, _, _ = strings.Cut(date, "T")
		}
		if cols := strings.Split(line, "\t"); !strings.HasPrefix(line, "#") && len(cols) == 3 && cols[1] == "grpo" {
			recipes = append(recipes, cols[0])
		}
	}
	if err := sc.Err(); err != nil {
		return nil, "", "", err
	}
	if len(commit) != 40 || len(recipes) == 0 {
		return nil, "", "", fmt.Errorf("docs: %s: %d GRPO configs, upstream commit %q", p, len(recipes), commit)
	}
	return recipes, commit, date, nil
}

// classify runs the checks train config --check runs on a recipe with the
// multi-trace opt-in: nil keys when it loads, the refused keys when it is
// refused naming them, an error for any other failure.
func classify(path string) (keys []string, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	ld, err := config.LoadSources(config.Sources{Files: []string{path}, Overrides: multiTraceOptIn})
	if err != nil {
		return nil, err
	}
	err = trainer.Check(ld, 0)
	if err == nil {
		return nil, nil
	}
	refused, other := config.SplitRefusals(err)
	if len(other) > 0 {
		return nil, errors.Join(other...)
	}
	seen := map[string]bool{}
	for _, r := range refused {
		if k := r.RefusedKey(); !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	return keys, nil
}

// ---- memory plans -------------------------------------------------------

const recipesDir = nemorl + "/examples/configs/recipes/llm/"

// recipePlans are the recipes docs/memory.md plans at their own shapes.
var recipePlans = []struct {
	recipe, note, model, name string
	world                     int
}{
	{"performance/grpo-llama3.1-8b-instruct-2n8g.yaml", "4096 tokens, checkpointing", "llama-3.1-8b", "Llama-3.1-8B", 8},
	{"grpo-qwen2.5-7b-instruct-4n8g-megatron.yaml", "4096 tokens", "qwen2.5-7b", "Qwen2.5-7B", 8},
	{"grpo-qwen2.5-32b-32n8g-fsdp2tp8-actckpt.v3.yaml", "16384 tokens, checkpointing", "qwen2.5-32b", "Qwen2.5-32B", 16},
}

func genRecipePlans(e *Env) (string, error) {
	var b strings.Builder
	b.WriteString("| recipe | model | ranks | per rank, fully sharded | per rank, unsharded |\n|---|---|---|---|---|\n")
	for _, r := range recipePlans {
		args := []string{"--config", recipesDir + r.recipe, "--model", published + "/" + r.model + ".config.json", "--rollouts", "x", "--world-size", fmt.Sprint(r.world)}
		full, err := e.plan(append(args, "--shard", "full")...)
		if err != nil {
			return "", err
		}
		none, err := e.plan(append(args, "--shard", "none")...)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "| `%s` (%s) | %s | %d | %s | %s |\n", strings.TrimSuffix(r.recipe, ".yaml"), r.note, r.name, r.world, gib(full.Total), gib(none.Total))
	}
	return b.String(), nil
}

func genMoEPlan(e *Env) (string, error) {
	var b strings.Builder
	b.WriteString("| one rank of | weights + bf16 + grads + Adam | gathered + reduce | activations (checkpointing off / on) | reference | total |\n|---|---|---|---|---|---|\n")
	args := []string{"--config", recipesDir + "grpo-qwen3-30ba3b-8n8g-megatron.yaml", "--model", published + "/qwen3-30b-a3b.config.json", "--rollouts", "x"}
	g := func(n int64) string { return fmt.Sprintf("%.2f", float64(n)/(1<<30)) }
	for _, w := range []int{8, 16} {
		p, err := e.plan(append(args, "--world-size", fmt.Sprint(w), "--shard", "full")...)
		if err != nil {
			return "", err
		}
		if p.Ckpt {
			return "", fmt.Errorf("the Qwen3-30B-A3B recipe plans with activation checkpointing on; the table's columns assume off")
		}
		withCkpt := p.Total - p.ActWithout + p.ActWith
		fmt.Fprintf(&b, "| %d | %s + %s + %s + %s GiB | %s + %s GiB | %s / %s GiB | %s GiB | **%s GiB** (%s with checkpointing) |\n", w,
			g(p.bytes("weights")), g(p.bytes("weights_bf16")), g(p.bytes("gradients")), g(p.bytes("adam_moments")),
			g(p.bytes("gathered_weights")), g(p.bytes("gradient_reduce")), g(p.ActWithout), g(p.ActWith),
			g(p.bytes("reference_policy")), g(p.Total), g(withCkpt))
	}
	one, err := e.plan(append(args, "--world-size", "1", "--shard", "none")...)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(&b, "\nUnsharded, one rank holds %s.\n", gib(one.Total))
	return b.String(), nil
}

// fusedAdamBF16 are the overrides of NeMo RL's exp_avg_dtype recipes:
// TransformerEngine's FusedAdam with both moments in bfloat16.
var fusedAdamBF16 = []string{
	"--set", "policy.megatron_cfg.enabled=false", "--set", "policy.dtensor_cfg.enabled=true",
	"--set", "policy.optimizer.name=transformer_engine.pytorch.optimizers.fused_adam.FusedAdam",
	"--set", "policy.optimizer.kwargs.exp_avg_dtype=torch.bfloat16",
	"--set", "policy.optimizer.kwargs.exp_avg_sq_dtype=torch.bfloat16",
}

// genMomentsPlan writes one rank's optimizer state for Llama-3.1-8B on 8
// fully sharded ranks, with float32 moments and with bfloat16 ones.
func genMomentsPlan(e *Env) (string, error) {
	var b strings.Builder
	b.WriteString("| Llama-3.1-8B, one rank of 8, fully sharded | `adam_moments` | `moment_staging` | total |\n|---|---|---|---|\n")
	args := []string{"--model", published + "/llama-3.1-8b.config.json", "--world-size", "8", "--shard", "full"}
	for _, c := range []struct {
		name string
		sets []string
	}{{"AdamW, float32 moments", nil}, {"FusedAdam, bfloat16 moments", fusedAdamBF16}} {
		p, err := e.plan(append(append([]string{}, args...), c.sets...)...)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", c.name, gib(p.bytes("adam_moments")), mib(p.bytes("moment_staging")), gib(p.Total))
	}
	return b.String(), nil
}

// ---- gym ----------------------------------------------------------------

func genGymdiffTraces(e *Env) (string, error) {
	out := filepath.Join(e.Root, "runs", "docs-gymdiff-traces.jsonl")
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", err
	}
	_, stderr, err := e.Run("traces", "--captures", "gym/testdata/gymdiff/captures", "--rollouts", "gym/testdata/gymdiff/rollouts.jsonl", "--out", out)
	if err != nil {
		return "", err
	}
	return "```text\n" + stderr + "```\n", nil
}
