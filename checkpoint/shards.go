package checkpoint

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tracegrpo/tracegrpo/internal/quote"
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
// tracegrpo_version, step, rank, world_size, crc32c_block (CRCBlock), its
// identity (ShardID: run, the run's id; weights_sha256, the sha256 of the
// checkpoint's model.safetensors, which every shard of one save shares),
// for every part of a parameter P it holds "range:P", its element range
// "LO-HI", and for every tensor T, "crc32c:T": the CRC-32C (Castagnoli) of
// each CRCBlock-byte block of T's data, little-endian uint32s in base64.
// The index carries the same run, step and weights_sha256.
//
// Opening the tensors (OpenTensors, and so a resume, an export and train
// verify) checks the pieces against each other before any is read: every
// shard file's rank, world size, step, run and weights digest against the
// index's, the index's digest against the manifest's sha256 of the
// model.safetensors beside them, and every piece of the index against the
// range its shard file says it holds. A checkpoint assembled from several
// (a shard copied from another run or step, shard files swapped or
// renamed, the index's entries swapped), even with its manifest and DONE
// regenerated, is refused with ErrInconsistent naming the file. A resume
// at any world size, sharded or not, then reads through Tensors only the
// byte ranges it owns, rounded out to whole CRC blocks, and checks every
// block it reads; train verify checks every file's sha256 as for any
// checkpoint. A checkpoint written before shards carried their identity
// (neither the index nor any shard has one) is read as before.

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

// ErrInconsistent is wrapped by the errors for a checkpoint whose files
// each match the manifest but not each other: an index that cannot
// describe its tensors, or shard files that belong to another save,
// another rank or another piece.
var ErrInconsistent = errors.New("checkpoint: its files do not belong together")

// ShardID is what every shard file and the index of one sharded checkpoint
// share: the run that saved it (its id, kept across resumes), the step,
// the world size, and the sha256 of the checkpoint's model.safetensors
// (the HF weights of the whole model, written before the shards).
type ShardID struct {
	Run     string
	Step    int64
	World   int
	Weights string
}

// ShardIndex is shards.index.json.
type ShardIndex struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
	World   int    `json:"world_size"`
	// Run, Step and Weights are the ShardID of the save (absent in
	// checkpoints written before shards carried their identity).
	Run     string        `json:"run,omitempty"`
	Step    int64         `json:"step,omitempty"`
	Weights string        `json:"weights_sha256,omitempty"`
	Tensors []ShardTensor `json:"tensors"`
}

// ID is the index's ShardID.
func (x *ShardIndex) ID() ShardID {
	return ShardID{Run: x.Run, Step: x.Step, World: x.World, Weights: x.Weights}
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
	if x.Run != "" || x.Step != 0 || x.Weights != "" {
		if x.Run == "" || x.Step < 0 || len(x.Weights) != 64 || strings.Trim(x.Weights, "0123456789abcdef") != "" {
			return fmt.Errorf("run, step, weights_sha256: want a run id, a step ≥ 0 and 64 lowercase hex digits, found %q, %d, %q", quoteCut(x.Run), x.Step, quoteCut(x.Weights))
		}
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

// WriteShard writes rank's shard file of the save id into dir, a
// Pending's Dir, and returns its manifest entry.
func WriteShard(dir string, rank int, id ShardID, parts []ShardPart) (FileEntry, error) {
	name := ShardFile(rank, id.World)
	path := filepath.Join(dir, name)
	if id.Run == "" || len(id.Weights) != 64 {
		return FileEntry{}, fmt.Errorf("checkpoint: shard %s: identity %+v: want a run id and the sha256 of model.safetensors", name, id)
	}
	meta := map[string]string{
		"tracegrpo_format": shardFileKind, "tracegrpo_version": strconv.Itoa(FormatVersion),
		"step": strconv.FormatInt(id.Step, 10), "rank": strconv.Itoa(rank), "world_size": strconv.Itoa(id.World),
		"crc32c_block": strconv.Itoa(CRCBlock), "run": id.Run, "weights_sha256": id.Weights,
	}
	var tensors []Tensor
	for _, p := range parts {
		meta["range:"+p.Name] = fmt.Sprintf("%d-%d", p.Lo, p.Hi)
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
	step    int64
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
	t := &Tensors{path: path, step: man.Step}
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
			return nil, fmt.Errorf("%w: %s: %v (it matches %s; it was written wrong, or edited: the checkpoint cannot be read)", ErrInconsistent, p, err, ManifestFile)
		}
		t.index = &x
		t.byName = make(map[string]int, len(x.Tensors))
		for i, tt := range x.Tensors {
			t.byName[tt.Name] = i
		}
		t.shards = make([]*shardFile, x.World)
		if err := t.checkShards(entry[ModelFile]); err != nil {
			t.Close()
			return nil, err
		}
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
	if md["tracegrpo_format"] != shardFileKind || md["tracegrpo_version"] != strconv.Itoa(FormatVersion) || md["crc32c_block"] != strconv.Itoa(CRCBlock) {
		return nil, fmt.Errorf("%w: %s: __metadata__: want tracegrpo_format %q version %d, crc32c_block %d; found %q %q, %q",
			ErrCorrupt, f.Name(), shardFileKind, FormatVersion, CRCBlock, md["tracegrpo_format"], md["tracegrpo_version"], md["crc32c_block"])
	}
	if md["rank"] != strconv.Itoa(rank) || md["world_size"] != strconv.Itoa(t.index.World) {
		return nil, fmt.Errorf("%w: %s holds the shard of rank %s of %s (its __metadata__), not of rank %d of %d: shard files were swapped, renamed or copied from another checkpoint",
			ErrInconsistent, f.Name(), quoteCut(md["rank"]), quoteCut(md["world_size"]), rank, t.index.World)
	}
	want := t.index.ID()
	if want.Weights == "" { // written before shards carried their identity
		want = ShardID{Step: t.step, World: t.index.World}
	}
	got := ShardID{Run: md["run"], Step: -1, World: t.index.World, Weights: md["weights_sha256"]}
	if s, err := strconv.ParseInt(md["step"], 10, 64); err == nil {
		got.Step = s
	}
	if got != want && t.index.Weights == "" {
		return nil, fmt.Errorf("%w: %s carries the identity of run %s, step %s, weights sha256 %s, but %s has none: the index was rewritten (by a tool that drops its run, step and weights_sha256) or comes from an older save",
			ErrInconsistent, f.Name(), quoteCut(md["run"]), quoteCut(md["step"]), quoteCut(md["weights_sha256"]), ShardIndexFile)
	}
	if got != want {
		return nil, fmt.Errorf("%w: %s belongs to another save: run %s, step %s, weights sha256 %s (its __metadata__), where %s says run %s, step %d, weights sha256 %s: it was copied from another checkpoint",
			ErrInconsistent, f.Name(), quoteCut(md["run"]), quoteCut(md["step"]), quoteCut(md["weights_sha256"]), ShardIndexFile, orAbsent(want.Run), want.Step, orAbsent(want.Weights))
	}
	sf := &shardFile{f: f, crcs: map[string][]uint32{}}
	t.shards[rank] = sf
	return sf, nil
}

// checkShards opens every shard file and checks the pieces against each
// other: the index's identity against the manifest (its step and its
// model.safetensors, model), every shard's against the index's (shard),
// and every piece of the index against the range its shard holds.
func (t *Tensors) checkShards(model FileEntry) error {
	x := t.index
	idxPath := filepath.Join(t.path, ShardIndexFile)
	legacy := x.Run == "" && x.Step == 0 && x.Weights == ""
	if !legacy && (x.Step != t.step || x.Weights != model.SHA256) {
		return fmt.Errorf("%w: %s belongs to step %d and a model.safetensors of sha256 %s, but this checkpoint is step %d and its %s has sha256 %s (%s): the index or the HF weights come from another save",
			ErrInconsistent, idxPath, x.Step, x.Weights, t.step, ModelFile, model.SHA256, ManifestFile)
	}
	held := make([]int, x.World) // pieces the index gives each rank
	for _, tt := range x.Tensors {
		for _, p := range tt.Pieces {
			held[p.Rank]++
		}
	}
	for r := range x.World {
		sf, err := t.shard(r)
		if err != nil {
			return err
		}
		if legacy {
			continue
		}
		ranges := 0
		for k := range sf.f.Metadata() {
			if strings.HasPrefix(k, "range:") {
				ranges++
			}
		}
		if ranges != held[r] {
			return fmt.Errorf("%w: %s holds %d parameter pieces, %s gives rank %d %d", ErrInconsistent, sf.f.Name(), ranges, idxPath, r, held[r])
		}
	}
	if legacy {
		return nil
	}
	for _, tt := range x.Tensors {
		for _, p := range tt.Pieces {
			sf := t.shards[p.Rank]
			want := fmt.Sprintf("%d-%d", p.Lo, p.Hi)
			if got, ok := sf.f.Metadata()["range:"+tt.Name]; !ok || got != want {
				return fmt.Errorf("%w: %s gives rank %d elements [%d, %d) of %s, but %s holds %s of it: the index's entries were swapped or edited",
					ErrInconsistent, idxPath, p.Rank, p.Lo, p.Hi, tt.Name, sf.f.Name(), rangeText(got, ok))
			}
		}
	}
	return nil
}

func rangeText(r string, ok bool) string {
	if !ok {
		return "no piece"
	}
	lo, hi, _ := strings.Cut(quoteCut(r), "-")
	return "elements [" + lo + ", " + hi + ")"
}

func orAbsent(s string) string {
	if s == "" {
		return "(absent)"
	}
	return s
}

// quoteCut returns s for a message: as it is, or quoted and cut after
// quote.Max bytes with its length when longer (a file's metadata can hold
// anything).
func quoteCut(s string) string {
	if len(s) <= quote.Max {
		return s
	}
	return quote.Cut(s)
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
