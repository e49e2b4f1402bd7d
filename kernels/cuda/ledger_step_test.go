//go:build cgo

package cuda_test

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cuda"
	"github.com/tracegrpo/tracegrpo/model"
)

// TestLedgerWritesEmu runs the tiny models' training step (fp32 and mixed
// precision) on the emulator with its write log on (fakecuda.cpp: the
// bytes of device memory each launch really changed) and the ledger on,
// and checks that every kernel launch and copy is in the ledger, in order,
// and changed no more bytes than its entry says it writes. A launch site
// whose cost forgets an output, or a kernel that writes more than its
// launch states, fails here: the roofline cannot undercount the code.
func TestLedgerWritesEmu(t *testing.T) {
	log := filepath.Join(t.TempDir(), "writes.log")
	t.Setenv("TRACEGRPO_EMU_WRITELOG", log)
	for _, c := range []struct {
		variant string
		prec    kernels.DType
	}{{"qwen3_tied", kernels.F32}, {"qwen3_tied", kernels.BF16}, {"qwen2_untied", kernels.BF16}, {"moe_k2_norm", kernels.BF16}} {
		t.Run(c.variant+"_"+c.prec.String(), func(t *testing.T) {
			be := cuda.EmuBackend(t, cuda.Options{})
			skip := lines(t, log)
			be.StartLedger()
			random := c.variant != "moe_k2_norm"
			tinyStepPrec(t, be, c.variant, random, c.prec)
			ledger := be.TakeLedger()
			logged := lines(t, log)[len(skip):]
			var mine []cuda.Launch
			for _, l := range ledger {
				if l.Kind != cuda.KindGEMM && l.Kernel != "memset" {
					mine = append(mine, l)
				}
			}
			// The step's own launches: the ledger starts after the model
			// is made, the log a little before (the weights' upload).
			if len(logged) < len(mine) {
				t.Fatalf("%d launches in the write log, %d in the ledger", len(logged), len(mine))
			}
			logged = logged[len(logged)-len(mine):]
			ops := map[string]bool{}
			for i, l := range mine {
				name, n := parseWrite(t, logged[i])
				if name != l.Kernel {
					t.Fatalf("launch %d: the log has %s, the ledger %s (op %s)", i, name, l.Kernel, l.Op)
				}
				if n > l.Write {
					t.Errorf("launch %d: %s (op %s) changed %d bytes of device memory, its ledger entry writes %d", i, l.Kernel, l.Op, n, l.Write)
				}
				ops[l.Op] = true
			}
			for _, op := range []string{"RMSNormBackward", "AttentionBackward", "TokenLogprobBackward", "AdamW", "Embedding"} {
				if !ops[op] {
					t.Errorf("no launch of %s in the step's ledger", op)
				}
			}
			t.Logf("%d launches (%d kernels and copies checked against the write log)", len(ledger), len(mine))
		})
	}
}

func lines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

func parseWrite(t *testing.T, line string) (string, int64) {
	t.Helper()
	name, n, ok := strings.Cut(line, " ")
	v, err := strconv.ParseInt(n, 10, 64)
	if !ok || err != nil {
		t.Fatalf("write log line %q", line)
	}
	return name, v
}

// TestLedgerStepGEMMs: one training step's GEMM FLOPs in the ledger are the
// model's arithmetic, counted from the config: every layer weight's
// forward product and its two backward ones (6·T·weights), and the LM
// head's forward logits, the backward's recomputed logits and its two
// gradient products (8·T·V·C), on the metering device at the bench shape.
func TestLedgerStepGEMMs(t *testing.T) {
	cfg, err := model.LoadConfig("../../model/testdata/published/qwen3-1.7b.config.json")
	if err != nil {
		t.Fatal(err)
	}
	be, err := cuda.OpenMeter(cuda.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer be.(*cuda.Backend).Close()
	const rows, seq = 2, 512
	T := int64(rows * seq)
	m, err := model.New(be, cfg, model.Options{MaxTokens: int(T), MaxSeqs: rows, Precision: kernels.BF16})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tokens, cu := make([]int32, T), []int32{0, seq, 2 * seq}
	led := be.(cuda.Ledgered)
	led.StartLedger()
	if _, _, err := m.Forward(tokens, cu, 1); err != nil {
		t.Fatal(err)
	}
	if err := m.Backward(make([]float32, T)); err != nil {
		t.Fatal(err)
	}
	var gemm int64
	for _, l := range led.TakeLedger() {
		if l.Kind == cuda.KindGEMM {
			gemm += l.FLOPs
		}
	}
	C, I, NH, NKV, HD, V := int64(cfg.HiddenSize), int64(cfg.IntermediateSize), int64(cfg.NumAttentionHeads), int64(cfg.NumKeyValueHeads), int64(cfg.HeadDim), int64(cfg.VocabSize)
	layer := C*(NH+2*NKV)*HD + NH*HD*C + 3*C*I
	want := 6*T*layer*int64(cfg.NumHiddenLayers) + 8*T*V*C
	if gemm != want {
		t.Errorf("GEMM FLOPs of one step: ledger %d, the model's arithmetic %d", gemm, want)
	}
}
