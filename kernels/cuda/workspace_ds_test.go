package cuda

import "testing"

// TestAttnDSLayout: attnDSRows is the sum of the rows before position L
// (64·(p/64+1) keys each, as csrc's attn_ds_row places them), and the
// stride attnDSStride gives each token keeps every sequence of at most
// maxLen tokens inside its own region, 16-byte aligned.
func TestAttnDSLayout(t *testing.T) {
	var sum int64
	for L := 0; L <= 700; L++ {
		if got := attnDSRows(L); got != sum {
			t.Fatalf("attnDSRows(%d) = %d, the rows before it hold %d", L, got, sum)
		}
		sum += 64 * int64(L/64+1)
	}
	for _, maxLen := range []int{1, 2, 63, 64, 65, 127, 128, 129, 300, 4096, 4097, 32768} {
		bt := attnDSStride(maxLen)
		if bt%8 != 0 {
			t.Errorf("maxLen %d: stride %d is not a multiple of 8 elements", maxLen, bt)
		}
		for L := 1; L <= maxLen; L++ {
			if attnDSRows(L) > int64(L)*int64(bt) {
				t.Fatalf("maxLen %d: a sequence of %d needs %d elements, its tokens' strides give %d", maxLen, L, attnDSRows(L), L*bt)
			}
		}
		if bt > 8+int(attnDSRows(maxLen)/int64(maxLen))+1 {
			t.Errorf("maxLen %d: stride %d wastes more than the rounding", maxLen, bt)
		}
	}
}
