// Package meminfo says how much host memory a process may still allocate:
// the lesser of what the kernel reports as available (MemAvailable of
// /proc/meminfo) and what the process's memory cgroup still allows (its
// limit minus its usage, cgroup v2 or v1). A run checks its memory plan
// against it before allocating, instead of dying in an out-of-memory crash.
package meminfo

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Available is the host memory this process can still allocate, and where
// the figure came from (for messages).
type Available struct {
	Bytes  int64
	Source string
}

// root is the file system root the files are read from (tests replace it).
var root = "/"

// Host returns the host memory available to this process. ok is false when
// nothing could be read (not Linux): the caller should then not refuse.
func Host() (a Available, ok bool) {
	best := int64(-1)
	if v, err := memAvailable(); err == nil {
		best, a.Source = v, "MemAvailable in /proc/meminfo"
	}
	if lim, used, where, err := cgroupRoom(); err == nil {
		if room := lim - used; best < 0 || room < best {
			best, a.Source = max(room, 0), fmt.Sprintf("the memory cgroup's limit %d minus its usage %d (%s)", lim, used, where)
		}
	}
	if best < 0 {
		return a, false
	}
	a.Bytes = best
	return a, true
}

func memAvailable() (int64, error) {
	b, err := os.ReadFile(filepath.Join(root, "proc/meminfo"))
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, err
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("meminfo: no MemAvailable")
}

// cgroupRoom reads this process's memory cgroup limit and usage: v2
// (memory.max, memory.current) first, then v1 (memory.limit_in_bytes,
// memory.usage_in_bytes). "max" or a v1 limit near 2^63 is no limit.
func cgroupRoom() (limit, usage int64, where string, err error) {
	self, err := os.ReadFile(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		return 0, 0, "", err
	}
	var v2, v1 string
	for _, line := range strings.Split(strings.TrimSpace(string(self)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case strings.Contains(","+parts[1]+",", ",memory,"):
			v1 = parts[2]
		}
	}
	read := func(p string) (int64, bool) {
		b, err := os.ReadFile(p)
		if err != nil {
			return 0, false
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return -1, true
		}
		v, err := strconv.ParseInt(s, 10, 64)
		return v, err == nil
	}
	try := func(dir, limFile, useFile string) (int64, int64, string, bool) {
		for d := dir; ; d = filepath.Dir(d) {
			base := filepath.Join(root, "sys/fs/cgroup", d)
			if lim, ok := read(filepath.Join(base, limFile)); ok {
				use, _ := read(filepath.Join(base, useFile))
				if lim >= 0 && lim < 1<<60 {
					return lim, use, filepath.Join(base, limFile), true
				}
			}
			if d == "/" || d == "." || d == "" {
				return 0, 0, "", false
			}
		}
	}
	if v2 != "" {
		if l, u, w, ok := try(v2, "memory.max", "memory.current"); ok {
			return l, u, w, nil
		}
		if l, u, w, ok := try(filepath.Join("unified", v2), "memory.max", "memory.current"); ok {
			return l, u, w, nil
		}
	}
	if v1 != "" {
		if l, u, w, ok := try(filepath.Join("memory", v1), "memory.limit_in_bytes", "memory.usage_in_bytes"); ok {
			return l, u, w, nil
		}
	}
	return 0, 0, "", fmt.Errorf("meminfo: no memory cgroup limit")
}

// Self returns this process's resident memory now (VmRSS) and its peak
// (VmHWM), from /proc/self/status; ok is false when it cannot be read.
func Self() (rss, peak int64, ok bool) {
	b, err := os.ReadFile(filepath.Join(root, "proc/self/status"))
	if err != nil {
		return 0, 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || (f[0] != "VmRSS:" && f[0] != "VmHWM:") {
			continue
		}
		kb, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return 0, 0, false
		}
		if f[0] == "VmRSS:" {
			rss = kb << 10
		} else {
			peak = kb << 10
		}
	}
	return rss, peak, rss > 0
}

// ResetPeak sets this process's peak resident memory (VmHWM) back to its
// resident memory now (Linux: "5" written to /proc/self/clear_refs), so
// that Self's peak measures from here on; ok is false where it cannot.
func ResetPeak() (ok bool) {
	return os.WriteFile(filepath.Join(root, "proc/self/clear_refs"), []byte("5"), 0) == nil
}
