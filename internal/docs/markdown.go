// Package docs keeps README.md and docs/*.md true: it finds their fenced
// shell blocks (which the package's tests run) and their generated parts,
// which it writes from the output of the commands that print them.
//
// A shell block is a fence whose info string is sh, bash, shell or console.
// A block that cannot run on a CPU machine says why in a comment line of its
// own, the block's first (or the one after a #! line):
//
//	# needs: gpu       an NVIDIA GPU
//	# needs: cluster   several machines or a scheduler
//	# needs: suite     the test suite itself (make test)
//
// A generated part is the text between two comment lines,
//
//	<!-- gen: NAME -->
//	...
//	<!-- end gen: NAME -->
//
// whose body the generator NAME (Generators) writes. A part's body is
// whole lines; the marker lines are kept as they are.
package docs

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Needs are the values a "# needs:" marker may take.
var Needs = []string{"gpu", "cluster", "suite"}

// shellLangs are the fence info strings of a shell block.
var shellLangs = []string{"sh", "bash", "shell", "console"}

// Block is one fenced code block of a Markdown file.
type Block struct {
	File  string // the file's path as given to ParseBlocks
	Line  int    // the line of the opening fence, from 1
	Lang  string // the info string's first word ("" for none)
	Text  string // the lines between the fences, each ending in \n
	Needs string // the "# needs:" marker's value ("" for none)
}

// Shell reports whether b is a shell block.
func (b Block) Shell() bool { return slices.Contains(shellLangs, b.Lang) }

func (b Block) String() string { return fmt.Sprintf("%s:%d", b.File, b.Line) }

var needsRE = regexp.MustCompile(`^#\s*needs:\s*([A-Za-z0-9_-]+)`)

// ParseBlocks returns the fenced blocks of the Markdown text of file, in
// order. A fence is three or more backquotes or tildes at the start of a
// line (up to three spaces in); it closes at a line of the same character,
// at least as long, and nothing else. An unclosed fence is an error naming
// its line. The "# needs:" marker of a shell block is its first line, or
// its second after a #! line; an unknown value is an error.
func ParseBlocks(file, text string) ([]Block, error) {
	var out []Block
	lines := strings.SplitAfter(text, "\n")
	for i := 0; i < len(lines); i++ {
		fence, info, ok := openFence(lines[i])
		if !ok {
			continue
		}
		b := Block{File: file, Line: i + 1, Lang: firstWord(info)}
		j := i + 1
		for ; j < len(lines); j++ {
			if closesFence(lines[j], fence) {
				break
			}
			b.Text += lines[j]
		}
		if j == len(lines) {
			return nil, fmt.Errorf("%s:%d: the fence %q is never closed", file, i+1, fence)
		}
		if b.Shell() {
			n, err := needs(b)
			if err != nil {
				return nil, err
			}
			b.Needs = n
		}
		out = append(out, b)
		i = j
	}
	return out, nil
}

// openFence reports whether line opens a fence, with the fence and the
// info string.
func openFence(line string) (fence, info string, ok bool) {
	s := strings.TrimRight(line, "\r\n")
	trimmed := strings.TrimLeft(s, " ")
	if len(s)-len(trimmed) > 3 || len(trimmed) < 3 {
		return "", "", false
	}
	c := trimmed[0]
	if c != '`' && c != '~' {
		return "", "", false
	}
	n := 0
	for n < len(trimmed) && trimmed[n] == c {
		n++
	}
	if n < 3 {
		return "", "", false
	}
	info = strings.TrimSpace(trimmed[n:])
	if c == '`' && strings.Contains(info, "`") {
		return "", "", false // an inline code span, not a fence
	}
	return trimmed[:n], info, true
}

func closesFence(line, fence string) bool {
	s := strings.TrimSpace(line)
	return len(s) >= len(fence) && strings.Trim(s, fence[:1]) == "" && len(line)-len(strings.TrimLeft(line, " ")) <= 3
}

func firstWord(s string) string {
	if f := strings.Fields(s); len(f) > 0 {
		return f[0]
	}
	return ""
}

// needs returns b's "# needs:" marker.
func needs(b Block) (string, error) {
	lines := strings.Split(b.Text, "\n")
	at := 0
	if len(lines) > 1 && strings.HasPrefix(lines[0], "#!") {
		at = 1
	}
	for i, l := range lines {
		m := needsRE.FindStringSubmatch(strings.TrimSpace(l))
		if m == nil {
			continue
		}
		if i != at {
			return "", fmt.Errorf("%s:%d: the marker %q must be the block's first line (or the one after #!)", b.File, b.Line+1+i, strings.TrimSpace(l))
		}
		if !slices.Contains(Needs, m[1]) {
			return "", fmt.Errorf("%s:%d: # needs: %s: want one of %s", b.File, b.Line+1+i, m[1], strings.Join(Needs, ", "))
		}
		return m[1], nil
	}
	return "", nil
}

// Part is one generated part of a Markdown file.
type Part struct {
	Name string
	Line int // the line of its opening marker, from 1
	// Body is the text between the marker lines; [Start, End) is its byte
	// range in the file's text.
	Body       string
	Start, End int
}

var (
	genOpenRE  = regexp.MustCompile(`^<!-- gen: ([a-z0-9][a-z0-9._-]*) -->$`)
	genCloseRE = regexp.MustCompile(`^<!-- end gen: ([a-z0-9][a-z0-9._-]*) -->$`)
	genAnyRE   = regexp.MustCompile(`^\s*<!--\s*(end\s+)?gen\b`)
)

// ParseParts returns the generated parts of the Markdown text of file. A
// part opened and not closed, closed under another name, nested, or closed
// without an opening is an error naming the line, and so is a name used
// twice in one file. Markers inside fenced blocks are text, not markers.
func ParseParts(file, text string) ([]Part, error) {
	var out []Part
	var cur *Part
	seen := map[string]int{}
	off, lineNo := 0, 0
	fence := ""
	for _, line := range strings.SplitAfter(text, "\n") {
		lineNo++
		start := off
		off += len(line)
		s := strings.TrimRight(line, "\r\n")
		if fence != "" {
			if closesFence(line, fence) {
				fence = ""
			}
			continue
		}
		if f, _, ok := openFence(line); ok {
			fence = f
			continue
		}
		if m := genOpenRE.FindStringSubmatch(s); m != nil {
			if cur != nil {
				return nil, fmt.Errorf("%s:%d: gen: %s opens inside %s (opened at line %d)", file, lineNo, m[1], cur.Name, cur.Line)
			}
			if l, dup := seen[m[1]]; dup {
				return nil, fmt.Errorf("%s:%d: gen: %s is already a part at line %d", file, lineNo, m[1], l)
			}
			seen[m[1]] = lineNo
			cur = &Part{Name: m[1], Line: lineNo, Start: off}
			continue
		}
		if m := genCloseRE.FindStringSubmatch(s); m != nil {
			if cur == nil || cur.Name != m[1] {
				return nil, fmt.Errorf("%s:%d: end gen: %s closes no open part", file, lineNo, m[1])
			}
			cur.End = start
			cur.Body = text[cur.Start:cur.End]
			out = append(out, *cur)
			cur = nil
			continue
		}
		if genAnyRE.MatchString(s) {
			return nil, fmt.Errorf("%s:%d: %q: a marker is <!-- gen: NAME --> or <!-- end gen: NAME --> on a line of its own (NAME: a-z, 0-9, ., _, -)", file, lineNo, s)
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: gen: %s is never closed", file, cur.Line, cur.Name)
	}
	return out, nil
}

// Replace returns text with the bodies of its parts replaced by bodies
// (by name); a part not in bodies keeps its body.
func Replace(text string, parts []Part, bodies map[string]string) string {
	var b strings.Builder
	at := 0
	for _, p := range parts {
		body, ok := bodies[p.Name]
		if !ok {
			continue
		}
		if body != "" && !strings.HasSuffix(body, "\n") {
			body += "\n"
		}
		b.WriteString(text[at:p.Start])
		b.WriteString(body)
		at = p.End
	}
	b.WriteString(text[at:])
	return b.String()
}

// shellSkip are the words that start a shell command without naming a
// program: keywords that stand alone or take a list, and builtins.
var (
	shellPrefix = []string{"do", "then", "else", "elif", "if", "while", "until", "!", "time", "{"}
	shellAlone  = []string{"for", "in", "done", "fi", "esac", "case", "function", "}", "select"}
	shellBuilt  = []string{"cd", "export", "wait", "set", "echo", "printf", "exit", "return", "test", "[", "[[", "true", "false",
		"read", "source", ".", "shift", "unset", "local", "trap", "kill", ":", "pwd", "exec", "eval"}
)

var (
	quotedRE = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'[^']*'`)
	opRE     = regexp.MustCompile(`&&|\|\||\$\(|[|;&()` + "`" + `]`)
)

// Programs returns the programs the shell text runs, each once, in order:
// the first word of every simple command, after the keywords that lead
// one (do, then, if, ...), less builtins and variable assignments. It reads
// the grammar well enough for documentation (no here-documents, no
// commands inside quotes).
func Programs(text string) []string {
	text = strings.ReplaceAll(text, "\\\n", " ")
	var out []string
	for _, line := range strings.Split(text, "\n") {
		line = quotedRE.ReplaceAllString(line, "Q")
		if i := commentAt(line); i >= 0 {
			line = line[:i]
		}
		for _, seg := range opRE.Split(line, -1) {
			w := strings.Fields(seg)
			for len(w) > 0 && (slices.Contains(shellPrefix, w[0]) || isAssignment(w[0])) {
				w = w[1:]
			}
			if len(w) == 0 || slices.Contains(shellAlone, w[0]) || slices.Contains(shellBuilt, w[0]) ||
				strings.HasPrefix(w[0], ">") || strings.HasPrefix(w[0], "<") || w[0] == "Q" {
				continue
			}
			if !slices.Contains(out, w[0]) {
				out = append(out, w[0])
			}
		}
	}
	return out
}

// commentAt is the index of the # that starts a comment on line (at the
// start or after a blank), or -1.
func commentAt(line string) int {
	for i := 0; i < len(line); i++ {
		if line[i] == '#' && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t') {
			return i
		}
	}
	return -1
}

func isAssignment(w string) bool {
	i := strings.IndexByte(w, '=')
	return i > 0 && !strings.ContainsAny(w[:i], "/-.$")
}
