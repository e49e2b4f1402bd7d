package rollout

import (
	"strconv"
	"strings"
)

// The built-in tasks speak a tiny fixed vocabulary, so a model trained from
// scratch needs no tokenizer. VocabSize is the smallest model vocabulary that
// can play them; a larger model simply never needs the extra ids.
const (
	PAD     int32 = 0 // padding (inert rows)
	BOS     int32 = 1 // start of a context
	EOS     int32 = 2 // end of a model turn: the sampler's stop token
	USER    int32 = 3 // a user message follows
	ASSIST  int32 = 4 // the model's turn starts
	TOOL    int32 = 5 // the model calls the tool
	RESULT  int32 = 6 // a tool result follows
	SUMMARY int32 = 7 // a compacted summary of an earlier context follows
	ASK     int32 = 8 // a sub-question follows
	PLUS    int32 = 9 // the + sign
	Digit0  int32 = 10
	// Digits 0–9 are Digit0 … Digit0+9; ids 20…31 are unused filler.
	VocabSize = 32
)

var tokenNames = map[int32]string{
	PAD: "<pad>", BOS: "<s>", EOS: "</s>", USER: "USER", ASSIST: "ASSIST", TOOL: "TOOL",
	RESULT: "RESULT", SUMMARY: "SUMMARY", ASK: "ASK", PLUS: "+",
}

// Digit returns the token of decimal digit d (0–9).
func Digit(d int) int32 { return Digit0 + int32(d) }

// DigitOf returns the digit a token stands for, and whether it is a digit.
func DigitOf(tok int32) (int, bool) {
	if tok >= Digit0 && tok < Digit0+10 {
		return int(tok - Digit0), true
	}
	return 0, false
}

// Render writes tokens as readable text, for logs and tests.
func Render(tokens []int32) string {
	var b strings.Builder
	for i, t := range tokens {
		if i > 0 {
			b.WriteByte(' ')
		}
		if d, ok := DigitOf(t); ok {
			b.WriteString(strconv.Itoa(d))
		} else if n, ok := tokenNames[t]; ok {
			b.WriteString(n)
		} else {
			b.WriteString("#" + strconv.Itoa(int(t)))
		}
	}
	return b.String()
}
