package safetensors

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/tracegrpo/tracegrpo/internal/inputfile"
)

// The file names Hugging Face uses for a model's weights.
const (
	SingleFileName = "model.safetensors"
	IndexFileName  = "model.safetensors.index.json"
)

// ErrNoWeights is returned by OpenDir for a directory with neither
// model.safetensors nor model.safetensors.index.json.
var ErrNoWeights = errors.New("safetensors: no " + SingleFileName + " or " + IndexFileName)

// Index is a sharded checkpoint's model.safetensors.index.json: which shard
// file holds each tensor.
type Index struct {
	Metadata  map[string]any    `json:"metadata"`
	WeightMap map[string]string `json:"weight_map"`
}

// maxIndexSize bounds the index file read into memory.
const maxIndexSize = 64 << 20

// ReadIndex parses an index file; name is used in error messages. Shard names
// must be plain file names in the index's directory.
func ReadIndex(r io.Reader, name string) (Index, error) {
	var idx Index
	data, err := io.ReadAll(io.LimitReader(r, maxIndexSize+1))
	if err != nil {
		return idx, fmt.Errorf("safetensors: %s: %w", name, err)
	}
	if len(data) > maxIndexSize {
		return idx, fmt.Errorf("safetensors: %s: index is larger than %d bytes: %w", name, maxIndexSize, ErrFormat)
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		return idx, fmt.Errorf("safetensors: %s: %v: %w", name, err, ErrFormat)
	}
	if len(idx.WeightMap) == 0 {
		return idx, fmt.Errorf("safetensors: %s: field weight_map: expected a non-empty object of tensor name to shard file, found none: %w", name, ErrFormat)
	}
	for t, shard := range idx.WeightMap {
		if shard == "" || shard != filepath.Base(shard) || shard == "." || shard == ".." || strings.ContainsAny(shard, `/\`) {
			return idx, fmt.Errorf("safetensors: %s: field weight_map[%q]: expected a file name in the same directory, found %q: %w", name, t, shard, ErrFormat)
		}
	}
	return idx, nil
}

// Set is the tensors of one model: one file or the shards of an index.
type Set struct {
	files  []*File
	where  map[string]*File
	infos  []TensorInfo // sorted by name
	source string
}

// OpenDir opens dir/model.safetensors, or else the shards named by
// dir/model.safetensors.index.json.
func OpenDir(dir string) (*Set, error) {
	single := filepath.Join(dir, SingleFileName)
	if _, err := os.Stat(single); err == nil {
		f, err := Open(single)
		if err != nil {
			return nil, err
		}
		return newSet([]*File{f}, single, nil)
	}
	index := filepath.Join(dir, IndexFileName)
	if _, err := os.Stat(index); err != nil {
		return nil, fmt.Errorf("safetensors: %s: %w", dir, ErrNoWeights)
	}
	return OpenIndex(index)
}

// OpenIndex opens every shard named by the index file at path and checks that
// each tensor is where the index says, and in only one shard.
func OpenIndex(path string) (*Set, error) {
	fh, err := inputfile.Open(path, inputfile.SafetensorsIndex)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	idx, err := ReadIndex(fh, path)
	fh.Close()
	if err != nil {
		return nil, err
	}
	shards := map[string]bool{}
	for _, s := range idx.WeightMap {
		shards[s] = true
	}
	names := make([]string, 0, len(shards))
	for s := range shards {
		names = append(names, s)
	}
	sort.Strings(names)
	var files []*File
	for _, s := range names {
		f, err := Open(filepath.Join(filepath.Dir(path), s))
		if err != nil {
			for _, g := range files {
				g.Close()
			}
			return nil, err
		}
		files = append(files, f)
	}
	return newSet(files, path, idx.WeightMap)
}

func newSet(files []*File, source string, weightMap map[string]string) (*Set, error) {
	s := &Set{files: files, where: map[string]*File{}, source: source}
	fail := func(err error) (*Set, error) {
		s.Close()
		return nil, err
	}
	for _, f := range files {
		for _, t := range f.Tensors() {
			if g, dup := s.where[t.Name]; dup {
				return fail(fmt.Errorf("safetensors: %s: tensor %q is in both %s and %s: %w", source, t.Name, g.Name(), f.Name(), ErrFormat))
			}
			if weightMap != nil {
				want, ok := weightMap[t.Name]
				if !ok {
					return fail(fmt.Errorf("safetensors: %s: tensor %q of %s is missing from weight_map: %w", source, t.Name, f.Name(), ErrFormat))
				}
				if want != filepath.Base(f.Name()) {
					return fail(fmt.Errorf("safetensors: %s: weight_map[%q]: expected %s, found the tensor in %s: %w", source, t.Name, want, f.Name(), ErrFormat))
				}
			}
			s.where[t.Name] = f
			s.infos = append(s.infos, t)
		}
	}
	for name, shard := range weightMap {
		if _, ok := s.where[name]; !ok {
			return fail(fmt.Errorf("safetensors: %s: weight_map[%q]: tensor not found in %s: %w", source, name, shard, ErrFormat))
		}
	}
	sort.Slice(s.infos, func(i, j int) bool { return s.infos[i].Name < s.infos[j].Name })
	return s, nil
}

// Source is the file or index the set was opened from.
func (s *Set) Source() string { return s.source }

// Tensors returns every tensor sorted by name. Do not modify it.
func (s *Set) Tensors() []TensorInfo { return s.infos }

// Tensor returns the named tensor's description.
func (s *Set) Tensor(name string) (TensorInfo, bool) {
	f, ok := s.where[name]
	if !ok {
		return TensorInfo{}, false
	}
	return f.Tensor(name)
}

// ReadF32 converts the named tensor into dst (see File.ReadF32).
func (s *Set) ReadF32(name string, dst []float32) error {
	f, ok := s.where[name]
	if !ok {
		return fmt.Errorf("safetensors: %s: no tensor %q", s.source, name)
	}
	return f.ReadF32(name, dst)
}

// ReadF32At converts part of the named tensor into dst (see File.ReadF32At).
func (s *Set) ReadF32At(name string, start int, dst []float32) error {
	f, ok := s.where[name]
	if !ok {
		return fmt.Errorf("safetensors: %s: no tensor %q", s.source, name)
	}
	return f.ReadF32At(name, start, dst)
}

// ReadRaw copies the named tensor's bytes into dst (see File.ReadRaw).
func (s *Set) ReadRaw(name string, dst []byte) error {
	f, ok := s.where[name]
	if !ok {
		return fmt.Errorf("safetensors: %s: no tensor %q", s.source, name)
	}
	return f.ReadRaw(name, dst)
}

// Metadata returns the first file's __metadata__.
func (s *Set) Metadata() map[string]string {
	if len(s.files) == 0 {
		return nil
	}
	return s.files[0].Metadata()
}

// Close closes every file of the set.
func (s *Set) Close() error {
	var first error
	for _, f := range s.files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
