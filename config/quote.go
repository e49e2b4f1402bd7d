package config

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// maxQuoted bounds a value quoted in an error message: a 120 KB value
// (an environment variable, a generated override) is cut, with its length.
const maxQuoted = 256

// clip is s cut at maxQuoted bytes (at a rune boundary), with its length
// said when cut.
func clip(s string) string {
	if len(s) <= maxQuoted {
		return s
	}
	return s[:cutAt(s)] + fmt.Sprintf("... (%d bytes)", len(s))
}

// quote is s quoted as %q quotes it, cut as clip cuts it.
func quote(s string) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:cutAt(s)]) + fmt.Sprintf("... (%d bytes)", len(s))
}

func cutAt(s string) int {
	n := maxQuoted
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return n
}
