// Package nemorlgolden reads kernels/testdata/nemorl_topk_topp.json, the
// golden of NeMo RL's top-k/top-p filter that scripts/nemorl_topk_topp.py
// writes by running NeMo RL's own apply_top_k_top_p under Debian's torch
// (its header describes every field). Tests of the filter in kernels,
// kernels/cpu and kernels/kerneltest share it.
package nemorlgolden

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"testing"
)

// Golden is the whole file.
type Golden struct {
	Meta struct {
		Script       string `json:"script"`
		Seed         int64  `json:"seed"`
		Torch        string `json:"torch"`
		NeMoRLCommit string `json:"nemo_rl_commit"`
		NeMoRLFile   string `json:"nemo_rl_file"`
	} `json:"meta"`
	Cases []*Case `json:"cases"`
}

// Case is Rows rows of V logits under one filter and temperature.
type Case struct {
	Name        string  `json:"name"`
	V           int     `json:"V"`
	Rows        int     `json:"rows"`
	TopK        *int    `json:"top_k"`
	TopP        float64 `json:"top_p"`
	Temperature float64 `json:"temperature"`
	Error       string  `json:"error"` // NeMo RL raised (top_k > V)
	Targets     []int32 `json:"targets"`
	Kept        []int   `json:"kept"` // tokens kept per row
	LSE         []Num   `json:"lse"`
	LP          []Num   `json:"lp"`
	Ent         []Num   `json:"ent"`

	RawB64  string `json:"logits"`
	KeepB64 string `json:"keep"`
	DzB64   string `json:"dz"`

	raw, dz []float32
	keep    []byte
}

// Num is a JSON number or "-inf"/"inf".
type Num float64

// UnmarshalJSON reads a number or an infinity spelled as a string.
func (n *Num) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case `"-inf"`:
		*n = Num(math.Inf(-1))
		return nil
	case `"inf"`:
		*n = Num(math.Inf(1))
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	*n = Num(f)
	return nil
}

// Load reads the golden at path (relative to the caller's package
// directory) and decodes its arrays.
func Load(t testing.TB, path string) *Golden {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read the NeMo RL top-k/top-p golden: %v (regenerate: /usr/bin/python3 scripts/nemorl_topk_topp.py --mirror <NeMo RL git dir>)", err)
	}
	var g Golden
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for _, c := range g.Cases {
		if c.raw, err = f32s(c.RawB64, c.Rows*c.V); err != nil {
			t.Fatalf("%s: case %s: logits: %v", path, c.Name, err)
		}
		if c.Error != "" {
			continue
		}
		if c.dz, err = f32s(c.DzB64, c.Rows*c.V); err != nil {
			t.Fatalf("%s: case %s: dz: %v", path, c.Name, err)
		}
		if c.keep, err = base64.StdEncoding.DecodeString(c.KeepB64); err != nil || len(c.keep) != c.Rows*c.V {
			t.Fatalf("%s: case %s: keep: %d bytes, %v; want %d", path, c.Name, len(c.keep), err, c.Rows*c.V)
		}
		if len(c.Targets) != c.Rows || len(c.LP) != c.Rows || len(c.LSE) != c.Rows || len(c.Ent) != c.Rows || len(c.Kept) != c.Rows {
			t.Fatalf("%s: case %s: per-row arrays do not have %d entries", path, c.Name, c.Rows)
		}
	}
	return &g
}

func f32s(b64 string, n int) ([]float32, error) {
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, err
	}
	if len(b) != 4*n {
		return nil, fmt.Errorf("%d bytes, want %d", len(b), 4*n)
	}
	out := make([]float32, n)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out, nil
}

// Raw is row r's logits before the temperature.
func (c *Case) Raw(r int) []float32 { return c.raw[r*c.V : (r+1)*c.V] }

// Scaled is row r's logits divided by the temperature in float32, as NeMo
// RL's logits.div_(temperature) computes them.
func (c *Case) Scaled(r int) []float32 {
	out := make([]float32, c.V)
	for i, x := range c.Raw(r) {
		if c.Temperature == 1 {
			out[i] = x
		} else {
			out[i] = x / float32(c.Temperature)
		}
	}
	return out
}

// Keep reports whether NeMo RL keeps token i of row r.
func (c *Case) Keep(r, i int) bool { return c.keep[r*c.V+i] != 0 }

// Dz is row r's d logprob[target] / d raw logits.
func (c *Case) Dz(r int) []float32 { return c.dz[r*c.V : (r+1)*c.V] }

// TieAtBoundary reports whether row r has a value with some tokens kept
// and some not: a tie group straddling a threshold.
func (c *Case) TieAtBoundary(r int) bool {
	kept := map[float32]int{}
	dropped := map[float32]int{}
	for i, x := range c.Raw(r) {
		if c.Keep(r, i) {
			kept[x]++
		} else {
			dropped[x]++
		}
	}
	for x := range kept {
		if dropped[x] > 0 {
			return true
		}
	}
	return false
}
