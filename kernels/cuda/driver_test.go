//go:build cgo

package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

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
	if _, err := openBlas(""); err == nil {
		// A real cuBLAS may be installed on this machine: then the search
		// must have found it by one of the expected names.
		t.Log("a cuBLAS is installed here; search found one")
	} else if !strings.Contains(err.Error(), filepath.Join(dir, "libcublas.so.13")) || !strings.Contains(err.Error(), "TRACEGRPO_CUDA_LIBS") {
		t.Errorf("cuBLAS search error %q does not list %s or mention TRACEGRPO_CUDA_LIBS", err, filepath.Join(dir, "libcublas.so.13"))
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
