package safetensors

import (
	"encoding/binary"
	"math"
)

// DType is a safetensors element type, spelled as in the header ("F32").
type DType string

// The element types this package converts to and from float32.
const (
	F32  DType = "F32"
	BF16 DType = "BF16"
	F16  DType = "F16"
)

// dtypeInfo lists the HF dtypes accepted on read with their sizes in bytes and
// their rank in HF's Dtype enum (the serializer writes higher ranks first).
var dtypeInfo = map[DType]struct{ size, rank int }{
	"BOOL":    {1, 0},
	"U8":      {1, 4},
	"I8":      {1, 5},
	"F8_E5M2": {1, 6},
	"F8_E4M3": {1, 7},
	"I16":     {2, 9},
	"U16":     {2, 10},
	F16:       {2, 11},
	BF16:      {2, 12},
	"I32":     {4, 13},
	"U32":     {4, 14},
	F32:       {4, 15},
	"F64":     {8, 16},
	"I64":     {8, 17},
	"U64":     {8, 18},
}

// Size returns the size of one element in bytes, or 0 for an unknown dtype.
func (d DType) Size() int { return dtypeInfo[d].size }

// Known reports whether d is a dtype this package accepts on read.
func (d DType) Known() bool { _, ok := dtypeInfo[d]; return ok }

// Float reports whether d converts to and from float32 (F32, BF16, F16).
func (d DType) Float() bool { return d == F32 || d == BF16 || d == F16 }

// decodeF32 converts len(dst) elements of dtype d from little-endian src.
func decodeF32(dst []float32, src []byte, d DType) {
	switch d {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	default:
		panic("safetensors: decodeF32 of " + string(d))
	}
}

// encodeF32 converts src to dtype d into little-endian dst.
func encodeF32(dst []byte, src []float32, d DType) {
	switch d {
	case F32:
		for i, x := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(x))
		}
	case BF16:
		for i, x := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], F32ToBF16(x))
		}
	case F16:
		for i, x := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], F32ToF16(x))
		}
	default:
		panic("safetensors: encodeF32 to " + string(d))
	}
}

// BF16ToF32 widens a bfloat16 bit pattern exactly.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 rounds x to bfloat16, to nearest even, like torch; a NaN stays a
// (quiet) NaN.
func F32ToBF16(x float32) uint16 {
	b := math.Float32bits(x)
	if b&0x7fffffff > 0x7f800000 { // NaN
		return uint16(b>>16) | 0x0040
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// F16ToF32 widens an IEEE half bit pattern exactly (subnormals, infinities
// and NaNs included).
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
	case man == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal: value = man · 2^-24.
	f := float32(man) * (1.0 / (1 << 24))
	if sign != 0 {
		f = -f
	}
	return f
}

// F32ToF16 rounds x to IEEE half, to nearest even; overflow gives ±Inf and a
// NaN stays a (quiet) NaN.
func F32ToF16(x float32) uint16 {
	b := math.Float32bits(x)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	man := b & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00 | uint16(man>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Subnormal half (or zero): shift the full significand right.
		if e < -10 {
			return sign
		}
		m := man | 0x800000
		shift := uint32(14 - e)
		half := uint32(1) << (shift - 1)
		r := m >> shift
		rem := m & (1<<shift - 1)
		if rem > half || (rem == half && r&1 == 1) {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(e)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && r&1 == 1) {
		r++ // may carry into the exponent, up to Inf: still correct
	}
	return sign | uint16(r)
}
