package cuda

// Where the CUDA libraries are looked for. Pure Go, without cgo, so that the
// search runs (and is tested, on fake directory trees) on any machine; the
// binding (driver.go, nccl.go) dlopens what it finds, in order.
//
// A library is searched for in these directories, in this order, and each
// directory where one of its file names exists is a candidate:
//
//  1. $TRACEGRPO_CUDA_LIBS, then $LD_LIBRARY_PATH (':'-separated);
//  2. the active Python environment's site-packages ($VIRTUAL_ENV,
//     $CONDA_PREFIX), then those of every python3 on $PATH (a virtualenv's
//     bin/ on PATH without VIRTUAL_ENV, as a container image sets it), then
//     the usual installs (~/.local, /opt/*/.venv, /opt/*/venv, /opt/conda,
//     /usr/local/lib/python3*, /usr/lib/python3): in each, the directories
//     NVIDIA's pip wheels install the library into (CUDA 13's
//     nvidia/cu13/lib, CUDA 12's nvidia/cublas/lib, nvidia/nccl/lib);
//  3. the system's ld paths: /etc/ld.so.conf and its includes, then the
//     loader's trusted directories;
//  4. the CUDA toolkit's (/usr/local/cuda/lib64, /usr/local/cuda-*/lib64)
//     and, for the driver, the container runtime's (/usr/local/nvidia/lib64)
//     and WSL's (/usr/lib/wsl/lib).
//
// The bare file names come last, for the loader's own search (its cache).

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// libSpec is one library the backend loads.
type libSpec struct {
	name  string   // for messages: "cuBLAS"
	files []string // file names, preferred first: "libcublas.so.13"
	wheel []string // directories under site-packages that pip wheels install it into
	extra []string // directories beyond the system's ld paths
	// brief: when no file of the name exists anywhere, the error is one
	// line (the driver's: that is every machine without a GPU).
	brief bool
}

// cudaToolkitDirs are where CUDA toolkits install their libraries.
var cudaToolkitDirs = []string{"/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/local/cuda-*/lib64"}

// blasSpec is cuBLAS of CUDA major versions majors (newest first).
func blasSpec(majors []int) libSpec {
	s := libSpec{name: "cuBLAS", wheel: []string{"nvidia/cu13/lib", "nvidia/cublas/lib"}, extra: cudaToolkitDirs}
	for _, m := range majors {
		s.files = append(s.files, fmt.Sprintf("libcublas.so.%d", m))
	}
	return s
}

// ncclSpec is NCCL 2 (its CUDA 12 and 13 wheels both install nvidia/nccl/lib).
var ncclSpec = libSpec{name: "NCCL", files: []string{"libnccl.so.2"}, wheel: []string{"nvidia/nccl/lib", "nvidia/cu13/lib"},
	extra: cudaToolkitDirs}

// driverSpec is the driver, which the loader finds on almost every machine;
// the directories are for containers whose loader cache does not list the
// mounted driver.
var driverSpec = libSpec{name: "CUDA driver", files: []string{"libcuda.so.1"},
	extra: []string{"/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/wsl/lib"}, brief: true}

// libDir is a directory searched, and why it is searched.
type libDir struct {
	Dir, From string
}

// libCandidate is a file to dlopen: a path, or a bare file name for the
// loader's own search.
type libCandidate struct {
	Path, From string
}

// libSearch searches a file system: the real one, or (tests) a fake tree.
type libSearch struct {
	getenv func(string) string
	// root is prepended to every absolute path the search reads ("" for the
	// real file system); the paths it returns are without it.
	root string
}

// hostSearch searches this machine.
var hostSearch = libSearch{getenv: os.Getenv}

func (s libSearch) real(p string) string {
	if s.root == "" {
		return p
	}
	return filepath.Join(s.root, p)
}

func (s libSearch) exists(p string) bool {
	_, err := os.Stat(s.real(p))
	return err == nil
}

func (s libSearch) isDir(p string) bool {
	fi, err := os.Stat(s.real(p))
	return err == nil && fi.IsDir()
}

// glob returns the matches of pattern, newest-looking first (reverse
// lexical order: python3.12 before python3.11, cuda-13.0 before cuda-12.8).
func (s libSearch) glob(pattern string) []string {
	if !strings.ContainsAny(pattern, "*?[") {
		if s.exists(pattern) {
			return []string{pattern}
		}
		return nil
	}
	m, _ := filepath.Glob(s.real(pattern))
	out := make([]string, 0, len(m))
	for _, p := range m {
		if s.root != "" {
			p = "/" + strings.TrimPrefix(strings.TrimPrefix(p, s.root), "/")
		}
		out = append(out, p)
	}
	sort.Sort(sort.Reverse(sort.StringSlice(out)))
	return out
}

// envList splits a ':'-separated variable.
func (s libSearch) envList(name string) []string {
	var out []string
	for _, d := range filepath.SplitList(s.getenv(name)) {
		if d != "" {
			out = append(out, d)
		}
	}
	return out
}

// sitePackages lists the Python package directories to look in for NVIDIA's
// wheels, most specific first, each with why.
func (s libSearch) sitePackages() []libDir {
	var out []libDir
	add := func(prefix, from string) {
		for _, pat := range []string{"lib/python3*/site-packages", "lib/python3*/dist-packages", "lib/python3/dist-packages",
			"local/lib/python3*/dist-packages"} {
			for _, d := range s.glob(filepath.Join(prefix, pat)) {
				out = append(out, libDir{d, from})
			}
		}
	}
	for _, v := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		if p := s.getenv(v); p != "" {
			add(p, "$"+v+"'s Python packages")
		}
	}
	for _, d := range s.envList("PATH") {
		for _, py := range []string{"python3", "python"} {
			if s.exists(filepath.Join(d, py)) {
				add(filepath.Dir(filepath.Clean(d)), "the Python packages of "+filepath.Join(d, py)+" (on PATH)")
				break
			}
		}
	}
	if h := s.getenv("HOME"); h != "" {
		add(filepath.Join(h, ".local"), "~/.local's Python packages")
		for _, p := range []string{".venv", "venv", "miniconda3", "miniforge3", "anaconda3", ".pyenv/versions/*"} {
			for _, d := range s.glob(filepath.Join(h, p)) {
				add(d, "the Python packages of "+d)
			}
		}
	}
	for _, p := range []string{"/opt/*/.venv", "/opt/*/venv", "/opt/venv", "/opt/conda", "/opt/*", "/usr/local", "/usr"} {
		for _, d := range s.glob(p) {
			add(d, "the Python packages of "+d)
		}
	}
	return out
}

// ldConfDirs reads the loader's configuration file path (ld.so.conf's
// format: a directory per line, "include GLOB", '#' comments) with its
// includes, depth levels deep at most.
func (s libSearch) ldConfDirs(path string, depth int) []string {
	f, err := os.Open(s.real(path))
	if err != nil || depth > 8 {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		fields := strings.Fields(line)
		switch {
		case len(fields) == 0:
		case fields[0] == "include":
			for _, pat := range fields[1:] {
				if !filepath.IsAbs(pat) {
					pat = filepath.Join(filepath.Dir(path), pat)
				}
				for _, inc := range s.glob(pat) {
					out = append(out, s.ldConfDirs(inc, depth+1)...)
				}
			}
		case fields[0] == "hwcap":
		default:
			out = append(out, strings.FieldsFunc(line, func(r rune) bool { return r == ':' || r == ',' || r == ' ' || r == '\t' })...)
		}
	}
	return out
}

// loaderDirs are the directories the loader searches without a cache
// entry (glibc's trusted directories, x86-64 and multiarch).
var loaderDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"}

// dirs lists every directory to search for lib, in order, without
// duplicates and without directories that do not exist.
func (s libSearch) dirs(lib libSpec) []libDir {
	var all []libDir
	for _, env := range []string{"TRACEGRPO_CUDA_LIBS", "LD_LIBRARY_PATH"} {
		for _, d := range s.envList(env) {
			all = append(all, libDir{d, "$" + env})
		}
	}
	for _, sp := range s.sitePackages() {
		for _, w := range lib.wheel {
			all = append(all, libDir{filepath.Join(sp.Dir, w), "pip wheel, " + sp.From})
		}
	}
	for _, d := range s.ldConfDirs("/etc/ld.so.conf", 0) {
		all = append(all, libDir{d, "/etc/ld.so.conf"})
	}
	for _, d := range loaderDirs {
		all = append(all, libDir{d, "the loader's default directories"})
	}
	for _, pat := range lib.extra {
		for _, d := range s.glob(pat) {
			all = append(all, libDir{d, "where " + lib.name + " is installed outside the loader's path"})
		}
	}
	seen := map[string]bool{}
	var out []libDir
	for _, d := range all {
		d.Dir = filepath.Clean(d.Dir)
		if seen[d.Dir] || !s.isDir(d.Dir) {
			continue
		}
		seen[d.Dir] = true
		out = append(out, d)
	}
	return out
}

// candidates lists the files to dlopen for lib, in order: for each
// directory of dirs, the files of lib.files present there (preferred
// first), then the bare file names for the loader's own search.
func (s libSearch) candidates(lib libSpec) []libCandidate {
	var out []libCandidate
	for _, d := range s.dirs(lib) {
		for _, f := range lib.files {
			if p := filepath.Join(d.Dir, f); s.exists(p) {
				out = append(out, libCandidate{p, d.From})
			}
		}
	}
	for _, f := range lib.files {
		out = append(out, libCandidate{f, "the loader's search (its cache, ld.so.conf, the executable's RUNPATH)"})
	}
	return out
}

// searched describes the directories searched for lib, for an error
// saying it was not found.
func (s libSearch) searched(lib libSpec) string {
	var b strings.Builder
	for _, d := range s.dirs(lib) {
		fmt.Fprintf(&b, "\n  %s (%s)", d.Dir, d.From)
	}
	if b.Len() == 0 {
		return " (no directory to search exists)"
	}
	return ":" + b.String()
}

// froms summarises why the directories searched for lib were searched
// ("$LD_LIBRARY_PATH, /etc/ld.so.conf, ...").
func (s libSearch) froms(lib libSpec) string {
	var out []string
	for _, d := range s.dirs(lib) {
		if !slices.Contains(out, d.From) {
			out = append(out, d.From)
		}
	}
	return strings.Join(out, ", ")
}

// LibraryChoice says where one library was loaded from and why: what the
// search found before it and could not use, and what it chose.
type LibraryChoice struct {
	Name string // "CUDA driver", "cuBLAS", "cuBLASLt", "NCCL"
	Path string // the file loaded ("" when none could be)
	From string // why that path was searched
	// Passed are the candidates tried before Path, each with why it
	// failed (or why it was skipped).
	Passed []string
	Err    error // why nothing was loaded (Path == "")
}

func (c LibraryChoice) String() string {
	var b strings.Builder
	if c.Path != "" {
		fmt.Fprintf(&b, "%s: %s (from %s)", c.Name, c.Path, c.From)
	} else {
		fmt.Fprintf(&b, "%s: none: %v", c.Name, c.Err)
	}
	for _, p := range c.Passed {
		fmt.Fprintf(&b, "\n    passed over %s", p)
	}
	return b.String()
}

// blasMajors are the cuBLAS major versions a driver of CUDA version
// driverVersion (1000·major + 10·minor; 0 if unknown) can run, newest
// first: a cuBLAS newer than the driver fails at its first call.
func blasMajors(driverVersion int) []int {
	var out []int
	for _, m := range []int{13, 12, 11} {
		if driverVersion == 0 || m <= driverVersion/1000 {
			out = append(out, m)
		}
	}
	return out
}
