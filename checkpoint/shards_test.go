package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// shardFixture is a sharded checkpoint of one step written by world
// writers: tensors of the given sizes, each split into world contiguous
// pieces (some ranks owning none), with values that name the tensor, the
// kind and the element.
type shardFixture struct {
	path  string
	sizes map[string]int
	index ShardIndex
}

func value(t, k, i int) float32 { return float32(t*1_000_000+k*100_000) + float32(i%9973) }

func writeShardFixture(t *testing.T, world int, sizes []int) shardFixture {
	t.Helper()
	return writeShardFixtureOf(t, t.TempDir(), fixtureRun{id: "run-a", hf: "hf weights stand-in"}, world, sizes)
}

// fixtureRun is what tells two sharded fixtures apart: their run id, their
// HF weights' bytes, and a shift added to every value.
type fixtureRun struct {
	id, hf string
	shift  float32
}

// writeShardFixtureOf writes a sharded fixture of step 3 into dir as run
// saves it: the HF weights first, then each rank's shard with its
// identity, the index, the trainer state.
func writeShardFixtureOf(t *testing.T, dir string, run fixtureRun, world int, sizes []int) shardFixture {
	t.Helper()
	p, err := Begin(dir, 3, SaveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct{ name, data string }{{ModelFile, run.hf}, {ConfigFile, "{}"}} {
		if err := p.WriteFile(f.name, []byte(f.data)); err != nil {
			t.Fatal(err)
		}
	}
	hf, err := HashFile(filepath.Join(p.Dir(), ModelFile))
	if err != nil {
		t.Fatal(err)
	}
	id := ShardID{Run: run.id, Step: 3, World: world, Weights: hf.SHA256}
	fx := shardFixture{sizes: map[string]int{}, index: ShardIndex{World: world, Run: id.Run, Step: id.Step, Weights: id.Weights}}
	parts := make([][]ShardPart, world)
	for ti, n := range sizes {
		name := fmt.Sprintf("t%d.weight", ti)
		fx.sizes[name] = n
		st := ShardTensor{Name: name, Shape: []int{n}}
		per := (n + world - 1) / world
		for r := range world {
			lo, hi := min(r*per, n), min((r+1)*per, n)
			if hi <= lo {
				continue
			}
			st.Pieces = append(st.Pieces, ShardPiece{Rank: r, Lo: int64(lo), Hi: int64(hi)})
			sp := ShardPart{Name: name, Lo: int64(lo), Hi: int64(hi)}
			for k := range NumKinds {
				v := make([]float32, hi-lo)
				for i := range v {
					v[i] = value(ti, k, lo+i) + run.shift
				}
				sp.Values[k] = v
			}
			parts[r] = append(parts[r], sp)
		}
		fx.index.Tensors = append(fx.index.Tensors, st)
	}
	for r := range world {
		e, err := WriteShard(p.Dir(), r, id, parts[r])
		if err != nil {
			t.Fatal(err)
		}
		p.Add(e)
	}
	b, err := fx.index.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WriteFile(ShardIndexFile, b); err != nil {
		t.Fatal(err)
	}
	if err := p.WriteTrainerState(TrainerState{Step: 3}); err != nil {
		t.Fatal(err)
	}
	if err := p.Seal(); err != nil {
		t.Fatal(err)
	}
	if fx.path, err = p.Publish(); err != nil {
		t.Fatal(err)
	}
	return fx
}

// TestShardedReadRanges: a checkpoint written by 2 ranks reads back, as 3
// or 1 readers would take it, every element of every kind exactly; each
// read costs the bytes of the CRC blocks that cover it (the owned bytes,
// rounded out to 256 KiB blocks per piece) and the shard files' headers,
// nothing else; the checkpoint verifies like any other.
func TestShardedReadRanges(t *testing.T) {
	sizes := []int{300_000, 70_001, 5, 131_072}
	fx := writeShardFixture(t, 2, sizes)
	if _, err := Verify(fx.path); err != nil {
		t.Fatal(err)
	}
	for _, readers := range []int{3, 1} {
		for r := range readers {
			tens, err := OpenTensors(fx.path)
			if err != nil {
				t.Fatal(err)
			}
			if sh, w := tens.Sharded(); !sh || w != 2 {
				t.Fatalf("Sharded() = %v, %d", sh, w)
			}
			var want int64
			for ti, n := range sizes {
				name := fmt.Sprintf("t%d.weight", ti)
				per := (n + readers - 1) / readers
				lo, hi := min(r*per, n), min((r+1)*per, n)
				if hi <= lo {
					continue
				}
				for k := range NumKinds {
					got := make([]float32, hi-lo)
					if err := tens.Read(name, k, int64(lo), got); err != nil {
						t.Fatal(err)
					}
					for i, x := range got {
						if x != value(ti, k, lo+i) {
							t.Fatalf("%d readers, reader %d: %s kind %d element %d = %g, wrote %g", readers, r, name, k, lo+i, x, value(ti, k, lo+i))
						}
					}
					// The CRC blocks covering [lo, hi) in each piece.
					for _, p := range fx.index.Tensors[ti].Pieces {
						a, b := max(int64(lo), p.Lo), min(int64(hi), p.Hi)
						if a >= b {
							continue
						}
						size := 4 * (p.Hi - p.Lo)
						b0, b1 := 4*(a-p.Lo)/CRCBlock, (4*(b-p.Lo)+CRCBlock-1)/CRCBlock
						want += min(b1*CRCBlock, size) - b0*CRCBlock
					}
				}
			}
			for rank := range 2 { // every shard's header, read to check the pieces against each other
				want += shardHeaderBytes(t, fx.path, rank, 2)
			}
			if got := tens.BytesRead(); got != want {
				t.Errorf("%d readers, reader %d read %d bytes, want %d (its blocks and headers)", readers, r, got, want)
			}
			tens.Close()
		}
	}
}

// shardHeaderBytes is the length prefix plus header of a shard file.
func shardHeaderBytes(t *testing.T, path string, rank, world int) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(path, ShardFile(rank, world)))
	if err != nil {
		t.Fatal(err)
	}
	n := int64(b[0]) | int64(b[1])<<8 | int64(b[2])<<16 | int64(b[3])<<24
	return 8 + n
}

// TestShardedReadDetectsDamage: one flipped byte in a shard's tensor data
// fails the read of any range whose blocks cover it, naming the file, the
// tensor and the bytes, while ranges in other blocks read fine (train
// verify, through the manifest's sha256, names the file too).
func TestShardedReadDetectsDamage(t *testing.T) {
	fx := writeShardFixture(t, 2, []int{200_000})
	file := filepath.Join(fx.path, ShardFile(1, 2))
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	// Element 150,000 of the tensor is element 50,000 of rank 1's piece
	// (its first CRC block): rank 1's file holds t0.weight first (name
	// order), right after the header.
	hdr := shardHeaderBytes(t, fx.path, 1, 2)
	off := hdr + 4*50_000
	b[off] ^= 0x40
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	tens, err := OpenTensors(fx.path)
	if err != nil {
		t.Fatal(err)
	}
	defer tens.Close()
	got := make([]float32, 10)
	err = tens.Read("t0.weight", KindWeights, 149_995, got)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), ShardFile(1, 2)) || !strings.Contains(err.Error(), "t0.weight") {
		t.Errorf("a damaged block read: %v; want ErrCorrupt naming the file and tensor", err)
	}
	if err := tens.Read("t0.weight", KindWeights, 190_000, got); err != nil {
		t.Errorf("a range in another block: %v", err)
	}
	if err := tens.Read("t0.weight", KindWeights, 0, got); err != nil {
		t.Errorf("a range of rank 0's file: %v", err)
	}
	if _, err := Verify(fx.path); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Verify of the damaged checkpoint: %v", err)
	}
}

// TestShardIndexRefusals: an index whose pieces do not cover a tensor
// exactly, in order, from ranks of the world, is refused naming the
// tensor and the piece; a manifest missing a rank's shard file is refused.
func TestShardIndexRefusals(t *testing.T) {
	good := ShardIndex{Format: shardIndexFormat, Version: FormatVersion, World: 2, Tensors: []ShardTensor{
		{Name: "a", Shape: []int{2, 5}, Pieces: []ShardPiece{{0, 0, 6}, {1, 6, 10}}},
	}}
	enc := func(x ShardIndex) []byte { b, _ := json.Marshal(x); return b }
	if _, err := ParseShardIndex(enc(good)); err != nil {
		t.Fatalf("good index: %v", err)
	}
	for _, c := range []struct {
		name string
		edit func(*ShardIndex)
		want string
	}{
		{"gap", func(x *ShardIndex) { x.Tensors[0].Pieces[1].Lo = 7 }, "pieces[1]"},
		{"short", func(x *ShardIndex) { x.Tensors[0].Pieces[1].Hi = 9 }, "cover 9 of its 10"},
		{"rank", func(x *ShardIndex) { x.Tensors[0].Pieces[1].Rank = 2 }, "rank 2"},
		{"empty piece", func(x *ShardIndex) { x.Tensors[0].Pieces[0].Hi = 0 }, "pieces[0]"},
		{"world", func(x *ShardIndex) { x.World = 0 }, "world_size"},
		{"duplicate", func(x *ShardIndex) { x.Tensors = append(x.Tensors, x.Tensors[0]) }, "listed twice"},
		{"version", func(x *ShardIndex) { x.Version = 9 }, "version"},
	} {
		t.Run(c.name, func(t *testing.T) {
			x := good
			x.Tensors = append([]ShardTensor(nil), good.Tensors...)
			x.Tensors[0].Pieces = append([]ShardPiece(nil), good.Tensors[0].Pieces...)
			c.edit(&x)
			if _, err := ParseShardIndex(enc(x)); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %v, want one naming %q", err, c.want)
			}
		})
	}
	man := Manifest{Format: formatName, Version: FormatVersion, Step: 1}
	for _, n := range []string{ModelFile, ConfigFile, TrainerStateFile, ShardIndexFile, ShardFile(0, 3), ShardFile(2, 3)} {
		man.Files = append(man.Files, FileEntry{Name: n, SHA256: strings.Repeat("0", 64)})
	}
	b, _ := json.Marshal(man)
	if _, err := ParseManifest(b); err == nil || !strings.Contains(err.Error(), "one shard file per rank") {
		t.Errorf("a manifest missing rank 1's shard: %v", err)
	}
}

// FuzzParseShardIndex: ParseShardIndex never panics, and an index it
// accepts marshals back to one that parses the same.
func FuzzParseShardIndex(f *testing.F) {
	x := ShardIndex{World: 3, Tensors: []ShardTensor{{Name: "w", Shape: []int{4, 3}, Pieces: []ShardPiece{{0, 0, 4}, {1, 4, 8}, {2, 8, 12}}},
		{Name: "b", Shape: []int{2}, Pieces: []ShardPiece{{1, 0, 2}}}}}
	seed, _ := x.Marshal()
	f.Add(seed)
	f.Add([]byte(`{"format":"tracegrpo-shards","version":1,"world_size":1,"tensors":[]}`))
	f.Add([]byte(`{"format":"tracegrpo-shards","version":1,"world_size":2,"tensors":[{"name":"x","shape":[9223372036854775807,2],"pieces":[]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		x, err := ParseShardIndex(b)
		if err != nil {
			return
		}
		again, err := x.Marshal()
		if err != nil {
			t.Fatalf("an accepted index does not marshal: %v", err)
		}
		y, err := ParseShardIndex(again)
		if err != nil {
			t.Fatalf("an accepted index, marshalled, is refused: %v", err)
		}
		if d := cmp.Diff(x, y); d != "" {
			t.Fatalf("round trip (-first +second):\n%s", d)
		}
	})
}

// TestShardedCheckpointIsAnotherLayout: Load refuses a sharded checkpoint
// with a pointer to OpenTensors, and OpenTensors reads an unsharded one by
// ranges too.
func TestShardedCheckpointIsAnotherLayout(t *testing.T) {
	fx := writeShardFixture(t, 2, []int{10})
	if _, err := Load(fx.path, LoadOptions{}); err == nil || !strings.Contains(err.Error(), "OpenTensors") {
		t.Errorf("Load of a sharded checkpoint: %v", err)
	}
	dir := t.TempDir()
	st := testState(2, 1000)
	path, err := Save(dir, st, SaveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tens, err := OpenTensors(path)
	if err != nil {
		t.Fatal(err)
	}
	defer tens.Close()
	read := 0
	for _, x := range st.Model {
		if len(x.F32) < 10 {
			continue
		}
		got := make([]float32, 7)
		if err := tens.Read(x.Name, KindWeights, 3, got); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(x.F32[3:10], got); d != "" {
			t.Errorf("%s [3, 10) (-saved +read):\n%s", x.Name, d)
		}
		read++
	}
	for _, x := range st.Optimizer {
		name, ok := strings.CutSuffix(x.Name, KindSuffix[KindExpAvgSq])
		if !ok || len(x.F32) < 2 {
			continue
		}
		got := make([]float32, 2)
		if err := tens.Read(name, KindExpAvgSq, 0, got); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(x.F32[:2], got); d != "" {
			t.Errorf("%s [0, 2) (-saved +read):\n%s", x.Name, d)
		}
		read++
	}
	if read < 2 {
		t.Fatalf("only %d tensors read", read)
	}
}

// reseal rewrites a checkpoint's manifest.json and DONE from the files in
// it, as a tool or a careless copy would after changing them: every file
// then matches the manifest again.
func reseal(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(path, ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	man, err := ParseManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range man.Files {
		if man.Files[i], err = HashFile(filepath.Join(path, f.Name)); err != nil {
			t.Fatal(err)
		}
	}
	mb, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	mb = append(mb, '\n')
	must(t, os.WriteFile(filepath.Join(path, ManifestFile), mb, 0o644))
	must(t, os.WriteFile(filepath.Join(path, DoneFile), doneContent(mb), 0o644))
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	must(t, os.WriteFile(to, b, 0o644))
}

// TestShardedChimerasRefused (issue 34; issue 33, item 5): a sharded
// checkpoint assembled from pieces that do not belong together, with its
// manifest and DONE regenerated so that every file matches them, is
// refused by OpenTensors (a resume, an export) and by Verify, with
// ErrInconsistent naming the file that does not belong: rank 1's shard
// copied from another run, the two shard files swapped (each still
// self-consistent), the index's entries swapped between the ranks or its
// split moved, the index or the HF weights from another run. Untouched and
// resealed, the checkpoint reads back every value it was written with.
func TestShardedChimerasRefused(t *testing.T) {
	sizes := []int{300_000, 70_001, 5}
	other := writeShardFixtureOf(t, t.TempDir(), fixtureRun{id: "run-b", hf: "other run's weights", shift: 0.5}, 2, sizes)
	s0, s1 := ShardFile(0, 2), ShardFile(1, 2)
	editIndex := func(t *testing.T, path string, edit func(*ShardIndex)) {
		b, err := os.ReadFile(filepath.Join(path, ShardIndexFile))
		if err != nil {
			t.Fatal(err)
		}
		x, err := ParseShardIndex(b)
		if err != nil {
			t.Fatal(err)
		}
		edit(&x)
		b, err = json.Marshal(x)
		if err != nil {
			t.Fatal(err)
		}
		must(t, os.WriteFile(filepath.Join(path, ShardIndexFile), b, 0o644))
	}
	for _, c := range []struct {
		name  string
		edit  func(t *testing.T, path string)
		names []string // what the error must name
	}{
		{"untouched", func(*testing.T, string) {}, nil},
		{"rank 1's shard from another run", func(t *testing.T, p string) {
			copyFile(t, filepath.Join(other.path, s1), filepath.Join(p, s1))
		}, []string{s1, "run-b", "another save"}},
		{"shard files swapped", func(t *testing.T, p string) {
			must(t, os.Rename(filepath.Join(p, s0), filepath.Join(p, "tmp")))
			must(t, os.Rename(filepath.Join(p, s1), filepath.Join(p, s0)))
			must(t, os.Rename(filepath.Join(p, "tmp"), filepath.Join(p, s1)))
		}, []string{s0, "rank 1 of 2", "not of rank 0"}},
		{"index entries swapped between the ranks", func(t *testing.T, p string) {
			editIndex(t, p, func(x *ShardIndex) {
				for i := range x.Tensors {
					for j := range x.Tensors[i].Pieces {
						x.Tensors[i].Pieces[j].Rank = 1 - x.Tensors[i].Pieces[j].Rank
					}
				}
			})
		}, []string{ShardIndexFile, "gives rank 1 elements [0, 150000) of t0.weight", s1, "holds elements [150000, 300000)"}},
		{"index split moved", func(t *testing.T, p string) {
			editIndex(t, p, func(x *ShardIndex) { x.Tensors[1].Pieces[0].Hi++; x.Tensors[1].Pieces[1].Lo++ })
		}, []string{ShardIndexFile, "t1.weight", s0}},
		{"index from another run", func(t *testing.T, p string) {
			copyFile(t, filepath.Join(other.path, ShardIndexFile), filepath.Join(p, ShardIndexFile))
		}, []string{ShardIndexFile, ModelFile, "another save"}},
		{"HF weights from another run", func(t *testing.T, p string) {
			copyFile(t, filepath.Join(other.path, ModelFile), filepath.Join(p, ModelFile))
		}, []string{ShardIndexFile, ModelFile, "another save"}},
		{"index without its identity", func(t *testing.T, p string) {
			editIndex(t, p, func(x *ShardIndex) { x.Run, x.Step, x.Weights = "", 0, "" })
		}, []string{s0, "has none"}},
		// The manifest is resealed over each edit below, so it matches: the
		// error is that the index cannot be read, not that it was corrupted
		// after the save (issue 34: such an index was reported as "does not
		// match its manifest").
		{"index that does not parse", func(t *testing.T, p string) {
			must(t, os.WriteFile(filepath.Join(p, ShardIndexFile), []byte(`{"format": `), 0o644))
		}, []string{ShardIndexFile, "parse", "it matches " + ManifestFile}},
		{"index with no ranks", func(t *testing.T, p string) {
			editIndex(t, p, func(x *ShardIndex) { x.World = 0 })
		}, []string{ShardIndexFile, "world_size", "it matches " + ManifestFile}},
	} {
		t.Run(c.name, func(t *testing.T) {
			fx := writeShardFixture(t, 2, sizes)
			c.edit(t, fx.path)
			reseal(t, fx.path)
			_, verr := Verify(fx.path)
			tens, err := OpenTensors(fx.path)
			if c.names == nil {
				if err != nil || verr != nil {
					t.Fatalf("resealed untouched: OpenTensors %v, Verify %v", err, verr)
				}
				defer tens.Close()
				for ti, n := range sizes {
					got := make([]float32, n)
					if err := tens.Read(fmt.Sprintf("t%d.weight", ti), KindExpAvg, 0, got); err != nil {
						t.Fatal(err)
					}
					for i, x := range got {
						if x != value(ti, KindExpAvg, i) {
							t.Fatalf("t%d element %d = %g, wrote %g", ti, i, x, value(ti, KindExpAvg, i))
						}
					}
				}
				return
			}
			if err == nil {
				tens.Close()
			}
			for what, e := range map[string]error{"OpenTensors": err, "Verify": verr} {
				if !errors.Is(e, ErrInconsistent) {
					t.Errorf("%s: %v; want ErrInconsistent", what, e)
					continue
				}
				t.Logf("%s: %v", what, e)
				for _, n := range c.names {
					if !strings.Contains(e.Error(), n) {
						t.Errorf("%s: %v\nwant it to name %q", what, e, n)
					}
				}
			}
		})
	}
}
