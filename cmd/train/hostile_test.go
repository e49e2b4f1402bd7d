package main

// Hostile inputs (issue 26): each case is run as a real train process
// with a deadline, so that a hang or an out-of-memory crash fails the
// test instead of stopping it.

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/internal/testtool"
)

// hostileDeadline bounds every hostile case: a refusal is immediate, so
// anything near it is a hang.
const hostileDeadline = 30 * time.Second

// refused runs train with args (and extra environment) as a process and
// checks that it ends within hostileDeadline with exit status code, an
// error naming each of want, and no Go crash.
func refused(t *testing.T, code int, env []string, want []string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hostileDeadline)
	defer cancel()
	// Under a 4 GiB address-space limit, a read without a bound ends in
	// the Go runtime's out-of-memory crash at once, not after the machine
	// (shared by others) has given it all its memory.
	cmd := exec.CommandContext(ctx, testtool.Path(t, "sh", ""), "-c", `ulimit -v 4194304 && exec "$0" -test.run='^$'`, os.Args[0])
	cmd.Env = append(trainCommand(args...).Env, env...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	start := time.Now()
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("train %s: still running after %v (killed)\n%s", strings.Join(args, " "), time.Since(start).Round(time.Second), stderr.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != code {
		t.Fatalf("train %s: %v, want exit status %d\n%s", strings.Join(args, " "), err, code, stderr.String())
	}
	out := stderr.String()
	for _, bad := range []string{"fatal error", "goroutine ", "panic:", "out of memory"} {
		if strings.Contains(out, bad) {
			t.Fatalf("train %s: a crash (%q):\n%s", strings.Join(args, " "), bad, out)
		}
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("train %s: the output does not say %q:\n%s", strings.Join(args, " "), w, out)
		}
	}
	return out
}

// modelDirWith copies model/testdata/qwen3_untied into a temporary
// directory and replaces the file named fifo (if any) by a named pipe with
// no writer.
func modelDirWith(t *testing.T, fifo string) string {
	t.Helper()
	src := filepath.Join("..", "..", "model", "testdata", "qwen3_untied")
	dir := filepath.Join(t.TempDir(), "model")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"config.json", "model.safetensors"} {
		p := filepath.Join(dir, f)
		if f == fifo {
			if err := syscall.Mkfifo(p, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestInputThatIsAFIFO (issue 26, item 5): config.json or
// model.safetensors as a named pipe with no writer hung score, plan, bench
// and --init-from. Each is now refused at once, naming the file.
func TestInputThatIsAFIFO(t *testing.T) {
	in := filepath.Join(t.TempDir(), "in.jsonl")
	if err := os.WriteFile(in, []byte(`{"token_ids": [1, 2, 3]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, fifo := range []string{"config.json", "model.safetensors"} {
		t.Run(fifo, func(t *testing.T) {
			dir := modelDirWith(t, fifo)
			want := []string{filepath.Join(dir, fifo), "not a regular file", "named pipe"}
			refused(t, 1, nil, want, "score", "--model", dir, "--input", in)
			refused(t, 1, nil, want, "--backend", "cpu", "--quiet", "--out", filepath.Join(t.TempDir(), "run"), "--init-from", dir, "--steps", "1",
				"--set", "grpo.num_prompts_per_step=1", "--set", "grpo.num_generations_per_prompt=2")
			if fifo == "config.json" {
				refused(t, 1, nil, want, "plan", "--init-from", dir)
				refused(t, 1, nil, want, "plan", "--model", filepath.Join(dir, fifo))
				refused(t, 1, nil, want, "bench", "--model", filepath.Join(dir, fifo), "--rows", "1", "--seq", "4", "--steps", "1")
			} else {
				refused(t, 1, nil, want, "bench", "--model", filepath.Join(dir, "config.json"), "--weights", dir, "--rows", "1", "--seq", "4", "--steps", "1")
			}
		})
	}
}

// TestEndlessInput (issue 26, item 10): plan --model /dev/zero and config
// --config /dev/zero read without limit until the Go runtime died out of
// memory with a goroutine dump. Both are refused at once, and so is a
// recipe or config.json beyond its kind's size cap.
func TestEndlessInput(t *testing.T) {
	want := []string{"/dev/zero", "not a regular file", "character device"}
	refused(t, 1, nil, want, "plan", "--model", "/dev/zero")
	refused(t, 1, nil, want, "config", "--config", "/dev/zero")
	refused(t, 1, nil, want, "--backend", "cpu", "--config", "/dev/zero", "--out", filepath.Join(t.TempDir(), "run"))
	big := filepath.Join(t.TempDir(), "big.yaml")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil { // sparse: 1 GiB of zeros on no disk
		t.Fatal(err)
	}
	f.Close()
	refused(t, 1, nil, []string{big, "at most"}, "config", "--config", big)
	refused(t, 1, nil, []string{big, "at most"}, "plan", "--model", big)
}

// modelConfigWith writes model/testdata/qwen3_tied's config.json with the
// given fields replaced and returns its path.
func modelConfigWith(t *testing.T, fields map[string]any) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "model", "testdata", "qwen3_tied", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	for k, v := range fields {
		c[k] = v
	}
	if b, err = json.Marshal(c); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestModelSizesCapped (issue 26, items 8 and 11): a config.json with a
// million layers was accepted and planned for over a minute; one with
// every size at 2^24 ran out of memory building the parameter table. Each
// size is capped at what a model can be and refused by name at once.
func TestModelSizesCapped(t *testing.T) {
	const p24 = 1 << 24
	layers := modelConfigWith(t, map[string]any{"num_hidden_layers": 1000000})
	refused(t, 1, nil, []string{"num_hidden_layers", "1000000", "expected an integer in [1, 1024]"}, "plan", "--model", layers)
	refused(t, 1, nil, []string{"num_hidden_layers"}, "bench", "--model", layers, "--rows", "1", "--seq", "4", "--steps", "1")
	all := modelConfigWith(t, map[string]any{"hidden_size": p24, "intermediate_size": p24, "num_hidden_layers": p24,
		"num_attention_heads": p24, "num_key_value_heads": p24, "head_dim": p24, "vocab_size": p24})
	refused(t, 1, nil, []string{"expected an integer in [1, "}, "plan", "--model", all)
}

// TestSizeArithmeticRefusesOverflow (issue 26, items 9 and 13): sizes whose
// products wrapped around int64 gave a 20.9 MiB plan that passed and then
// a makeslice panic, negative byte counts with exit 0, and negative
// numbers in messages. Each is now refused, naming the key or flag (exit 2
// for a flag, 1 for a config value or the environment).
func TestSizeArithmeticRefusesOverflow(t *testing.T) {
	const big = "9223372036854775807"
	seqSet := "policy.max_total_sequence_length=1152921504606846978"
	refused(t, 1, nil, []string{"policy.max_total_sequence_length", "1152921504606846978"}, "plan", "--set", seqSet)
	refused(t, 1, nil, []string{"policy.max_total_sequence_length", "1152921504606846978"},
		"--backend", "cpu", "--quiet", "--set", seqSet, "--out", filepath.Join(t.TempDir(), "run"))
	out := refused(t, 2, nil, []string{"--rows", "--seq", big}, "plan", "--rows", big, "--seq", big)
	if strings.Contains(out, "-") && strings.Contains(out, " B ") {
		t.Errorf("plan printed a negative byte count:\n%s", out)
	}
	refused(t, 2, nil, []string{"--rows", "--seq"}, "plan", "--rows", "65536", "--seq", "65536")
	cfg := filepath.Join("..", "..", "model", "testdata", "qwen3_tied", "config.json")
	refused(t, 2, nil, []string{"--rows", "--seq"}, "bench", "--model", cfg, "--rows", "3", "--seq", "3074457345618258603", "--steps", "1")
	refused(t, 2, nil, []string{"--rows", "--seq"}, "bench", "--model", cfg, "--rows", "4611686018427387904", "--seq", "4", "--steps", "1")
	in := filepath.Join(t.TempDir(), "in.jsonl")
	if err := os.WriteFile(in, []byte(`{"token_ids": [1, 2, 3]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	refused(t, 2, nil, []string{"--max-tokens", big}, "score", "--model", filepath.Dir(cfg), "--input", in, "--max-tokens", big)
	refused(t, 1, []string{"TRACEGRPO_MEMORY=99999999999999999999G"}, []string{"$TRACEGRPO_MEMORY", "99999999999999999999G"},
		"--backend", "cpu", "--quiet", "--out", filepath.Join(t.TempDir(), "run"), "--steps", "1")
	// 3 × 6148914691236517206 generations wrapped around to a batch of 2.
	wrap := []string{"--set", "grpo.num_prompts_per_step=3", "--set", "grpo.num_generations_per_prompt=6148914691236517206", "--set", "policy.train_global_batch_size=2"}
	refused(t, 1, nil, []string{"grpo.num_generations_per_prompt", "want at most"}, append([]string{"config", "--check"}, wrap...)...)
	refused(t, 1, nil, []string{"grpo.num_generations_per_prompt", "want at most"},
		append([]string{"--backend", "cpu", "--quiet", "--out", filepath.Join(t.TempDir(), "run")}, wrap...)...)
}

// TestTracesJobsCapped (issue 26, item 12): traces --jobs 100000000 ran out
// of memory sizing its batch; --jobs is capped and refused by name.
func TestTracesJobsCapped(t *testing.T) {
	dir := t.TempDir()
	recs := filepath.Join(dir, "r.jsonl")
	if err := os.WriteFile(recs, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	refused(t, 2, nil, []string{"--jobs", "100000000"}, "traces", "--captures", dir, "--rollouts", recs, "--jobs", "100000000")
}

// failingWriter fails every write, as a full disk or a closed pipe does.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, syscall.ENOSPC }

// TestFailedOutputIsAFailure (issue 26, item 14): plan, bench and verify
// exited 0 when writing their output failed (>/dev/full). Every command's
// output is checked: a failed write is exit status 1, saying so.
func TestFailedOutputIsAFailure(t *testing.T) {
	run1 := filepath.Join(t.TempDir(), "run")
	mustTrain(t, trainArgs(run1, 2)...)
	cfg := filepath.Join("..", "..", "model", "testdata", "qwen3_tied", "config.json")
	for _, args := range [][]string{
		{"plan"},
		{"plan", "--json"},
		{"bench", "--model", cfg, "--rows", "1", "--seq", "8", "--steps", "1"},
		{"verify", run1},
		{"config"},
		{"--help"},
		{"plan", "--help"},
	} {
		var stderr bytes.Buffer
		code := run(args, failingWriter{}, &stderr)
		if code != 1 || !strings.Contains(stderr.String(), "write") || !strings.Contains(stderr.String(), "no space left") {
			t.Errorf("train %s with a failing stdout: exit %d, stderr %q; want exit 1 saying the write failed", strings.Join(args, " "), code, stderr.String())
		}
	}
	// And as a process, with /dev/full as its standard output.
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skipf("NOT RUN as a process: %v", err)
	}
	defer full.Close()
	cmd := trainCommand("plan")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = full, &stderr
	if err := cmd.Run(); cmd.ProcessState.ExitCode() != 1 {
		t.Errorf("train plan >/dev/full: %v, want exit status 1\n%s", err, stderr.String())
	}
}

// overflowingModel writes model/testdata/qwen3_untied with tensor's weights
// multiplied by scale and returns its directory.
func overflowingModel(t *testing.T, tensor string, scale float32) string {
	t.Helper()
	src := filepath.Join("..", "..", "model", "testdata", "qwen3_untied")
	dir := filepath.Join(t.TempDir(), "model")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(filepath.Join(src, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ts []safetensors.Tensor
	for _, info := range f.Tensors() {
		v := make([]float32, info.NumElements())
		if err := f.ReadF32(info.Name, v); err != nil {
			t.Fatal(err)
		}
		if info.Name == tensor {
			for i := range v {
				v[i] *= scale
			}
		}
		ts = append(ts, safetensors.Tensor{Spec: safetensors.Spec{Name: info.Name, DType: safetensors.F32, Shape: info.Shape}, F32: v})
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestScoreNonFiniteNamesTheLine (issue 26, item 15): score on weights that
// overflow printed "json: unsupported value: NaN", with no line number and
// an empty output. The lines scored before are written, and the error names
// the input line and token whose log-probability is not finite.
func TestScoreNonFiniteNamesTheLine(t *testing.T) {
	// Finite weights whose logits overflow float32.
	dir := overflowingModel(t, "lm_head.weight", 1e38)
	in := filepath.Join(t.TempDir(), "in.jsonl")
	if err := os.WriteFile(in, []byte("\n"+`{"token_ids": [1, 2, 3, 4]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run([]string{"score", "--model", dir, "--input", in}, &stdout, &stderr)
	msg := stderr.String()
	if code != 1 || !strings.Contains(msg, "in.jsonl line 2") || !strings.Contains(msg, "token_ids[1]") || strings.Contains(msg, "json: unsupported value") {
		t.Errorf("score on overflowing weights: exit %d, stderr:\n%s\nwant exit 1 naming in.jsonl line 2 and the token", code, msg)
	}
}

// TestTracesOutNeverInsideTheCaptures (issue 26, item 2): traces --out
// CAP/<a capture file> replaced a file inside the capture store being
// read. Any output inside the store (an existing file or a new name) is
// refused, and every file of the store keeps its bytes.
func TestTracesOutNeverInsideTheCaptures(t *testing.T) {
	caps, recs := tracesFixture(t, "")
	ents, err := os.ReadDir(caps)
	if err != nil || len(ents) == 0 {
		t.Fatalf("capture store: %v, %d files", err, len(ents))
	}
	before := map[string][]byte{}
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(caps, e.Name()))
		before[e.Name()] = b
	}
	for _, out := range []string{filepath.Join(caps, ents[0].Name()), filepath.Join(caps, "new.jsonl"), filepath.Join(caps, "sub", "x.jsonl")} {
		var stderr bytes.Buffer
		code := run([]string{"traces", "--captures", caps, "--rollouts", recs, "--out", out}, &bytes.Buffer{}, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), "--captures") || !strings.Contains(stderr.String(), "inside") {
			t.Errorf("--out %s: exit %d, %q; want a usage error naming --captures", out, code, stderr.String())
		}
	}
	after, _ := os.ReadDir(caps)
	if len(after) != len(ents) {
		t.Errorf("the capture store holds %d files after the refusals, %d before", len(after), len(ents))
	}
	for name, b := range before {
		if got, _ := os.ReadFile(filepath.Join(caps, name)); !bytes.Equal(got, b) {
			t.Errorf("%s changed", name)
		}
	}
}

// TestFullDiskLeavesCheckpointsIntact (issue 26, a case that passed, kept):
// a disk that fills up while a checkpoint is written (no file may grow past
// 700 KB; the optimizer's file needs more) ends the run with exit status 1
// naming the file, leaves no partial checkpoint, no metrics line of the
// step, and every earlier checkpoint verifies; with room again, --resume
// finishes the run.
func TestFullDiskLeavesCheckpointsIntact(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	sets := []string{"--set", "checkpointing.save_period=1", "--set", "policy.megatron_cfg.scheduler.lr_decay_iters=100"}
	mustTrain(t, append(trainArgs(out, 2), sets...)...)
	cmd := trainCommand(append(append(trainArgs(out, 4), sets...), "--resume")...)
	cmd.Env = append(cmd.Env, fileSizeLimitEnv+"=700000")
	b, _ := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(string(b), "optimizer.safetensors") || !strings.Contains(string(b), "file too large") {
		t.Fatalf("a full disk during step 3's checkpoint: exit %d, want 1 naming the file:\n%s", code, b)
	}
	mustVerify(t, out)
	ents, _ := os.ReadDir(filepath.Join(out, "checkpoints"))
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "step_1 step_2" {
		t.Errorf("checkpoints after the full disk: %v, want step_1 step_2 and nothing partial", names)
	}
	if ms := readMetricsNoTimes(t, out); len(ms) != 2 {
		t.Errorf("%d metrics lines, want 2 (step 3's checkpoint failed before its line)", len(ms))
	}
	mustTrain(t, append(append(trainArgs(out, 4), sets...), "--resume")...)
	if ms := readMetricsNoTimes(t, out); len(ms) != 4 {
		t.Errorf("%d steps after resuming with room again, want 4", len(ms))
	}
	mustVerify(t, out)
}

// TestLyingSafetensorsHeaders (issue 26, a case that passed, kept): a
// model.safetensors whose header lies (a header length past the file, a
// tensor past the data, a shape that overflows, offsets that overlap) is
// refused by score, bench --weights and --init-from with exit status 1,
// naming the file, before anything is allocated from the lie.
func TestLyingSafetensorsHeaders(t *testing.T) {
	in := filepath.Join(t.TempDir(), "in.jsonl")
	if err := os.WriteFile(in, []byte(`{"token_ids": [1, 2, 3]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	header := func(h string, data int) []byte {
		b := make([]byte, 8, 8+len(h)+data)
		binary.LittleEndian.PutUint64(b, uint64(len(h)))
		return append(append(b, h...), make([]byte, data)...)
	}
	huge := make([]byte, 16)
	binary.LittleEndian.PutUint64(huge, 1<<62)
	for _, tc := range []struct {
		name string
		file []byte
	}{
		{"header length past the file", huge},
		{"tensor past the data", header(`{"model.embed_tokens.weight":{"dtype":"F32","shape":[1000000000],"data_offsets":[0,4000000000]}}`, 16)},
		{"shape overflows", header(`{"model.embed_tokens.weight":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}}`, 4)},
		{"offsets overlap", header(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 4)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := modelDirWith(t, "")
			st := filepath.Join(dir, "model.safetensors")
			if err := os.WriteFile(st, tc.file, 0o644); err != nil {
				t.Fatal(err)
			}
			want := []string{st}
			refused(t, 1, nil, want, "score", "--model", dir, "--input", in)
			refused(t, 1, nil, want, "bench", "--model", filepath.Join(dir, "config.json"), "--weights", dir, "--rows", "1", "--seq", "4", "--steps", "1")
			refused(t, 1, nil, want, "--backend", "cpu", "--quiet", "--out", filepath.Join(t.TempDir(), "run"), "--init-from", dir, "--steps", "1",
				"--set", "grpo.num_prompts_per_step=1", "--set", "grpo.num_generations_per_prompt=2")
		})
	}
}

// TestLongValuesCutInMessages (issue 34): a message quotes at most a few
// hundred bytes of a value a user gave, then says its length, whichever
// package wrote it: a 120 KB launcher variable, flag values and a config
// value. The whole of stderr stays short.
func TestLongValuesCutInMessages(t *testing.T) {
	long := strings.Repeat("7x", 60_000) // 120,000 bytes
	out := t.TempDir()
	for _, c := range []struct {
		name string
		code int
		env  []string
		args []string
	}{
		{"a launcher variable", 1, []string{"RANK=" + long, "WORLD_SIZE=2"}, []string{"--out", filepath.Join(out, "a"), "--steps", "1"}},
		{"plan --memory", 2, nil, []string{"plan", "--memory", long}},
		{"export --dtype", 2, nil, []string{"export", out, "--out", filepath.Join(out, "x"), "--dtype", long}},
		{"a model name", 1, nil, []string{"--out", filepath.Join(out, "b"), "--steps", "1", "--set", "policy.model_name=" + long}},
	} {
		t.Run(c.name, func(t *testing.T) {
			msg := refused(t, c.code, c.env, []string{"(120000 bytes)"}, c.args...)
			if len(msg) > 4096 {
				t.Errorf("%d bytes of messages for a 120 KB value:\n%.2000s", len(msg), msg)
			}
		})
	}
}

// TestBenchFlagMessages (issue 34): a bad bench count is a usage error
// (exit 2) naming that flag alone: --mb-tokens -5 used to blame --rows,
// --seq and --steps, and a --mb-tokens past what a micro-batch can hold
// failed with exit 1 naming model.Options.MaxTokens; a --tree whose
// product is too large is refused before it is built.
func TestBenchFlagMessages(t *testing.T) {
	cfg := "../../model/testdata/qwen3_untied/config.json"
	for _, c := range []struct {
		args []string
		want string
		not  []string
	}{
		{[]string{"--tree", "1,2,3", "--mb-tokens", "-5"}, "--mb-tokens -5", []string{"--rows", "--seq", "--steps"}},
		{[]string{"--tree", "1,2,3", "--mb-tokens", "4294967296"}, "--mb-tokens 4294967296", []string{"MaxTokens", "--rows"}},
		{[]string{"--steps", "0"}, "--steps 0", []string{"--rows", "--seq", "--mb-tokens"}},
		{[]string{"--tree", "1,1048576,1048576"}, "1048576 traces, 1099512676352 trace tokens", nil},
	} {
		msg := refused(t, 2, nil, []string{c.want}, append([]string{"bench", "--model", cfg}, c.args...)...)
		for _, n := range c.not {
			if strings.Contains(msg, n) {
				t.Errorf("bench %v: the message names %s:\n%s", c.args, n, msg)
			}
		}
	}
}
