package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/internal/safetensors"
)

// scoreTol: score runs the float32 model; the goldens are float64 PyTorch.
const scoreTol = 5e-5

// TestScoreMatchesPyTorch feeds the golden batch's sequences to train score
// and compares with the PyTorch logprobs and entropies of model/testdata.
func TestScoreMatchesPyTorch(t *testing.T) {
	dir := filepath.Join("..", "..", "model", "testdata", "llama_untied")
	g, err := safetensors.Open(filepath.Join(dir, "golden.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	read := func(name string) []float32 {
		ti, _ := g.Tensor(name)
		v := make([]float32, ti.NumElements())
		if err := g.ReadF32(name, v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	readI := func(name string) []int32 {
		ti, _ := g.Tensor(name)
		raw := make([]byte, ti.End-ti.Begin)
		if err := g.ReadRaw(name, raw); err != nil {
			t.Fatal(err)
		}
		out := make([]int32, len(raw)/4)
		for i := range out {
			out[i] = int32(uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24)
		}
		return out
	}
	tokens, cu, wantLp, wantEnt := readI("tokens"), readI("cu_seqlens"), read("logprob"), read("entropy")
	temp := read("temperature")[0]
	var in bytes.Buffer
	for s := 0; s+1 < len(cu); s++ {
		b, _ := json.Marshal(map[string]any{"token_ids": tokens[cu[s]:cu[s+1]]})
		in.Write(b)
		in.WriteString("\n\n")
	}
	path := filepath.Join(t.TempDir(), "in.jsonl")
	os.WriteFile(path, in.Bytes(), 0o644)
	var out, errb bytes.Buffer
	if code := run([]string{"score", "--model", dir, "--input", path, "--temperature", fmt.Sprint(temp), "--threads", "2"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != len(cu)-1 {
		t.Fatalf("%d output lines for %d sequences", len(lines), len(cu)-1)
	}
	for s, line := range lines {
		var rec scoreOut
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		lo, hi := int(cu[s]), int(cu[s+1])
		if len(rec.Logprobs) != hi-lo-1 || len(rec.Entropy) != hi-lo-1 {
			t.Fatalf("sequence %d of %d tokens: %d logprobs, %d entropies", s, hi-lo, len(rec.Logprobs), len(rec.Entropy))
		}
		for i := range rec.Logprobs {
			if d := math.Abs(float64(rec.Logprobs[i] - wantLp[lo+1+i])); d > scoreTol {
				t.Errorf("sequence %d token %d: logprob %g, PyTorch %g", s, i+1, rec.Logprobs[i], wantLp[lo+1+i])
			}
			if d := math.Abs(float64(rec.Entropy[i] - wantEnt[lo+1+i])); d > scoreTol {
				t.Errorf("sequence %d token %d: entropy %g, PyTorch %g", s, i+1, rec.Entropy[i], wantEnt[lo+1+i])
			}
		}
	}
}

func TestScoreRejects(t *testing.T) {
	dir := filepath.Join("..", "..", "model", "testdata", "llama_untied")
	for _, c := range []struct{ name, input, want string }{
		{"bad json", "{\"token_ids\": [1,\n", "line 1"},
		{"empty", "{\"token_ids\": [1]}\n{\"token_ids\": []}\n", "line 2: field token_ids"},
		{"vocab", "{\"token_ids\": [1, 600]}\n", "token_ids[1]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "in.jsonl")
			os.WriteFile(path, []byte(c.input), 0o644)
			var out, errb bytes.Buffer
			if code := run([]string{"score", "--model", dir, "--input", path}, &out, &errb); code == 0 || !strings.Contains(errb.String(), c.want) {
				t.Fatalf("exit %d, stderr %q: want a failure naming %q", code, errb.String(), c.want)
			}
		})
	}
}
