package gym

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// DigestVersion is the version byte of the digest encoding (Gym's
// DIGEST_VERSION). A stale digest must fail verification.
const DigestVersion = 1

// digestDomain is hashed first, with no header, in every digest.
const digestDomain = "nemo-gym-tokens"

// emptyDigest is ComputeDigest(nil): sha256 of the domain alone.
var emptyDigest = func() string {
	h := sha256.Sum256([]byte(digestDomain))
	return hex.EncodeToString(h[:])
}()

// ComputeDigest is Gym's compute_digest over an exact token sequence (spec
// §2.1): lowercase hex of sha256(domain || u8(1) || u64be(n) || u64be(tok)...),
// and sha256(domain) alone for the empty list. It panics on a negative token,
// which the decoders reject before any digest is computed (a programmer error
// here); use ComputeDigestChecked for untrusted input.
func ComputeDigest(tokens []int32) string {
	d, ok := computeDigest(tokens)
	if !ok {
		panic("gym: ComputeDigest: negative token id")
	}
	return d
}

// ComputeDigestChecked is ComputeDigest that reports a negative token instead
// of panicking.
func ComputeDigestChecked(tokens []int32) (string, bool) { return computeDigest(tokens) }

func computeDigest(tokens []int32) (string, bool) {
	if len(tokens) == 0 {
		return emptyDigest, true
	}
	h := sha256.New()
	var buf [4096]byte
	copy(buf[:], digestDomain)
	n := len(digestDomain)
	buf[n] = DigestVersion
	binary.BigEndian.PutUint64(buf[n+1:], uint64(len(tokens)))
	n += 9
	for _, t := range tokens {
		if t < 0 {
			return "", false
		}
		if n+8 > len(buf) {
			h.Write(buf[:n])
			n = 0
		}
		binary.BigEndian.PutUint64(buf[n:], uint64(t))
		n += 8
	}
	h.Write(buf[:n])
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])), true
}

// digestOfConcat is ComputeDigest(a ++ b) without building the slice.
func digestOfConcat(a, b []int32) (string, bool) {
	if len(a)+len(b) == 0 {
		return emptyDigest, true
	}
	h := sha256.New()
	var buf [4096]byte
	copy(buf[:], digestDomain)
	n := len(digestDomain)
	buf[n] = DigestVersion
	binary.BigEndian.PutUint64(buf[n+1:], uint64(len(a)+len(b)))
	n += 9
	for _, part := range [2][]int32{a, b} {
		for _, t := range part {
			if t < 0 {
				return "", false
			}
			if n+8 > len(buf) {
				h.Write(buf[:n])
				n = 0
			}
			binary.BigEndian.PutUint64(buf[n:], uint64(t))
			n += 8
		}
	}
	h.Write(buf[:n])
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])), true
}
