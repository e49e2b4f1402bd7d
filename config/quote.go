package config

import (
	"fmt"
	"unicode/utf8"

	"github.com/tracegrpo/tracegrpo/internal/quote"
)

// Values quoted in the loader's messages are cut as internal/quote cuts
// them (a 120 KB value would bury the message): quoted by quoted, and
// unquoted (a key path, an override's text) by clip.

// quoted is s quoted as %q quotes it, cut after quote.Max bytes with its
// length.
func quoted(s string) string { return quote.Cut(s) }

// clip is s cut after quote.Max bytes (at a rune boundary) with its length.
func clip(s string) string {
	if len(s) <= quote.Max {
		return s
	}
	n := quote.Max
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return fmt.Sprintf("%s… (%d bytes)", s[:n], len(s))
}
