//go:build cgo

package cuda

import (
	"flag"
	"fmt"
	"go/format"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// The SASS evidence: what ptxas makes of the committed PTX for Ampere and
// Hopper, read from `ptxas -v` (registers, spills, static shared memory)
// and `cuobjdump -sass` (tensor-core instructions), with the blocks each
// kernel fits on one SM. TestSASS checks the facts the kernels were
// written for and that csrc/gen_sass.md, the committed report, is what
// this ptxas produces; `make sass` regenerates the report.

var updateSASS = flag.Bool("update-sass", false, "rewrite csrc/gen_sass.md from this ptxas and cuobjdump")

const sassReport = "csrc/gen_sass.md"

// smLimits are one architecture's per-SM limits (CUDA C Programming Guide,
// "Compute Capabilities", table "Technical Specifications").
type smLimits struct {
	arch            string
	regs            int // 32-bit registers per SM
	smemSM          int // shared memory per SM, bytes (largest carve-out)
	smemBlock       int // shared memory a block may opt in to
	reservedPerBlok int // shared memory the system reserves per block
	threads, blocks int // resident threads and blocks per SM
}

// smArchs are the limits of ptxArchs.
var smArchs = []smLimits{
	{"sm_80", 65536, 164 << 10, 163 << 10, 1 << 10, 2048, 32},
	{"sm_90", 65536, 228 << 10, 227 << 10, 1 << 10, 2048, 32},
}

// blocksPerSM is how many blocks of a kernel one SM holds at once:
// registers are allocated per warp in units of 256, shared memory per
// block plus the reserved 1 KiB.
func (l smLimits) blocksPerSM(regs, threads, smem int) int {
	warps := (threads + 31) / 32
	perWarp := (regs*32 + 255) / 256 * 256
	n := min(l.blocks, l.threads/threads)
	if perWarp > 0 {
		n = min(n, l.regs/(perWarp*warps))
	}
	if smem > l.smemBlock {
		return 0
	}
	return min(n, l.smemSM/(smem+l.reservedPerBlok))
}

// sassIntent is what a kernel was written for.
type sassIntent struct {
	tensorCores bool                 // HMMA (or HGMMA) instructions
	minBlocks   int                  // blocks per SM it must fit (0: no requirement)
	threads     int                  // block size
	dynSmem     func() (int, string) // dynamic shared memory of its launch, and for which case
}

func tcIntent(kind string, HD int) sassIntent {
	return sassIntent{tensorCores: true, minBlocks: 2, threads: attThreads, dynSmem: func() (int, string) {
		fwd, dq, dkdv := tcSmem(HD)
		return map[string]int{"fwd": fwd, "dq": dq, "dkdv": dkdv, "dqds": tcSmemDqDS(HD)}[kind], fmt.Sprintf("HD=%d", HD)
	}}
}

// sassIntents names the kernels whose SASS the report shows, with what
// they must satisfy. Every other kernel must only not spill.
var sassIntents = map[string]sassIntent{
	"attention_fwd_tc_hd64_bf16out":  tcIntent("fwd", 64),
	"attention_fwd_tc_hd64_f32out":   tcIntent("fwd", 64),
	"attention_fwd_tc_hd128_bf16out": tcIntent("fwd", 128),
	"attention_fwd_tc_hd128_f32out":  tcIntent("fwd", 128),
	"attention_bwd_dq_ds_tc_hd64":    tcIntent("dqds", 64),
	"attention_bwd_dq_ds_tc_hd128":   tcIntent("dqds", 128),
	"attention_bwd_dkdv_tc_hd64":     tcIntent("dkdv", 64),
	"attention_bwd_dkdv_tc_hd128":    tcIntent("dkdv", 128),
	// Above the dS scratch's cap (attnDSFits): the recomputing dq and a
	// dkdv that stores no dS.
	"attention_bwd_dq_tc_hd64":         tcIntent("dq", 64),
	"attention_bwd_dq_tc_hd128":        tcIntent("dq", 128),
	"attention_bwd_dkdv_nods_tc_hd64":  tcIntent("dkdv", 64),
	"attention_bwd_dkdv_nods_tc_hd128": tcIntent("dkdv", 128),
	// Tree attention's tensor-core kernels: the same tiles.
	"tree_fwd_tc_hd64_bf16out":  tcIntent("fwd", 64),
	"tree_fwd_tc_hd64_f32out":   tcIntent("fwd", 64),
	"tree_fwd_tc_hd128_bf16out": tcIntent("fwd", 128),
	"tree_fwd_tc_hd128_f32out":  tcIntent("fwd", 128),
	"tree_bwd_dq_tc_hd64":       tcIntent("dq", 64),
	"tree_bwd_dq_tc_hd128":      tcIntent("dq", 128),
	"tree_bwd_dkdv_tc_hd64":     tcIntent("dkdv", 64),
	"tree_bwd_dkdv_tc_hd128":    tcIntent("dkdv", 128),
	"mma_selftest_frag":         {tensorCores: true, threads: 32},
	"mma_selftest_ldmatrix":     {tensorCores: true, threads: 32},
	// The Mamba-2 scan's chunked backward (csrc/ssd_bwd.cu): bf16 products on
	// tensor cores, one 256-thread block per SM (its tiles in shared memory).
	"ssd_bwd_chunk_bf16": ssdIntent(ssdChunkSmem),
	"ssd_bwd_local_bf16": ssdIntent(ssdLocalSmem),
	// The LM head's own kernels: memory-bound reductions over each fp32
	// logits chunk (its GEMMs are cuBLAS's, whose SASS is not ours).
	"logprob_chunk":          {threads: threads},
	"logprob_bwd_chunk_bf16": {threads: threads},
	"attention_fwd":          {threads: attThreads, dynSmem: func() (int, string) { return 4 * (attFwdRows*128 + attKeyTile*129 + attKeyTile*128), "HD=128" }},
	// The sparse layers' grouped GEMMs: bf16 operands on tensor cores, at
	// least two 128-thread blocks per SM (static shared memory only).
	"grouped_fwd_bf16":        groupedIntent(true),
	"grouped_fwd_bf16_f32out": groupedIntent(true),
	"grouped_dinp_bf16":       groupedIntent(true),
	"grouped_dw_bf16":         groupedIntent(true),
	"grouped_fwd":             groupedIntent(false),
	"grouped_dinp":            groupedIntent(false),
	"grouped_dw":              groupedIntent(false),
	// The Mamba-2 scan's chunked SSD forward (csrc/ssd_fwd.cu): bf16 on
	// tensor cores, at least two blocks per SM at its dynamic shared memory.
	"ssd_scan_fwd_bf16": {tensorCores: true, minBlocks: 2, threads: ssdThreads, dynSmem: func() (int, string) { return ssdSmem, "DS ≤ 128" }},
}

// ssdIntent: at Nemotron-3-Nano's head shape (MP 64, DS 128).
func ssdIntent(smem func(kernels.Scan) int) sassIntent {
	return sassIntent{tensorCores: true, minBlocks: 1, threads: mambaThreads, dynSmem: func() (int, string) {
		return smem(kernels.Scan{MH: 64, MP: 64, G: 8, DS: 128}), "MP=64 DS=128"
	}}
}

func groupedIntent(tc bool) sassIntent {
	return sassIntent{tensorCores: tc, minBlocks: 2, threads: groupedThreads, dynSmem: func() (int, string) { return 0, "static" }}
}

// TestSASS assembles every committed PTX for sm_80 and sm_90 and checks:
// no kernel spills to local memory; the tensor-core kernels contain HMMA
// (or HGMMA) instructions; the kernels meant to run two blocks per SM fit
// two by their registers and shared memory; and csrc/gen_sass.md records
// exactly these facts (when made by this ptxas version).
func TestSASS(t *testing.T) {
	ptxas, cuobjdump := ptxTools(t)
	all := assembleAll(t, ptxas, cuobjdump)
	for _, l := range smArchs {
		for name, f := range all[l.arch] {
			if f.spillStores != 0 || f.spillLoads != 0 {
				t.Errorf("%s %s spills: %d bytes stored, %d loaded", l.arch, name, f.spillStores, f.spillLoads)
			}
		}
		for name, in := range sassIntents {
			f := all[l.arch][name]
			if f == nil {
				t.Errorf("%s: no kernel %s in the PTX", l.arch, name)
				continue
			}
			if in.tensorCores && !f.sassRead {
				t.Errorf("%s %s: its SASS was not read (add its PTX to sassFiles)", l.arch, name)
			}
			if in.tensorCores && f.hmma+f.hgmma == 0 {
				t.Errorf("%s %s: no HMMA or HGMMA instruction in its SASS", l.arch, name)
			}
			if in.minBlocks > 0 {
				smem, _ := in.dynSmem()
				if n := l.blocksPerSM(f.regs, in.threads, f.staticSmem+smem); n < in.minBlocks {
					t.Errorf("%s %s: %d registers, %d bytes of shared memory: %d blocks per SM, want %d",
						l.arch, name, f.regs, f.staticSmem+smem, n, in.minBlocks)
				}
			}
		}
	}
	ver, err := exec.Command(ptxas, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("ptxas --version: %v", err)
	}
	report := sassMarkdown(strings.TrimSpace(lastLine(string(ver))), all)
	facts := sm90FactsSource(strings.TrimSpace(lastLine(string(ver))), all["sm_90"])
	if *updateSASS {
		if err := os.WriteFile(sassReport, []byte(report), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(sm90FactsFile, []byte(facts), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s and %s", sassReport, sm90FactsFile)
		return
	}
	checkSM90Facts(t, all["sm_90"])
	checkCubins(t, strings.TrimSpace(lastLine(string(ver))))
	old, err := os.ReadFile(sassReport)
	if err != nil {
		t.Fatalf("%v (make sass writes it)", err)
	}
	if string(old) == report {
		return
	}
	if oldVer := reportPtxas(string(old)); oldVer != strings.TrimSpace(lastLine(string(ver))) {
		t.Logf("%s was made by %q, this is %q: not compared (the checks above ran)", sassReport, oldVer, lastLine(string(ver)))
		return
	}
	t.Errorf("%s is stale: the kernels' SASS facts changed; run make sass and commit the result", sassReport)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// reportPtxas reads the ptxas version line a report records.
func reportPtxas(report string) string {
	for _, line := range strings.Split(report, "\n") {
		if v, ok := strings.CutPrefix(line, "ptxas: "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// sassMarkdown renders the report: the intended kernels in full, then the
// largest register counts and the spill total of all the others.
func sassMarkdown(ver string, all map[string]map[string]*kernelFacts) string {
	var b strings.Builder
	b.WriteString("<!-- Code generated by make sass (go test ./kernels/cuda -run TestSASS -update-sass); DO NOT EDIT. -->\n")
	b.WriteString("# SASS of the committed PTX\n\n")
	b.WriteString("What ptxas makes of `csrc/gen_*.ptx` for Ampere (sm_80) and Hopper (sm_90): registers per thread,\n")
	b.WriteString("spills, shared memory (static from ptxas plus the dynamic size the launcher asks for), tensor-core\n")
	b.WriteString("instructions in `cuobjdump -sass`, and the blocks of the kernel one SM holds at once (registers in\n")
	b.WriteString("units of 256 per warp, 1 KiB of shared memory reserved per block). kernels/cuda's TestSASS checks\n")
	b.WriteString("these facts and that this file is current. The LM head's tensor-core work is cuBLAS's GEMMs\n")
	b.WriteString("(cublasGemmEx, bf16 operands): its own kernels below are the chunk reductions, with no HMMA.\n\n")
	b.WriteString("ptxas: " + ver + "\n\n")
	names := make([]string, 0, len(sassIntents))
	for n := range sassIntents {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, l := range smArchs {
		fmt.Fprintf(&b, "## %s\n\n", l.arch)
		b.WriteString("| kernel | HMMA | HGMMA | registers | spill bytes (st/ld) | shared memory | blocks/SM | wanted |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|\n")
		for _, n := range names {
			f, in := all[l.arch][n], sassIntents[n]
			if f == nil {
				continue
			}
			smem, what := 0, ""
			if in.dynSmem != nil {
				smem, what = in.dynSmem()
				what = " (" + what + ")"
			}
			wanted := "-"
			if in.minBlocks > 0 {
				wanted = fmt.Sprintf(">= %d", in.minBlocks)
			}
			hmma, hgmma := "not read", "not read"
			if f.sassRead {
				hmma, hgmma = fmt.Sprint(f.hmma), fmt.Sprint(f.hgmma)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %d | %d/%d | %d%s | %d | %s |\n", n, hmma, hgmma, f.regs,
				f.spillStores, f.spillLoads, f.staticSmem+smem, what, l.blocksPerSM(f.regs, in.threads, f.staticSmem+smem), wanted)
		}
		var others []string
		spill := 0
		for n, f := range all[l.arch] {
			spill += f.spillStores + f.spillLoads
			if _, ok := sassIntents[n]; !ok {
				others = append(others, n)
			}
		}
		sort.Slice(others, func(i, j int) bool {
			fi, fj := all[l.arch][others[i]], all[l.arch][others[j]]
			if fi.regs != fj.regs {
				return fi.regs > fj.regs
			}
			return others[i] < others[j]
		})
		fmt.Fprintf(&b, "\nAll %d kernels: %d bytes of spill stores and loads in all. The other kernels' registers, most first:", len(all[l.arch]), spill)
		for _, n := range others {
			fmt.Fprintf(&b, " %s %d,", n, all[l.arch][n].regs)
		}
		s := strings.TrimSuffix(b.String(), ",")
		b.Reset()
		b.WriteString(s + ".\n\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// sm90FactsFile is the roofline's table of every kernel's sm_90 facts
// (roofline.go), written by make sass with the report.
const sm90FactsFile = "gen_sm90.go"

// sm90FactsSource renders gen_sm90.go from the sm_90 facts.
func sm90FactsSource(ver string, facts map[string]*kernelFacts) string {
	var b strings.Builder
	b.WriteString("// Code generated by make sass (go test ./kernels/cuda -run TestSASS -update-sass); DO NOT EDIT.\n\n")
	b.WriteString("package cuda\n\n")
	fmt.Fprintf(&b, "// sm90Facts are ptxas's registers and static shared memory of every kernel\n// of csrc/gen_*.ptx on sm_90, and the HMMA instructions cuobjdump counts in\n// the files it reads (sassFiles), for the roofline. ptxas: %s\n", ver)
	b.WriteString("var sm90Facts = map[string]KernelFacts{\n")
	names := make([]string, 0, len(facts))
	for n := range facts {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		f := facts[n]
		fmt.Fprintf(&b, "\t%q: {Regs: %d, StaticSmem: %d, HMMA: %d},\n", n, f.regs, f.staticSmem, f.hmma)
	}
	b.WriteString("}\n")
	src, err := format.Source([]byte(b.String()))
	if err != nil {
		panic(err)
	}
	return string(src)
}

// checkSM90Facts fails t when gen_sm90.go disagrees with what this ptxas
// made of the committed PTX: the roofline would model other machine code
// than the device runs. Run make sass.
func checkSM90Facts(t *testing.T, facts map[string]*kernelFacts) {
	t.Helper()
	for n, f := range facts {
		got, ok := sm90Facts[n]
		want := KernelFacts{Regs: f.regs, StaticSmem: f.staticSmem, HMMA: f.hmma}
		if !ok || got != want {
			t.Errorf("%s: kernel %s is %+v on sm_90, %s says %+v (present %v); run make sass", sm90FactsFile, n, want, sm90FactsFile, got, ok)
		}
	}
	for n := range sm90Facts {
		if facts[n] == nil {
			t.Errorf("%s: kernel %s is in no committed PTX; run make sass", sm90FactsFile, n)
		}
	}
}
