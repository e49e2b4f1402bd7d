package checkpoint

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/tracegrpo/tracegrpo/internal/safetensors"
)

// Sharded checkpoints (fully sharded data parallel). Each rank writes the
// part of every parameter it owns, and its Adam moments, into a shard file
// of its own; rank 0 writes one index of the pieces, the HF export
// (model.safetensors, streamed from the ranks) and the rest:
//
//	<dir>/step_<N>/model.safetensors                 HF weights (as unsharded)
//	<dir>/step_<N>/config.json, trainer_state.json   as unsharded
//	<dir>/step_<N>/shards.index.json                 ShardIndex: every parameter's pieces
//	<dir>/step_<N>/shard-<RRRRR>-of-<WWWWW>.safetensors  rank R of W: for each piece it
//	        owns, the 1-D F32 tensors <name>, <name>.exp_avg, <name>.exp_avg_sq
//	        (<name> alone when the trainer state says no_optimizer)
//	<dir>/step_<N>/manifest.json, DONE               as unsharded: every file's size and sha256
//
// A shard file's __metadata__ holds tracegrpo_format "checkpoint-shard",
// tracegrpo_version, step, rank, world_size, crc32c_block (CRCBlock) and,
// for every tensor T, "crc32c:T": the CRC-32C (Castagnoli) of each
// CRCBlock-byte block of T's data, little-endian uint32s in base64. A
// resume at any world size, sharded or not, reads through Tensors only the
// byte ranges it owns, rounded out to whole CRC blocks, and checks every
// block it reads; train verify checks every file's sha256 as for any
// checkpoint.

// ShardIndexFile is a sharded checkpoint's index.
const ShardIndexFile = "shards.index.json"

// CRCBlock is the byte length of a shard tensor's checksummed blocks.
const CRCBlock = 256 << 10

const (
	shardIndexFormat = "tracegrpo-shards"
	shardFileKind    = "checkpoint-shard"
)

// The kinds of a parameter's tensors: its weights and its Adam moments.
const (
	KindWeights = iota
	KindExpAvg
	KindExpAvgSq
	NumKinds
)

// KindSuffix is each kind's suffix to a parameter's name, as in the
// unsharded optimizer.safetensors.
var KindSuffix = [NumKinds]string{"", ".exp_avg", ".exp_avg_sq"}

// ShardFile is rank's shard file name in a checkpoint of world ranks.
func ShardFile(rank, world int) string {
	return fmt.Sprintf("shard-%05d-of-%05d.safetensors", rank, world)
}

func parseShardFile(name string) (rank, world int, ok bool) {
	var r, w int
	if n, err := fmt.Sscanf(name, "shard-%05d-of-%05d.safetensors", &r, &w); n != 2 || err != nil {
		return 0, 0, false
	}
	if w < 1 || r < 0 || r >= w || name != ShardFile(r, w) {
		return 0, 0, false
	}
	return r, w, true
}

// ShardIndex is shards.index.json.
type ShardIndex struct {
	Format  string        `json:"format"`
	Version int           `json:"version"`
	World   int           `json:"world_size"`
	Tensors []ShardTensor `json:"tensors"`
}

// ShardTensor is one parameter and the pieces that hold it.
type ShardTensor struct {
	Name   string       `json:"name"`
	Shape  []int        `json:"shape"`
	Pieces []ShardPiece `json:"pieces"`
}

// ShardPiece is elements [Lo, Hi) of a parameter (row-major), held by rank
// Rank's shard file.
type ShardPiece struct {
	Rank int   `json:"rank"`
	Lo   int64 `json:"lo"`
	Hi   int64 `json:"hi"`
}

// Marshal returns the index's JSON.
func (x *ShardIndex) Marshal() ([]byte, error) {
	x.Format, x.Version = shardIndexFormat, FormatVersion
	b, err := json.MarshalIndent(x, "", " ")
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %s: %w", ShardIndexFile, err)
	}
	return append(b, '\n'), x.check()
}

// ParseShardIndex parses and checks shards.index.json: each parameter's
// pieces cover it exactly, in order, from ranks of the world.
func ParseShardIndex(b []byte) (ShardIndex, error) {
	var x ShardIndex
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&x); err != nil {
		return x, fmt.Errorf("parse: %w", err)
	}
	if x.Format != shardIndexFormat || x.Version != FormatVersion {
		return x, fmt.Errorf("format: want %q version %d, found %q version %d", shardIndexFormat, FormatVersion, x.Format, x.Version)
	}
	return x, x.check()
}

func (x *ShardIndex) check() error {
	if x.World < 1 {
		return fmt.Errorf("world_size: want ≥ 1, found %d", x.World)
	}
	seen := map[string]bool{}
	for i, t := range x.Tensors {
		if t.Name == "" || seen[t.Name] {
			return fmt.Errorf("tensors[%d].name: %q empty or listed twice", i, t.Name)
		}
		seen[t.Name] = true
		n := int64(1)
		for _, d := range t.Shape {
			if d < 0 || (d > 0 && n > math.MaxInt64/int64(d)) {
				return fmt.Errorf("tensors[%d] (%s).shape: %v", i, t.Name, t.Shape)
			}
			n *= int64(d)
		}
		at := int64(0)
		for j, p := range t.Pieces {
			if p.Lo != at || p.Hi <= p.Lo || p.Rank < 0 || p.Rank >= x.World {
				return fmt.Errorf("tensors[%d] (%s).pieces[%d]: rank %d elements [%d, %d): want a piece from element %d of a rank below %d", i, t.Name, j, p.Rank, p.Lo, p.Hi, at, x.World)
			}
			at = p.Hi
		}
		if at != n {
			return fmt.Errorf("tensors[%d] (%s): the pieces cover %d of its %d elements", i, t.Name, at, n)
		}
	}
	return nil
}

// ShardPart is the part of one parameter a rank holds: elements [Lo, Hi),
// with the values of each kind (Hi−Lo each).
type ShardPart struct {
	Name   string
	Lo, Hi int64
	Values [NumKinds][]float32
}

// WriteShard writes rank's shard file (of world) into dir, a Pending's Dir,
// and returns its manifest entry.
func WriteShard(dir string, rank, world int, step int64, parts []ShardPart) (FileEntry, error) {
	name := ShardFile(rank, world)
	path := filepath.Join(dir, name)
	meta := map[string]string{
		"tracegrpo_format": shardFileKind, "tracegrpo_version": strconv.Itoa(FormatVersion),
		"step": strconv.FormatInt(step, 10), "rank": strconv.Itoa(rank), "world_size": strconv.Itoa(world),
		"crc32c_block": strconv.Itoa(CRCBlock),
	}
	var tensors []Tensor
	for _, p := range parts {
		for k := range NumKinds {
			v := p.Values[k]
			if v == nil && k != KindWeights {
				continue // a weights-only checkpoint (no_optimizer)
			}
			if int64(len(v)) != p.Hi-p.Lo {
				return FileEntry{}, fmt.Errorf("checkpoint: shard %s: %s%s: %d values for elements [%d, %d)", name, p.Name, KindSuffix[k], len(v), p.Lo, p.Hi)
			}
			tn := p.Name + KindSuffix[k]
			meta["crc32c:"+tn] = blockCRCs(v)
			tensors = append(tensors, Tensor{Spec: safetensors.Spec{Name: tn, DType: safetensors.F32, Shape: []int{len(v)}}, F32: v})
		}
	}
	return writeTensors(path, tensors, meta, false)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// blockCRCs returns the base64 of the CRC-32C of each CRCBlock bytes of
// v's little-endian bytes.
func blockCRCs(v []float32) string {
	const per = CRCBlock / 4
	out := make([]byte, 0, 4*((len(v)+per-1)/per))
	buf := make([]byte, 4*min(per, len(v)))
	for i := 0; i < len(v); i += per {
		n := min(per, len(v)-i)
		for k, x := range v[i : i+n] {
			binary.LittleEndian.PutUint32(buf[4*k:], math.Float32bits(x))
		}
		out = binary.LittleEndian.AppendUint32(out, crc32.Checksum(buf[:4*n], castagnoli))
	}
	return base64.StdEncoding.EncodeToString(out)
}

// Tensors reads ranges of a checkpoint's parameters and moments, whatever
// its layout: an unsharded checkpoint's model.safetensors and
// optimizer.safetensors, or a sharded one's shard files through its index
// (every CRC block a read touches is read whole and checked). It is safe
// for concurrent use.
type Tensors struct {
	path    string
	index   *ShardIndex
	byName  map[string]int
	mu      sync.Mutex
	shards  []*shardFile // by rank, opened on first use
	model   *safetensors.File
	optim   *safetensors.File
	closers []io.Closer
	read    atomic.Int64
}

type shardFile struct {
	f    *safetensors.File
	crcs map[string][]uint32
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.ReaderAt
	n *atomic.Int64
}

func (c countingReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.n.Add(int64(n))
	return n, err
}

// OpenTensors opens the tensors of the checkpoint at path (its structure
// checked: DONE, manifest, file sizes). It reads only the small files and
// the tensor files' headers.
func OpenTensors(path string) (*Tensors, error) {
	man, err := checkStructure(path)
	if err != nil {
		return nil, err
	}
	t := &Tensors{path: path}
	entry := map[string]FileEntry{}
	for _, f := range man.Files {
		entry[f.Name] = f
	}
	if e, ok := entry[ShardIndexFile]; ok {
		p := filepath.Join(path, ShardIndexFile)
		b, err := readSmall(p)
		if err != nil {
			return nil, err
		}
		if err := checkBytes(p, b, e); err != nil {
			return nil, err
		}
		x, err := ParseShardIndex(b)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, p, err)
		}
		t.index = &x
		t.byName = make(map[string]int, len(x.Tensors))
		for i, tt := range x.Tensors {
			t.byName[tt.Name] = i
		}
		t.shards = make([]*shardFile, x.World)
		return t, nil
	}
	if _, ok := entry[OptimizerZstdFile]; ok {
		return nil, fmt.Errorf("checkpoint: %s: %s is compressed and cannot be read by ranges; resume it unsharded on one process", path, OptimizerZstdFile)
	}
	for _, x := range []struct {
		name string
		dst  **safetensors.File
	}{{ModelFile, &t.model}, {OptimizerFile, &t.optim}} {
		f, err := t.open(x.name, entry[x.name].Size)
		if err != nil {
			t.Close()
			return nil, err
		}
		*x.dst = f
	}
	return t, nil
}

func (t *Tensors) open(name string, size int64) (*safetensors.File, error) {
	p := filepath.Join(t.path, name)
	fh, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	f, err := safetensors.NewFile(countingReader{fh, &t.read}, size, p)
	if err != nil {
		fh.Close()
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	t.closers = append(t.closers, fh)
	return f, nil
}

// Sharded reports whether the checkpoint is sharded, and over how many
// ranks.
func (t *Tensors) Sharded() (bool, int) {
	if t.index == nil {
		return false, 1
	}
	return true, t.index.World
}

// Shape returns the stored shape of the named parameter.
func (t *Tensors) Shape(name string) ([]int, bool) {
	if t.index != nil {
		i, ok := t.byName[name]
		if !ok {
			return nil, false
		}
		return t.index.Tensors[i].Shape, true
	}
	ti, ok := t.model.Tensor(name)
	if !ok || ti.DType != safetensors.F32 {
		return nil, false
	}
	return ti.Shape, true
}

// BytesRead is the number of bytes read from tensor files so far (headers
// included).
func (t *Tensors) BytesRead() int64 { return t.read.Load() }

// Close closes the files.
func (t *Tensors) Close() {
	for _, c := range t.closers {
		c.Close()
	}
	t.closers = nil
}

// Read reads elements [lo, lo+len(dst)) of the named parameter's tensor of
// kind into dst.
func (t *Tensors) Read(name string, kind int, lo int64, dst []float32) error {
	if kind < 0 || kind >= NumKinds {
		return fmt.Errorf("checkpoint: read %s: kind %d", name, kind)
	}
	if t.index == nil {
		f, file := t.model, ModelFile
		if kind != KindWeights {
			f, file = t.optim, OptimizerFile
		}
		tn := name + KindSuffix[kind]
		if ti, ok := f.Tensor(tn); !ok || ti.DType != safetensors.F32 {
			return fmt.Errorf("checkpoint: %s: %s has no F32 tensor %s", t.path, file, tn)
		}
		if err := f.ReadF32At(tn, int(lo), dst); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
		return nil
	}
	i, ok := t.byName[name]
	if !ok {
		return fmt.Errorf("checkpoint: %s: %s has no tensor %s", t.path, ShardIndexFile, name)
	}
	tt := &t.index.Tensors[i]
	hi := lo + int64(len(dst))
	// The first piece ending after lo.
	j := sort.Search(len(tt.Pieces), func(k int) bool { return tt.Pieces[k].Hi > lo })
	for at := lo; at < hi; j++ {
		if j >= len(tt.Pieces) || lo < 0 {
			return fmt.Errorf("checkpoint: %s: %s elements [%d, %d) are outside its pieces", t.path, name, lo, hi)
		}
		p := tt.Pieces[j]
		end := min(hi, p.Hi)
		if err := t.readPiece(p, name+KindSuffix[kind], at-p.Lo, dst[at-lo:end-lo]); err != nil {
			return err
		}
		at = end
	}
	return nil
}

// readPiece reads elements [off, off+len(dst)) of tensor tn of a piece's
// shard file, checking the CRC of every block it reads.
func (t *Tensors) readPiece(p ShardPiece, tn string, off int64, dst []float32) error {
	sf, err := t.shard(p.Rank)
	if err != nil {
		return err
	}
	ti, ok := sf.f.Tensor(tn)
	if !ok || ti.DType != safetensors.F32 || int64(ti.NumElements()) != p.Hi-p.Lo {
		return fmt.Errorf("%w: %s: tensor %s: want F32 of %d elements (the index's piece [%d, %d))", ErrCorrupt, sf.f.Name(), tn, p.Hi-p.Lo, p.Lo, p.Hi)
	}
	crcs, err := sf.crcsOf(tn, ti.End-ti.Begin)
	if err != nil {
		return err
	}
	size := ti.End - ti.Begin
	b0, b1 := 4*off/CRCBlock, (4*(off+int64(len(dst)))+CRCBlock-1)/CRCBlock
	start, end := b0*CRCBlock, min(b1*CRCBlock, size)
	buf := make([]byte, end-start)
	if err := sf.f.ReadRawAt(tn, start, buf); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	for b := b0; b < b1; b++ {
		blk := buf[(b-b0)*CRCBlock : min((b-b0+1)*CRCBlock, end-start)]
		if got := crc32.Checksum(blk, castagnoli); got != crcs[b] {
			return fmt.Errorf("%w: %s: tensor %s: bytes [%d, %d) have CRC-32C %08x, the file's metadata says %08x (the file is damaged; train verify names every damaged file)",
				ErrCorrupt, sf.f.Name(), tn, b*CRCBlock, b*CRCBlock+int64(len(blk)), got, crcs[b])
		}
	}
	skip := 4*off - start
	for k := range dst {
		dst[k] = math.Float32frombits(binary.LittleEndian.Uint32(buf[skip+4*int64(k):]))
	}
	return nil
}

func (t *Tensors) shard(rank int) (*shardFile, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if sf := t.shards[rank]; sf != nil {
		return sf, nil
	}
	name := ShardFile(rank, t.index.World)
	st, err := os.Stat(filepath.Join(t.path, name))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	f, err := t.open(name, st.Size())
	if err != nil {
		return nil, err
	}
	md := f.Metadata()
	if md["tracegrpo_format"] != shardFileKind || md["tracegrpo_version"] != strconv.Itoa(FormatVersion) ||
		md["rank"] != strconv.Itoa(rank) || md["world_size"] != strconv.Itoa(t.index.World) || md["crc32c_block"] != strconv.Itoa(CRCBlock) {
		return nil, fmt.Errorf("%w: %s: __metadata__: want tracegrpo_format %q version %d, rank %d of %d, crc32c_block %d; found %q %q, rank %q of %q, %q",
			ErrCorrupt, f.Name(), shardFileKind, FormatVersion, rank, t.index.World, CRCBlock,
			md["tracegrpo_format"], md["tracegrpo_version"], md["rank"], md["world_size"], md["crc32c_block"])
	}
	sf := &shardFile{f: f, crcs: map[string][]uint32{}}
	t.shards[rank] = sf
	return sf, nil
}

// crcsOf decodes tensor tn's block CRCs (size bytes of data).
func (sf *shardFile) crcsOf(tn string, size int64) ([]uint32, error) {
	if c, ok := sf.crcs[tn]; ok {
		return c, nil
	}
	raw, err := base64.StdEncoding.DecodeString(sf.f.Metadata()["crc32c:"+tn])
	want := (size + CRCBlock - 1) / CRCBlock
	if err != nil || int64(len(raw)) != 4*want {
		return nil, fmt.Errorf("%w: %s: __metadata__ crc32c:%s: want %d CRCs in base64", ErrCorrupt, sf.f.Name(), tn, want)
	}
	c := make([]uint32, want)
	for i := range c {
		c[i] = binary.LittleEndian.Uint32(raw[4*i:])
	}
	sf.crcs[tn] = c
	return c, nil
}

// Structure checks the checkpoint at path without reading its tensors:
// DONE matches manifest.json, which parses and names this step, and the
// files on disk are exactly the manifest's, with its sizes.
func Structure(path string) (Manifest, error) { return checkStructure(path) }

// Sharded reports whether a checkpoint with this manifest is sharded.
func (m Manifest) Sharded() bool {
	for _, f := range m.Files {
		if f.Name == ShardIndexFile {
			return true
		}
	}
	return false
}

// WriteTrainerState writes trainer_state.json into Dir and records it.
func (p *Pending) WriteTrainerState(ts TrainerState) error {
	ts.FormatVersion = FormatVersion
	if ts.Step != p.step {
		return fmt.Errorf("checkpoint: save %s: trainer state of step %d", p.name, ts.Step)
	}
	b, err := encodeTrainerState(&ts)
	if err != nil {
		return err
	}
	return p.WriteFile(TrainerStateFile, b)
}

// LoadMeta verifies and reads the checkpoint's small files, without its
// tensors: trainer_state.json and config.json (against
// opt.ExpectConfig), each checked against the manifest's sha256.
func LoadMeta(path string, opt LoadOptions) (*State, error) {
	man, err := checkStructure(path)
	if err != nil {
		return nil, err
	}
	return loadMeta(path, man, opt)
}
