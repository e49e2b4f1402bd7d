//go:build cgo

package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tracegrpo/tracegrpo/internal/testtool"
)

// TestOpenErrors covers the driver binding's failure paths on a machine
// without a GPU: a missing library, and real libraries that lack the
// driver's or cuBLAS's symbols. Each must be a clear error, not a crash.
func TestOpenErrors(t *testing.T) {
	for _, c := range []struct {
		name  string
		opt   Options
		wants []string
	}{
		{"no driver", Options{DriverLib: "libcuda-does-not-exist.so.1"}, []string{"load CUDA driver", "libcuda-does-not-exist.so.1"}},
		{"driver path missing", Options{DriverLib: "/nonexistent/libcuda.so.1"}, []string{"load CUDA driver", "/nonexistent/libcuda.so.1"}},
		{"libm as the driver", Options{DriverLib: "libm.so.6"}, []string{"libm.so.6", "no symbol cuInit"}},
		{"libc as the driver", Options{DriverLib: "libc.so.6"}, []string{"libc.so.6", "no symbol cuInit"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := Open(c.opt)
			if err == nil {
				t.Fatalf("Open(%+v) succeeded with backend %v", c.opt, b)
			}
			for _, w := range c.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if _, perr := Probe(c.opt); perr == nil {
				t.Errorf("Probe(%+v) succeeded", c.opt)
			}
		})
	}
}

// TestMissingSymbol builds a library that has every driver symbol but one
// and checks the error names the library and the missing symbol; the same
// for cuBLAS with the emulator's driver.
func TestMissingSymbol(t *testing.T) {
	cc := testtool.Path(t, "gcc", requireEmuEnv)
	dir := t.TempDir()
	var src strings.Builder
	for _, s := range []string{"cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetName",
		"cuDeviceGetAttribute", "cuDeviceTotalMem_v2", "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease_v2",
		"cuCtxSetCurrent", "cuMemAlloc_v2", "cuMemGetInfo_v2", "cuMemFree_v2", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2"} {
		src.WriteString("int " + s + "(void) { return 0; }\n")
	}
	// cuMemcpyDtoDAsync_v2 and everything after it is missing.
	lib := filepath.Join(dir, "libpartial.so")
	cfile := filepath.Join(dir, "partial.c")
	if err := os.WriteFile(cfile, []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", lib, cfile).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	_, err := Open(Options{DriverLib: lib})
	if err == nil || !strings.Contains(err.Error(), lib) || !strings.Contains(err.Error(), "no symbol cuMemcpyDtoDAsync_v2") {
		t.Errorf("Open with a partial driver: %v; want the path and symbol cuMemcpyDtoDAsync_v2", err)
	}

	drv, _, skip, berr := buildEmu()
	if skip != "" {
		skipNoEmu(t, skip)
	}
	if berr != nil {
		t.Fatal(berr)
	}
	_, err = Open(Options{DriverLib: drv, BlasLib: "libm.so.6"})
	if err == nil || !strings.Contains(err.Error(), "libm.so.6") || !strings.Contains(err.Error(), "no symbol cublasCreate_v2") {
		t.Errorf("Open with libm as cuBLAS: %v; want the path and symbol cublasCreate_v2", err)
	}
	t.Setenv("TRACEGRPO_CUDA_LIBS", dir)
	t.Setenv("LD_LIBRARY_PATH", "")
	if _, err := openBlas("", 0); err == nil {
		// A real cuBLAS may be installed on this machine: then the search
		// must have found it by one of the expected names.
		t.Log("a cuBLAS is installed here; search found one")
	} else if !strings.Contains(err.Error(), dir+" ($TRACEGRPO_CUDA_LIBS)") || !strings.Contains(err.Error(), "libcublas.so.13") {
		t.Errorf("cuBLAS search error %q does not list the directory %s ($TRACEGRPO_CUDA_LIBS) or name libcublas.so.13", err, dir)
	}
}

// TestDataErrorsReachSync checks that a kernel's data-error flag comes back
// as an error from Sync, once, on the emulator.
func TestDataErrorsReachSync(t *testing.T) {
	b := emuBackend(t, Options{})
	out, _ := b.Alloc(F32, 4)
	q, _ := b.Alloc(F32, 4)
	kc, _ := b.Alloc(F32, 2*4)
	vc, _ := b.Alloc(F32, 2*4)
	lens, _ := b.Alloc(I32, 1)
	b.UploadI32(lens, []int32{3}) // Tmax is 2
	b.AttentionDecode(out, q, kc, vc, lens, 1, 2, 1, 1, 4)
	err := b.Sync()
	if err == nil || !strings.Contains(err.Error(), "AttentionDecode") {
		t.Fatalf("Sync after lens > Tmax: %v, want an AttentionDecode data error", err)
	}
	if err := b.Sync(); err != nil {
		t.Errorf("second Sync: %v, want nil (the error is cleared)", err)
	}
}

// TestOpenBlasSearch runs the cuBLAS search through dlopen: a file that is
// not a library is passed over with dlopen's reason, a cuBLAS newer than
// the driver is passed over unopened, and the cuBLAS chosen in a directory
// is opened after the cuBLASLt beside it; the choices name every path.
// The emulator's cuBLAS stands in for cuBLAS 12, libm for its cuBLASLt.
func TestOpenBlasSearch(t *testing.T) {
	_, blas, skip, err := buildEmu()
	if skip != "" {
		skipNoEmu(t, skip)
	}
	if err != nil {
		t.Fatal(err)
	}
	libm := "/lib/x86_64-linux-gnu/libm.so.6"
	if _, err := os.Stat(libm); err != nil {
		t.Skipf("no %s to stand in for cuBLASLt", libm)
	}
	copyFile := func(src, dst string) {
		t.Helper()
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	junk, good := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(junk, "libcublas.so.12"), []byte("not a library"), 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(blas, filepath.Join(good, "libcublas.so.12"))
	copyFile(libm, filepath.Join(good, "libcublasLt.so.12"))
	copyFile(blas, filepath.Join(good, "libcublas.so.13"))
	t.Setenv("TRACEGRPO_CUDA_LIBS", junk+":"+good)
	t.Setenv("TRACEGRPO_CUDA_BLAS", "")
	t.Setenv("LD_LIBRARY_PATH", "")
	bl, err := openBlas("", 12080)
	if err != nil {
		t.Fatal(err)
	}
	defer bl.free()
	var names, paths []string
	for _, c := range bl.choices {
		names, paths = append(names, c.Name), append(paths, c.Path)
	}
	if d := cmp.Diff([]string{"cuBLASLt", "cuBLAS"}, names); d != "" {
		t.Fatalf("libraries loaded (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{filepath.Join(good, "libcublasLt.so.12"), filepath.Join(good, "libcublas.so.12")}, paths); d != "" {
		t.Errorf("paths chosen (-want +got):\n%s", d)
	}
	passed := strings.Join(bl.choices[1].Passed, "\n")
	for _, w := range []string{
		filepath.Join(good, "libcublas.so.13") + " ($TRACEGRPO_CUDA_LIBS): it needs a CUDA 13 driver, this one is CUDA 12.8",
		filepath.Join(junk, "libcublas.so.12") + " ($TRACEGRPO_CUDA_LIBS): cuda: load cuBLAS",
	} {
		if !strings.Contains(passed, w) {
			t.Errorf("passed over:\n%s\nwant a line with %q", passed, w)
		}
	}
	t.Logf("%s\n%s", bl.choices[0], bl.choices[1])
}

// TestLibrariesEmu: Libraries reports the libraries the environment names
// (here the emulator's), with the driver's CUDA version and NCCL's.
func TestLibrariesEmu(t *testing.T) {
	drv, blas, skip, err := buildEmu()
	if skip != "" {
		skipNoEmu(t, skip)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("TRACEGRPO_CUDA_DRIVER", drv)
	t.Setenv("TRACEGRPO_CUDA_BLAS", blas)
	t.Setenv("TRACEGRPO_NCCL_LIB", emu.nccl)
	var got []string
	for _, c := range Libraries(Options{}) {
		got = append(got, c.String())
	}
	want := []string{
		"CUDA driver (CUDA 11.8): " + drv + " (from named explicitly)",
		"cuBLAS: " + blas + " (from named explicitly)",
		"NCCL 2.21.5: " + emu.nccl + " (from named explicitly)",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Libraries (-want +got):\n%s", d)
	}
}

// TestLibrariesGPU prints where the driver, cuBLAS (with its cuBLASLt) and
// NCCL load from on this machine and what the search passed over on the
// way (scripts/gpu-check.sh's preflight runs it first). Without a driver
// it skips; with TRACEGRPO_REQUIRE_GPU=1 a library that does not load
// fails it.
func TestLibrariesGPU(t *testing.T) {
	choices := Libraries(Options{})
	if choices[0].Path == "" && os.Getenv("TRACEGRPO_REQUIRE_GPU") != "1" {
		t.Skipf("no CUDA driver: %v", choices[0].Err)
	}
	for _, c := range choices {
		t.Logf("library %s", c)
		if c.Path == "" || c.Err != nil {
			t.Errorf("%s did not load: %v", c.Name, c.Err)
		}
	}
}
