package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"

	"github.com/tracegrpo/tracegrpo/internal/inputfile"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/trainer"
)

func init() {
	register(command{
		name:    "score",
		summary: "log-probability and entropy of each token of JSONL token_ids under an HF model (CPU)",
		run:     runScore,
	})
}

// scoreBudget is the default of --max-tokens: the most tokens packed into
// one forward pass of score.
const scoreBudget = 4096

// scoreLine is one input record.
type scoreLine struct {
	TokenIDs []int32 `json:"token_ids"`
}

// scoreOut is one output record: entries i is for input token i+1.
type scoreOut struct {
	Logprobs []float32 `json:"logprobs"`
	Entropy  []float32 `json:"entropy"`
}

func runScore(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("score", "train score --model DIR --input FILE [--temperature T]", stdout)
	dir := fs.String("model", "", "HF model directory (config.json + model.safetensors or a sharded index)")
	input := fs.String("input", "", `JSONL file of {"token_ids": [...]} ("-" for stdin)`)
	temp := fs.Float32("temperature", 1, "divide the logits by this before the softmax")
	threads := fs.Int("threads", 0, "CPU threads (0: all)")
	budget := fs.Int("max-tokens", scoreBudget, "most tokens per forward pass: lines are packed into passes of this many tokens; a longer line gets a pass of its own")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *dir == "" || *input == "" {
		return fmt.Errorf("%w: score needs --model and --input", errUsage)
	}
	if *budget <= 0 || *budget > model.MaxTokens {
		return fmt.Errorf("%w: --max-tokens must be in [1, %d] (token offsets are int32), found %d", errUsage, model.MaxTokens, *budget)
	}
	if !(*temp > 0) {
		return fmt.Errorf("%w: --temperature must be positive, found %g", errUsage, *temp)
	}
	var in io.Reader = os.Stdin
	name := "stdin"
	if *input != "-" {
		f, err := inputfile.Open(*input, inputfile.Records)
		if err != nil {
			return fmt.Errorf("score: %w", err)
		}
		defer f.Close()
		in, name = f, *input
	}
	cfg, err := model.LoadConfig(filepath.Join(*dir, "config.json"))
	if err != nil {
		return fmt.Errorf("score: %w", err)
	}
	for _, n := range cfg.Notes {
		fmt.Fprintf(stderr, "score: note: %s\n", n)
	}
	// Read every record first so the model is sized once.
	var recs [][]int32
	var lines []int // each record's input line
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<30)
	longest, longestLine := 0, 0
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var rec scoreLine
		dec := json.NewDecoder(bytes.NewReader(b))
		if err := dec.Decode(&rec); err != nil {
			return fmt.Errorf("score: %s line %d: %w", name, line, err)
		}
		if len(rec.TokenIDs) == 0 {
			return fmt.Errorf("score: %s line %d: field token_ids: expected at least one token, found none", name, line)
		}
		for i, x := range rec.TokenIDs {
			if x < 0 || int(x) >= cfg.VocabSize {
				return fmt.Errorf("score: %s line %d: field token_ids[%d]: expected an id in [0, %d), found %d", name, line, i, cfg.VocabSize, x)
			}
		}
		if mpe := cfg.MaxPositionEmbeddings; mpe > 0 && len(rec.TokenIDs) > mpe {
			return fmt.Errorf("score: %s line %d: field token_ids: %d tokens, more than the model's max_position_embeddings %d (config.json): a line is scored in one forward pass, within the model's context",
				name, line, len(rec.TokenIDs), mpe)
		}
		recs = append(recs, rec.TokenIDs)
		lines = append(lines, line)
		if len(rec.TokenIDs) > longest {
			longest, longestLine = len(rec.TokenIDs), line
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("score: %s: %w", name, err)
	}
	if len(recs) == 0 {
		return nil
	}
	b, err := newCPU(*threads)
	if err != nil {
		return fmt.Errorf("score: %w", err)
	}
	defer b.Close()
	fmt.Fprintf(stderr, "score: backend cpu (%d threads), %s\n", b.Threads(), cpu.SIMDChoice())
	T := max(*budget, longest)
	opt := func(T int) model.Options { return model.Options{MaxTokens: T, MaxSeqs: T, ForwardOnly: true} }
	plan := func(T int) (*trainer.MemPlan, error) {
		return trainer.PlanModelRun(trainer.PlanSpec{
			Request: trainer.PlanRequest{Model: cfg, ModelName: *dir, Backend: "cpu", Workspace: b.PlanWorkspace},
			Options: opt(T), Shrink: map[string][]string{"activations": {"--max-tokens"}, "workspace": {"--max-tokens"}},
		})
	}
	p, err := plan(T)
	if err != nil {
		return fmt.Errorf("score: %w", err)
	}
	if free, source, ok, err := trainer.Free(b); err != nil {
		return fmt.Errorf("score: %w", err)
	} else if ok && p.TotalBytes > free {
		if longest > *budget {
			// The longest line needs a pass of its own: say which line,
			// and the longest that would fit.
			fits := sort.Search(longest, func(n int) bool {
				q, err := plan(n + 1)
				return err != nil || q.TotalBytes > free
			})
			return fmt.Errorf("score: %s line %d: %d tokens in one forward pass need %s, %s is free (%s): the longest line that fits is %d tokens",
				name, longestLine, longest, trainer.Bytes(p.TotalBytes), trainer.Bytes(free), source, fits)
		}
		return fmt.Errorf("score: %w", p.Check(free, source))
	}
	m, err := model.New(b, cfg, opt(T))
	if err != nil {
		return fmt.Errorf("score: %w", err)
	}
	defer m.Close()
	if err := m.LoadHF(*dir); err != nil {
		return fmt.Errorf("score: %w", err)
	}
	w := bufio.NewWriter(stdout)
	enc := json.NewEncoder(w)
	var tokens, cu []int32
	for start := 0; start < len(recs); {
		tokens, cu = tokens[:0], append(cu[:0], 0)
		end := start
		for end < len(recs) && len(tokens)+len(recs[end]) <= T {
			tokens = append(tokens, recs[end]...)
			cu = append(cu, int32(len(tokens)))
			end++
		}
		lp, ent, err := m.Forward(tokens, cu, *temp)
		if err != nil {
			return fmt.Errorf("score: records %d to %d: %w", start+1, end, err)
		}
		for s := 0; s < end-start; s++ {
			lo, hi := cu[s]+1, cu[s+1]
			if i := firstNonFinite(lp[lo:hi], ent[lo:hi]); i >= 0 {
				// The lines before are written; this one has no JSON form.
				w.Flush()
				return fmt.Errorf("score: %s line %d: token_ids[%d]=%d: log-probability %v, entropy %v: the model's logits overflow float32 or its weights are not finite; nothing after this line is scored",
					name, lines[start+s], i+1, recs[start+s][i+1], lp[lo+int32(i)], ent[lo+int32(i)])
			}
			if err := enc.Encode(scoreOut{Logprobs: nonNil(lp[lo:hi]), Entropy: nonNil(ent[lo:hi])}); err != nil {
				return fmt.Errorf("score: %w", err)
			}
		}
		start = end
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("score: %w", err)
	}
	return nil
}

// firstNonFinite returns the first index where a or b is NaN or ±Inf, or
// -1.
func firstNonFinite(a, b []float32) int {
	for i := range a {
		if x, y := float64(a[i]), float64(b[i]); math.IsNaN(x) || math.IsInf(x, 0) || math.IsNaN(y) || math.IsInf(y, 0) {
			return i
		}
	}
	return -1
}

// nonNil makes an empty slice encode as [] rather than null.
func nonNil(x []float32) []float32 {
	if x == nil {
		return []float32{}
	}
	return x
}
