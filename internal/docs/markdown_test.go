package docs

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseBlocks(t *testing.T) {
	text := "intro\n" +
		"```sh\nmake run\n```\n" + // line 2
		"````text\n```sh\nnot a block\n```\n````\n" + // line 5: a fence of four holds one of three
		"  ~~~bash\n# needs: gpu\nnvidia-smi\n  ~~~\n" + // line 10
		"```sh\n#!/bin/bash\n# needs: cluster\nsrun x\n```\n" + // line 14
		"`inline` and ```code``` spans are not fences\n" +
		"```\nno language\n```\n" // line 20
	got, err := ParseBlocks("f.md", text)
	if err != nil {
		t.Fatal(err)
	}
	want := []Block{
		{File: "f.md", Line: 2, Lang: "sh", Text: "make run\n"},
		{File: "f.md", Line: 5, Lang: "text", Text: "```sh\nnot a block\n```\n"},
		{File: "f.md", Line: 10, Lang: "bash", Text: "# needs: gpu\nnvidia-smi\n", Needs: "gpu"},
		{File: "f.md", Line: 14, Lang: "sh", Text: "#!/bin/bash\n# needs: cluster\nsrun x\n", Needs: "cluster"},
		{File: "f.md", Line: 20, Lang: "", Text: "no language\n"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("ParseBlocks (-want +got):\n%s", d)
	}
	if got[1].Shell() || got[4].Shell() || !got[0].Shell() || !got[2].Shell() {
		t.Errorf("Shell: text and unlabelled blocks are not shell blocks; sh and bash are")
	}
}

func TestParseBlocksRefuses(t *testing.T) {
	for _, c := range []struct{ name, text, want string }{
		{"unclosed", "a\n```sh\nmake run\n", "f.md:2: the fence"},
		{"unknown need", "```sh\n# needs: tpu\nx\n```\n", "f.md:2: # needs: tpu: want one of gpu, cluster, suite"},
		{"marker not first", "```sh\nmake\n# needs: gpu\n```\n", "f.md:3: the marker"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseBlocks("f.md", c.text)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("ParseBlocks: %v, want an error containing %q", err, c.want)
			}
		})
	}
}

func TestParts(t *testing.T) {
	text := "a\n<!-- gen: one -->\nold one\n<!-- end gen: one -->\nb\n```text\n<!-- gen: quoted -->\n```\n<!-- gen: two -->\n<!-- end gen: two -->\nc\n"
	parts, err := ParseParts("f.md", text)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range parts {
		names = append(names, p.Name)
	}
	if d := cmp.Diff([]string{"one", "two"}, names); d != "" {
		t.Fatalf("parts (-want +got):\n%s", d)
	}
	if parts[0].Body != "old one\n" || parts[0].Line != 2 || parts[1].Body != "" || parts[1].Line != 9 {
		t.Errorf("parts %+v", parts)
	}
	got := Replace(text, parts, map[string]string{"one": "new\nlines", "two": "x\n"})
	want := "a\n<!-- gen: one -->\nnew\nlines\n<!-- end gen: one -->\nb\n```text\n<!-- gen: quoted -->\n```\n<!-- gen: two -->\nx\n<!-- end gen: two -->\nc\n"
	if got != want {
		t.Errorf("Replace:\n%s\nwant:\n%s", got, want)
	}
	if again := Replace(text, parts, map[string]string{}); again != text {
		t.Errorf("Replace with no bodies changed the text")
	}
}

func TestPartsRefused(t *testing.T) {
	for _, c := range []struct{ name, text, want string }{
		{"unclosed", "<!-- gen: a -->\nx\n", "f.md:1: gen: a is never closed"},
		{"nested", "<!-- gen: a -->\n<!-- gen: b -->\n", "f.md:2: gen: b opens inside a"},
		{"wrong close", "<!-- gen: a -->\n<!-- end gen: b -->\n", "f.md:2: end gen: b closes no open part"},
		{"twice", "<!-- gen: a -->\n<!-- end gen: a -->\n<!-- gen: a -->\n<!-- end gen: a -->\n", "f.md:3: gen: a is already a part at line 1"},
		{"malformed", "<!-- gen: Bad Name -->\n", "f.md:1: \"<!-- gen: Bad Name -->\": a marker is"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseParts("f.md", c.text)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("ParseParts: %v, want an error containing %q", err, c.want)
			}
		})
	}
}

func TestPrograms(t *testing.T) {
	for _, c := range []struct {
		text string
		want []string
	}{
		{"make run    # builds bin/train\n", []string{"make"}},
		{"mkdir -p a && bin/train --out a &\nwait $!\n", []string{"mkdir", "bin/train"}},
		{"for n in 1 2; do\n  sed -n \"$((4*n-3)),$((4*n))p\" f > g\n  mv g h\ndone\n", []string{"sed", "mv"}},
		{"X=1 Y=2 mpirun -np 2 \\\n  bin/train --steps 2\n", []string{"mpirun"}},
		{"if grep -q x f; then echo 'a | b; c'; fi\n", []string{"grep"}},
		{"cat f | tr a b\n(cd d; ls)\n", []string{"cat", "tr", "ls"}},
	} {
		if d := cmp.Diff(c.want, Programs(c.text)); d != "" {
			t.Errorf("Programs(%q) (-want +got):\n%s", c.text, d)
		}
	}
}

func TestIgnore(t *testing.T) {
	ig := ignore{"/bin/", "/runs/", "*.test", "/train", "/.cache"}
	for _, c := range []struct {
		rel  string
		dir  bool
		want bool
	}{
		{"bin", true, true}, {"bin", false, false}, {"cmd/train/bin", true, false},
		{"runs", true, true}, {"x/y.test", false, true}, {"train", false, true},
		{"cmd/train", true, false}, {".cache", true, true}, {"docs/README.md", false, false},
	} {
		if got := ig.ignored(c.rel, c.dir); got != c.want {
			t.Errorf("ignored(%q, dir %v) = %v, want %v", c.rel, c.dir, got, c.want)
		}
	}
}

func TestWrap(t *testing.T) {
	long := strings.Repeat("word ", 60)
	lines := strings.Split(strings.TrimSuffix(wrap(long), "\n"), "\n")
	for i, l := range lines {
		if len(l) > wrapWidth || i < len(lines)-1 && len(l) < wrapWidth-5 {
			t.Errorf("wrap: a line of %d characters (width %d): %q", len(l), wrapWidth, l)
		}
	}
	if got := wrap("a  b\nc"); got != "a b c\n" {
		t.Errorf("wrap: %q", got)
	}
	if got := comma(1234567); got != "1,234,567" {
		t.Errorf("comma(1234567) = %q", got)
	}
}

// TestSameBuiltinJob: the built-in job's part is the same across runs that
// differ in their timings only, and differs when anything else does.
func TestSameBuiltinJob(t *testing.T) {
	a := "mean reward 0.029 to 0.620, 2.9 MB in 16 files:\n" +
		"step 150/300 | reward 0.570 ± 0.132 | loss -0.0034 | rows 104+8 pad | 336 tok, 33320 tok/s, reuse 6.08x | 0.13s, eta 5s\n"
	b := strings.NewReplacer("33320 tok/s", "154692 tok/s", "0.13s, eta 5s", "0.08s, eta 1m7s", "2.9 MB", "3.0 MB").Replace(a)
	if !sameBuiltinJob(a, b) {
		t.Errorf("parts that differ in timings only compare different:\n%s\n%s", a, b)
	}
	for _, diff := range []string{"0.620", "16 files", "reward 0.570", "336 tok", "reuse 6.08x"} {
		c := strings.Replace(a, diff, strings.Replace(diff, "6", "7", 1)+"9", 1)
		if sameBuiltinJob(a, c) {
			t.Errorf("parts that differ in %q compare the same", diff)
		}
	}
}
