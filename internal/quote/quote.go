// Package quote keeps the values a message quotes short: a value a user
// gave (an environment variable, a flag, a field of a file) can be any
// length, and a message that quotes 120 KB of it buries what it says. A
// quoted value is cut after Max bytes and says how long it was:
//
//	"abcdef…" (120000 bytes)
//
// Cut quotes one value so; CutQuoted rewrites every Go-quoted string of a
// finished message (fmt's %q) longer than that; Writer applies CutQuoted
// to everything written through it (cmd/train's standard error).
package quote

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"unicode/utf8"
)

// Max is how many bytes of a value a message quotes.
const Max = 256

// Cut returns s quoted as %q does, its first Max bytes only (whole UTF-8
// characters) followed by "…" and its length in bytes when it is longer.
func Cut(s string) string {
	if len(s) <= Max {
		return strconv.Quote(s)
	}
	n := Max
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(s[:n]), len(s))
}

// CutQuoted returns msg with every double-quoted Go string literal in it
// whose value is longer than Max bytes replaced by Cut of that value;
// everything else is kept byte for byte.
func CutQuoted(msg string) string {
	if len(msg) <= Max+2 {
		return msg
	}
	var b []byte // nil until something is cut
	last := 0
	for i := 0; i < len(msg); {
		j := indexQuote(msg, i)
		if j < 0 {
			break
		}
		q, err := strconv.QuotedPrefix(msg[j:])
		if err != nil || q[0] != '"' {
			i = j + 1
			continue
		}
		if len(q) > Max+2 {
			if v, err := strconv.Unquote(q); err == nil && len(v) > Max {
				b = append(b, msg[last:j]...)
				b = append(b, Cut(v)...)
				last = j + len(q)
			}
		}
		i = j + len(q)
	}
	if b == nil {
		return msg
	}
	return string(append(b, msg[last:]...))
}

func indexQuote(s string, from int) int {
	for k := from; k < len(s); k++ {
		if s[k] == '"' {
			return k
		}
	}
	return -1
}

// Writer writes everything through CutQuoted to W. Each Write is taken as
// whole messages (as fmt.Fprintf writes them); it reports every byte of p
// written when W took the cut text.
type Writer struct{ W io.Writer }

func (w Writer) Write(p []byte) (int, error) {
	if len(p) <= Max+2 || bytes.IndexByte(p, '"') < 0 {
		return w.W.Write(p)
	}
	s := CutQuoted(string(p))
	if _, err := io.WriteString(w.W, s); err != nil {
		return 0, err
	}
	return len(p), nil
}
