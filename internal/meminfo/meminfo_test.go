package meminfo

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	p := filepath.Join(dir, name)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestHost reads fake /proc and /sys trees: the lesser of MemAvailable and
// the cgroup's room wins, "max" and v1's near-2^63 are no limit.
func TestHost(t *testing.T) {
	defer func(r string) { root = r }(root)
	for _, c := range []struct {
		name  string
		files map[string]string
		want  int64
		src   string
	}{
		{"meminfo only", map[string]string{"proc/meminfo": "MemTotal: 100 kB\nMemAvailable:   2048 kB\n"}, 2 << 20, "MemAvailable"},
		{"cgroup v2 tighter", map[string]string{
			"proc/meminfo":                     "MemAvailable: 4096 kB\n",
			"proc/self/cgroup":                 "0::/job\n",
			"sys/fs/cgroup/job/memory.max":     "3000000\n",
			"sys/fs/cgroup/job/memory.current": "1000000\n",
		}, 2000000, "memory.max"},
		{"cgroup v2 max", map[string]string{
			"proc/meminfo":                     "MemAvailable: 4096 kB\n",
			"proc/self/cgroup":                 "0::/job\n",
			"sys/fs/cgroup/job/memory.max":     "max\n",
			"sys/fs/cgroup/job/memory.current": "1\n",
		}, 4 << 20, "MemAvailable"},
		{"cgroup v1 limit", map[string]string{
			"proc/meminfo":     "MemAvailable: 4096 kB\n",
			"proc/self/cgroup": "9:name=systemd:/\n4:memory:/slurm/job7\n",
			"sys/fs/cgroup/memory/slurm/job7/memory.limit_in_bytes": "1500000\n",
			"sys/fs/cgroup/memory/slurm/job7/memory.usage_in_bytes": "500000\n",
		}, 1000000, "limit_in_bytes"},
		{"cgroup v1 unlimited", map[string]string{
			"proc/meminfo":     "MemAvailable: 4096 kB\n",
			"proc/self/cgroup": "4:memory:/\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
			"sys/fs/cgroup/memory/memory.usage_in_bytes": "500000\n",
		}, 4 << 20, "MemAvailable"},
	} {
		dir := t.TempDir()
		for name, content := range c.files {
			write(t, dir, name, content)
		}
		root = dir
		a, ok := Host()
		if !ok || a.Bytes != c.want || !strings.Contains(a.Source, c.src) {
			t.Errorf("%s: %+v, %v; want %d from %s", c.name, a, ok, c.want, c.src)
		}
	}
	root = t.TempDir()
	if _, ok := Host(); ok {
		t.Error("an empty tree reported memory")
	}
}
