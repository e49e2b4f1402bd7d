// Package safetensors reads and writes Hugging Face's safetensors tensor file
// format. It deals in names, shapes and bytes only and imports no model code.
//
// # Byte layout
//
//	offset 0      u64 little-endian N: the header length in bytes
//	offset 8      N bytes of UTF-8 JSON, padded with spaces to a multiple of 8:
//	              {"__metadata__": {"format": "pt", ...string: string},
//	               "NAME": {"dtype": "F32", "shape": [d0, d1, ...],
//	                        "data_offsets": [BEGIN, END]}, ...}
//	offset 8+N    the data section: each tensor's elements, row-major,
//	              little-endian, at [BEGIN, END) relative to offset 8+N
//
// # Invariants checked on read
//
// The header length is bounded by the file: a header (and so a tensor table)
// that would need more bytes than the file holds is rejected before anything
// is allocated for it. The header starts with '{', holds one JSON object with
// no duplicate keys, and nothing but whitespace after it. Every tensor has a
// known dtype, non-negative dimensions and END−BEGIN = numel·sizeof(dtype).
// Sorted by offset, the tensors tile the data section exactly: the first
// begins at 0, each begins where the previous one ends, and the last ends at
// the end of the file (no gaps, no overlaps, no trailing bytes), as HF's
// reference implementation requires.
//
// # Writing
//
// Writer streams a file: the tensor table is declared up front, the header is
// written at once, and tensor data follows in file order (dtype alignment
// descending, then name, like HF's serializer; for a single dtype that is name
// order). "format": "pt" is always present in __metadata__ so that
// transformers loads the file unchanged; callers add their own format name and
// version there.
//
// F32, BF16 and F16 convert to and from float32 (round to nearest even on
// write, like torch). Other HF dtypes are accepted on read and can be read as
// raw bytes.
package safetensors
