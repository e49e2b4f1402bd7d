package gym

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// The benchmark store of issue 2: 512 rollouts x 8 calls x (1024 prompt +
// 256 generated tokens), written once per process outside the timer.
const (
	benchRollouts = 512
	benchCalls    = 8
	benchPrompt   = 1024
	benchGen      = 256
)

type benchData struct {
	dir        string
	records    [][]byte
	storeBytes int64
	genTokens  int
}

var (
	benchOnce  sync.Once
	benchStore benchData
	benchErr   error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if benchStore.dir != "" {
		os.RemoveAll(benchStore.dir)
	}
	os.Exit(code)
}

// makeBenchStore writes rollouts x calls independent root calls (Qwen-sized
// vocabulary, logprobs with full float64 precision) and their records.
func makeBenchStore(dir string, rollouts, calls, prompt, gen int) (benchData, error) {
	d := benchData{dir: dir}
	rng := rand.New(rand.NewPCG(42, 43))
	root := ParentRoot
	for r := 0; r < rollouts; r++ {
		rid := fmt.Sprintf("%d-0", r)
		entries := make([]TokenEntry, calls)
		for c := range entries {
			e := &entries[c]
			*e = TokenEntry{SchemaVersion: 3, RolloutID: rid, ModelCallID: fmt.Sprintf("%032x", rng.Uint64()),
				Model: "Qwen/Qwen3-0.6B", CreatedAt: 1.7e9 + float64(c), ParentResolution: &root,
				PromptTokenIDs: make([]int32, prompt), GenerationTokenIDs: make([]int32, gen), GenerationLogProbs: make([]float64, gen)}
			for i := range e.PromptTokenIDs {
				e.PromptTokenIDs[i] = int32(rng.IntN(151936))
			}
			for i := range e.GenerationTokenIDs {
				e.GenerationTokenIDs[i] = int32(rng.IntN(151936))
				e.GenerationLogProbs[i] = -rng.ExpFloat64()
			}
			e.Stamp()
			d.genTokens += gen
		}
		path := filepath.Join(dir, rid+SuffixEntries)
		if err := writeEntriesFile(path, entries); err != nil {
			return d, err
		}
		st, err := os.Stat(path)
		if err != nil {
			return d, err
		}
		d.storeBytes += st.Size()
		d.records = append(d.records, fmt.Appendf(nil, `{"reward":1.0,"response":{"id":"resp"},"_ng_task_index":%d,"_ng_rollout_index":0}`, r))
	}
	return d, nil
}

func loadBenchStore(b *testing.B) benchData {
	b.Helper()
	benchOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gym-bench-")
		if err != nil {
			benchErr = err
			return
		}
		benchStore, benchErr = makeBenchStore(dir, benchRollouts, benchCalls, benchPrompt, benchGen)
		benchStore.dir = dir
	})
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	return benchStore
}

// finalizeAll is the whole step: parse each record, read its snapshot,
// build, project, validate and attach the envelope, re-encode the record;
// jobs rollouts at a time.
func finalizeAll(d benchData, r *Reader, builder string, jobs int) (traces int, err error) {
	recs := make([]*Record, len(d.records))
	for i, raw := range d.records {
		if recs[i], err = ParseRecord(raw); err != nil {
			return 0, err
		}
	}
	results, err := FinalizeBatch(recs, r, builder, false, jobs)
	if err != nil {
		return 0, err
	}
	var line []byte
	for i, res := range results {
		if res.Masked {
			return 0, fmt.Errorf("rollout %s masked: %s", res.RolloutID, res.Reason)
		}
		traces += len(res.Envelope.Traces)
		line = recs[i].AppendJSON(line[:0])
	}
	return traces, nil
}

// BenchmarkFinalizeStore reports store MB/s and generated tokens/s for the
// whole finalization step. Compare with BenchmarkReferenceEncodingJSON (the
// same store decoded by encoding/json without building anything).
func BenchmarkFinalizeStore(b *testing.B) {
	d := loadBenchStore(b)
	r, err := NewReader(d.dir)
	if err != nil {
		b.Fatal(err)
	}
	for _, builder := range builders {
		for _, jobs := range []int{1, runtime.GOMAXPROCS(0)} {
			b.Run(fmt.Sprintf("%s/jobs=%d", builder, jobs), func(b *testing.B) {
				b.SetBytes(d.storeBytes)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					n, err := finalizeAll(d, r, builder, jobs)
					if err != nil {
						b.Fatal(err)
					}
					if n != benchRollouts*benchCalls {
						b.Fatalf("%d traces", n)
					}
				}
				b.ReportMetric(float64(d.genTokens)*float64(b.N)/b.Elapsed().Seconds(), "gen_tok/s")
				b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/step")
			})
		}
	}
}

// BenchmarkReferenceEncodingJSON decodes the same store with encoding/json
// into plain slices: the reference the finalizer's ingest is measured against.
func BenchmarkReferenceEncodingJSON(b *testing.B) {
	d := loadBenchStore(b)
	type plainEntry struct {
		RolloutID          string    `json:"rollout_id"`
		ModelCallID        string    `json:"model_call_id"`
		PromptTokenIDs     []int     `json:"prompt_token_ids"`
		GenerationTokenIDs []int     `json:"generation_token_ids"`
		GenerationLogProbs []float64 `json:"generation_log_probs"`
	}
	b.SetBytes(d.storeBytes)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for r := 0; r < benchRollouts; r++ {
			data, err := os.ReadFile(filepath.Join(d.dir, fmt.Sprintf("%d-0", r)+SuffixEntries))
			if err != nil {
				b.Fatal(err)
			}
			for _, l := range bytes.Split(bytes.TrimSpace(data), []byte{'\n'}) {
				var e plainEntry
				if err := json.Unmarshal(l, &e); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.ReportMetric(float64(d.genTokens)*float64(b.N)/b.Elapsed().Seconds(), "gen_tok/s")
}

// TestBenchStoreFinalizes runs the benchmark's step on a small store so the
// generator and the step stay correct in plain go test.
func TestBenchStoreFinalizes(t *testing.T) {
	d, err := makeBenchStore(t.TempDir(), 4, 3, 40, 9)
	if err != nil {
		t.Fatal(err)
	}
	r, _ := NewReader(d.dir)
	for _, builder := range builders {
		n, err := finalizeAll(d, r, builder, 2)
		if err != nil || n != 12 {
			t.Fatalf("%s: %d traces, %v", builder, n, err)
		}
	}
}

// BenchmarkBuiltinStepCaptures records and reads back one step of the
// built-in job's captures (64 rollouts of 3 calls, 40-token prompts, 8
// generated tokens; intent, entry and freeze per call, then every snapshot)
// in a file store without fsync, as the built-in job did (each step's
// rollout ids are new, so the directory fills up as in make run), and in a
// fresh in-memory store per step, as it does now. Compare the two ns/op.
func BenchmarkBuiltinStepCaptures(b *testing.B) {
	const rollouts, calls, prompt, gen = 64, 3, 40, 8
	rng := rand.New(rand.NewPCG(1, 2))
	entry := func(step, r, c int) *TokenEntry {
		e := &TokenEntry{SchemaVersion: 3, RolloutID: fmt.Sprintf("step%06d-%d-%d", step, r/8, r%8),
			ModelCallID: fmt.Sprintf("%032x", uint64(r*calls+c)), Model: "tracegrpo/tiny-qwen3", CreatedAt: float64(c),
			PromptTokenIDs: make([]int32, prompt), GenerationTokenIDs: make([]int32, gen), GenerationLogProbs: make([]float64, gen)}
		for i := range e.PromptTokenIDs {
			e.PromptTokenIDs[i] = int32(rng.IntN(64))
		}
		for i := range e.GenerationTokenIDs {
			e.GenerationTokenIDs[i], e.GenerationLogProbs[i] = int32(rng.IntN(64)), -rng.ExpFloat64()
		}
		return e
	}
	step := func(b *testing.B, w *Writer, r *Reader, n int) {
		for i := 0; i < rollouts; i++ {
			var rid string
			for c := 0; c < calls; c++ {
				e := entry(n, i, c)
				rid = e.RolloutID
				if err := w.BeginCall(rid, e.ModelCallID); err != nil {
					b.Fatal(err)
				}
				if err := w.Put(e); err != nil {
					b.Fatal(err)
				}
			}
			if err := w.Freeze(rid); err != nil {
				b.Fatal(err)
			}
		}
		for i := 0; i < rollouts; i++ {
			s, err := r.Snapshot(fmt.Sprintf("step%06d-%d-%d", n, i/8, i%8))
			if err != nil || len(s.Entries) != calls || s.Incomplete {
				b.Fatalf("snapshot: %v", err)
			}
		}
	}
	b.Run("file", func(b *testing.B) {
		w, err := NewWriter(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		w.SetFsync(false)
		r := w.Reader()
		for n := 0; n < b.N; n++ {
			step(b, w, r, n+1)
		}
	})
	b.Run("memory", func(b *testing.B) {
		for n := 0; n < b.N; n++ {
			w := NewMemoryWriter()
			step(b, w, w.Reader(), n+1)
		}
	})
}
