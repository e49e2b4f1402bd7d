package cuda

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// fakeTree builds a file system under a temporary root: every path of
// files is created (empty; a path ending in / is a directory), and every
// "path=text" writes text.
func fakeTree(t *testing.T, files []string) string {
	t.Helper()
	root := t.TempDir()
	for _, f := range files {
		text := ""
		if i := strings.IndexByte(f, '='); i >= 0 {
			f, text = f[:i], f[i+1:]
		}
		p := filepath.Join(root, f)
		if strings.HasSuffix(f, "/") {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const (
	torchVenv = "/opt/torch/.venv/lib/python3.12/site-packages" // the device image's PyTorch
	torchPy   = "the Python packages of /opt/torch/.venv/bin/python3 (on PATH)"
)

// TestLibSearch: the search finds cuBLAS and NCCL in the layouts CUDA 13
// and 12 wheels install (nvidia/cu13/lib, nvidia/cublas/lib,
// nvidia/nccl/lib) under a virtualenv named by VIRTUAL_ENV or only on PATH,
// conda, ~/.local and Debian's dist-packages, in $TRACEGRPO_CUDA_LIBS and
// $LD_LIBRARY_PATH, in the directories /etc/ld.so.conf names (through its
// includes) and the CUDA toolkit's; in that order, each directory once,
// each path with why it was searched, the loader's own search last.
func TestLibSearch(t *testing.T) {
	for _, c := range []struct {
		name  string
		files []string
		env   map[string]string
		lib   libSpec
		want  []libCandidate
	}{
		{
			name: "CUDA 13 wheels in a virtualenv on PATH, no VIRTUAL_ENV",
			files: []string{"/opt/torch/.venv/bin/python3", torchVenv + "/nvidia/cu13/lib/libcublas.so.13",
				torchVenv + "/nvidia/cu13/lib/libcublasLt.so.13", torchVenv + "/nvidia/nccl/lib/libnccl.so.2", "/usr/bin/python3"},
			env: map[string]string{"PATH": "/opt/torch/.venv/bin:/usr/bin"},
			lib: blasSpec([]int{13, 12, 11}),
			want: []libCandidate{
				{torchVenv + "/nvidia/cu13/lib/libcublas.so.13", "pip wheel, " + torchPy},
				{"libcublas.so.13", loaderFrom}, {"libcublas.so.12", loaderFrom}, {"libcublas.so.11", loaderFrom},
			},
		},
		{
			name:  "NCCL's wheel beside it",
			files: []string{"/opt/torch/.venv/bin/python3", torchVenv + "/nvidia/cu13/lib/libcublas.so.13", torchVenv + "/nvidia/nccl/lib/libnccl.so.2"},
			env:   map[string]string{"PATH": "/opt/torch/.venv/bin"},
			lib:   ncclSpec,
			want:  []libCandidate{{torchVenv + "/nvidia/nccl/lib/libnccl.so.2", "pip wheel, " + torchPy}, {"libnccl.so.2", loaderFrom}},
		},
		{
			name:  "the same virtualenv by VIRTUAL_ENV and on PATH is searched once",
			files: []string{"/opt/torch/.venv/bin/python3", torchVenv + "/nvidia/nccl/lib/libnccl.so.2"},
			env:   map[string]string{"PATH": "/opt/torch/.venv/bin", "VIRTUAL_ENV": "/opt/torch/.venv"},
			lib:   ncclSpec,
			want: []libCandidate{{torchVenv + "/nvidia/nccl/lib/libnccl.so.2", "pip wheel, $VIRTUAL_ENV's Python packages"},
				{"libnccl.so.2", loaderFrom}},
		},
		{
			name: "CUDA 12 wheels by VIRTUAL_ENV (not on PATH), newest cuBLAS first",
			files: []string{"/home/u/env/lib/python3.11/site-packages/nvidia/cublas/lib/libcublas.so.12",
				"/home/u/env/lib/python3.11/site-packages/nvidia/cublas/lib/libcublas.so.11"},
			env: map[string]string{"VIRTUAL_ENV": "/home/u/env", "PATH": "/usr/bin"},
			lib: blasSpec([]int{12, 11}),
			want: []libCandidate{
				{"/home/u/env/lib/python3.11/site-packages/nvidia/cublas/lib/libcublas.so.12", "pip wheel, $VIRTUAL_ENV's Python packages"},
				{"/home/u/env/lib/python3.11/site-packages/nvidia/cublas/lib/libcublas.so.11", "pip wheel, $VIRTUAL_ENV's Python packages"},
				{"libcublas.so.12", loaderFrom}, {"libcublas.so.11", loaderFrom},
			},
		},
		{
			name: "the environment's directories first, then conda, ~/.local, Debian's dist-packages, the toolkit",
			files: []string{"/x/libnccl.so.2", "/y/libnccl.so.2",
				"/opt/conda/envs/rl/lib/python3.10/site-packages/nvidia/nccl/lib/libnccl.so.2",
				"/home/u/.local/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2",
				"/usr/local/lib/python3.11/dist-packages/nvidia/nccl/lib/libnccl.so.2",
				"/usr/local/cuda-13.0/lib64/libnccl.so.2", "/usr/local/cuda-12.8/lib64/libnccl.so.2"},
			env: map[string]string{"TRACEGRPO_CUDA_LIBS": "/x:/missing", "LD_LIBRARY_PATH": "/y:", "CONDA_PREFIX": "/opt/conda/envs/rl", "HOME": "/home/u"},
			lib: ncclSpec,
			want: []libCandidate{
				{"/x/libnccl.so.2", "$TRACEGRPO_CUDA_LIBS"},
				{"/y/libnccl.so.2", "$LD_LIBRARY_PATH"},
				{"/opt/conda/envs/rl/lib/python3.10/site-packages/nvidia/nccl/lib/libnccl.so.2", "pip wheel, $CONDA_PREFIX's Python packages"},
				{"/home/u/.local/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2", "pip wheel, ~/.local's Python packages"},
				{"/usr/local/lib/python3.11/dist-packages/nvidia/nccl/lib/libnccl.so.2", "pip wheel, the Python packages of /usr/local"},
				{"/usr/local/cuda-13.0/lib64/libnccl.so.2", "where NCCL is installed outside the loader's path"},
				{"/usr/local/cuda-12.8/lib64/libnccl.so.2", "where NCCL is installed outside the loader's path"},
				{"libnccl.so.2", loaderFrom},
			},
		},
		{
			name: "the system's ld paths: ld.so.conf's includes (absolute and relative), comments, the trusted directories",
			files: []string{"/etc/ld.so.conf=# the system\ninclude /etc/ld.so.conf.d/*.conf\ninclude more.conf\n",
				"/etc/ld.so.conf.d/a.conf=/opt/nccl/lib # NCCL from a tarball\n", "/etc/more.conf=/srv/lib:/srv/lib2\n",
				"/opt/nccl/lib/libnccl.so.2", "/srv/lib2/libnccl.so.2", "/usr/lib/x86_64-linux-gnu/libnccl.so.2"},
			lib: ncclSpec,
			want: []libCandidate{
				{"/opt/nccl/lib/libnccl.so.2", "/etc/ld.so.conf"},
				{"/srv/lib2/libnccl.so.2", "/etc/ld.so.conf"},
				{"/usr/lib/x86_64-linux-gnu/libnccl.so.2", "the loader's default directories"},
				{"libnccl.so.2", loaderFrom},
			},
		},
		{
			name:  "the driver where a container mounts it",
			files: []string{"/usr/local/nvidia/lib64/libcuda.so.1"},
			lib:   driverSpec,
			want: []libCandidate{{"/usr/local/nvidia/lib64/libcuda.so.1", "where CUDA driver is installed outside the loader's path"},
				{"libcuda.so.1", loaderFrom}},
		},
		{
			name:  "nothing installed: the loader's search alone",
			files: []string{"/usr/bin/python3", "/usr/lib/python3/dist-packages/"},
			env:   map[string]string{"PATH": "/usr/bin"},
			lib:   ncclSpec,
			want:  []libCandidate{{"libnccl.so.2", loaderFrom}},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := libSearch{getenv: func(k string) string { return c.env[k] }, root: fakeTree(t, c.files)}
			if d := cmp.Diff(c.want, s.candidates(c.lib)); d != "" {
				t.Errorf("candidates (-want +got):\n%s", d)
			}
		})
	}
}

const loaderFrom = "the loader's search (its cache, ld.so.conf, the executable's RUNPATH)"

// TestLibSearchSearched: the message for a library found nowhere lists
// every directory searched, with why, and says so when none exists.
func TestLibSearchSearched(t *testing.T) {
	root := fakeTree(t, []string{"/opt/torch/.venv/bin/python3", torchVenv + "/nvidia/nccl/lib/", "/etc/ld.so.conf=/usr/lib64\n", "/usr/lib64/"})
	s := libSearch{getenv: func(k string) string { return map[string]string{"PATH": "/opt/torch/.venv/bin"}[k] }, root: root}
	want := ":\n  " + torchVenv + "/nvidia/nccl/lib (pip wheel, " + torchPy + ")\n  /usr/lib64 (/etc/ld.so.conf)"
	if d := cmp.Diff(want, s.searched(ncclSpec)); d != "" {
		t.Errorf("searched (-want +got):\n%s", d)
	}
	empty := libSearch{getenv: func(string) string { return "" }, root: t.TempDir()}
	if got := empty.searched(ncclSpec); !strings.Contains(got, "no directory to search exists") {
		t.Errorf("searched on an empty tree: %q", got)
	}
}

// TestBlasMajors: a cuBLAS newer than the driver's CUDA is never chosen.
func TestBlasMajors(t *testing.T) {
	for _, c := range []struct {
		driver int
		want   []int
	}{{13000, []int{13, 12, 11}}, {12080, []int{12, 11}}, {11080, []int{11}}, {0, []int{13, 12, 11}}, {14000, []int{13, 12, 11}}} {
		if d := cmp.Diff(c.want, blasMajors(c.driver)); d != "" {
			t.Errorf("driver %d (-want +got):\n%s", c.driver, d)
		}
	}
}

// TestLibraryChoiceString: a choice prints the path it chose and why, and
// every candidate it passed over; a failure prints the error.
func TestLibraryChoiceString(t *testing.T) {
	c := LibraryChoice{Name: "cuBLAS", Path: "/v/nvidia/cu13/lib/libcublas.so.13", From: "pip wheel, $VIRTUAL_ENV's Python packages",
		Passed: []string{"/x/libcublas.so.13 ($TRACEGRPO_CUDA_LIBS): wrong ELF class"}}
	want := "cuBLAS: /v/nvidia/cu13/lib/libcublas.so.13 (from pip wheel, $VIRTUAL_ENV's Python packages)\n" +
		"    passed over /x/libcublas.so.13 ($TRACEGRPO_CUDA_LIBS): wrong ELF class"
	if d := cmp.Diff(want, c.String()); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	if got := (LibraryChoice{Name: "NCCL", Err: errors.New("cuda: no NCCL found")}).String(); got != "NCCL: none: cuda: no NCCL found" {
		t.Errorf("failed choice: %q", got)
	}
}

// TestNCCLVersionString: both of NCCL's version encodings.
func TestNCCLVersionString(t *testing.T) {
	for v, want := range map[int]string{22105: "2.21.5", 22703: "2.27.3", 2804: "2.8.4", 2408: "2.4.8"} {
		if got := ncclVersionString(v); got != want {
			t.Errorf("ncclVersionString(%d) = %s, want %s", v, got, want)
		}
	}
}
