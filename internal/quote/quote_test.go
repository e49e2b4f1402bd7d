package quote

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCut(t *testing.T) {
	for _, c := range []struct {
		s    string
		want string
	}{
		{"", `""`},
		{"RANK", `"RANK"`},
		{strings.Repeat("x", Max), strconv.Quote(strings.Repeat("x", Max))},
		{strings.Repeat("x", 120_000), strconv.Quote(strings.Repeat("x", Max)) + "… (120000 bytes)"},
		// A cut never splits a character: é is 2 bytes, so Max/2 fit.
		{strings.Repeat("é", Max), strconv.Quote(strings.Repeat("é", Max/2)) + fmt.Sprintf("… (%d bytes)", 2*Max)},
	} {
		if got := Cut(c.s); got != c.want {
			t.Errorf("Cut(%d bytes) = %.80s, want %.80s", len(c.s), got, c.want)
		}
	}
}

// TestCutQuoted: over random messages made of text and %q-quoted values
// of every length (with quotes, backslashes, newlines and non-ASCII in
// them), every value longer than Max comes out as Cut of it with its
// length, every other part byte for byte, and Writer writes the same.
func TestCutQuoted(t *testing.T) {
	rng := rand.New(rand.NewPCG(34, 12))
	alphabet := []string{"a", "b", "\"", "\\", "\n", "é", " ", "=", "\x00", "%q"}
	// text returns n bytes, or n+1 when its last character takes two.
	text := func(n int) string {
		var b strings.Builder
		for b.Len() < n {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		return b.String()
	}
	for trial := 0; trial < 500; trial++ {
		var msg, want strings.Builder
		for range 1 + rng.IntN(4) {
			prefix := "rank: " + strings.ReplaceAll(text(rng.IntN(20)), "\"", "'") + " "
			sizes := []int{0, 5, Max - 3, Max - 1, Max, Max + 1, Max + 40, 2 * Max, 3000, 120_000}
			v := text(sizes[rng.IntN(len(sizes))])
			msg.WriteString(prefix + strconv.Quote(v))
			want.WriteString(prefix)
			if len(v) > Max {
				want.WriteString(Cut(v))
				if !strings.Contains(Cut(v), fmt.Sprintf("(%d bytes)", len(v))) {
					t.Fatalf("Cut of %d bytes does not say its length", len(v))
				}
			} else {
				want.WriteString(strconv.Quote(v))
			}
		}
		got := CutQuoted(msg.String())
		if got != want.String() {
			t.Fatalf("CutQuoted(%.200q)\n = %.300q\nwant %.300q", msg.String(), got, want.String())
		}
		if !utf8.ValidString(got) && utf8.ValidString(msg.String()) {
			t.Fatalf("CutQuoted made invalid UTF-8 of %.100q", msg.String())
		}
		var buf bytes.Buffer
		if n, err := (Writer{&buf}).Write([]byte(msg.String())); err != nil || n != msg.Len() || buf.String() != got {
			t.Fatalf("Writer wrote %d of %d bytes (%v), %d bytes out", n, msg.Len(), err, buf.Len())
		}
	}
}
