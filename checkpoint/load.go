package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/klauspost/compress/zstd"
	"github.com/tracegrpo/tracegrpo/internal/inputfile"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
)

// Errors wrapped by Load, Verify, Latest and LoadLatest.
var (
	ErrIncomplete     = errors.New("checkpoint: incomplete")
	ErrCorrupt        = errors.New("checkpoint: does not match its manifest")
	ErrNoCheckpoint   = errors.New("checkpoint: no checkpoint")
	ErrConfigMismatch = errors.New("checkpoint: model config differs")
)

// LoadOptions controls Load, Latest and LoadLatest.
type LoadOptions struct {
	// Fallback lets Latest and LoadLatest use an older complete checkpoint
	// when the newest one is incomplete or corrupt (each skipped one is
	// reported in LoadResult.Skipped).
	Fallback bool
	// ExpectConfig, when set, is the current model's config.json; a
	// checkpoint whose config.json differs in any field outside
	// IgnoreConfigFields is refused with ErrConfigMismatch.
	ExpectConfig []byte
	// IgnoreConfigFields are top-level config.json keys not compared; nil
	// means DefaultIgnoredConfigFields.
	IgnoreConfigFields []string
}

// Verify checks the checkpoint at path against its DONE marker and manifest
// (sizes and sha256 of every file), and a sharded one's files against each
// other (OpenTensors), and returns the manifest.
func Verify(path string) (Manifest, error) {
	man, err := checkStructure(path)
	if err != nil {
		return Manifest{}, err
	}
	errs := make([]error, len(man.Files))
	var wg sync.WaitGroup
	for i, f := range man.Files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = checkHash(filepath.Join(path, f.Name), f)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return Manifest{}, err
	}
	if man.Sharded() {
		// Every file matches the manifest; the shards must also belong
		// together (OpenTensors checks them against each other).
		t, err := OpenTensors(path)
		if err != nil {
			return Manifest{}, err
		}
		t.Close()
	}
	return man, nil
}

// checkStructure checks everything but the file hashes: DONE matches the
// manifest, the manifest parses and names this step, and the files on disk
// are exactly the manifest's, with its sizes.
func checkStructure(path string) (Manifest, error) {
	dirStep, ok := parseStepDir(filepath.Base(path))
	if !ok {
		return Manifest{}, fmt.Errorf("checkpoint: %s: directory name: want step_<N>", path)
	}
	done, err := readSmall(filepath.Join(path, DoneFile))
	if errors.Is(err, os.ErrNotExist) {
		return Manifest{}, fmt.Errorf("%w: %s: %s marker missing: the save did not finish", ErrIncomplete, path, DoneFile)
	}
	if err != nil {
		return Manifest{}, err
	}
	mb, err := readSmall(filepath.Join(path, ManifestFile))
	if errors.Is(err, os.ErrNotExist) {
		return Manifest{}, fmt.Errorf("%w: %s: %s missing", ErrCorrupt, path, ManifestFile)
	}
	if err != nil {
		return Manifest{}, err
	}
	if want := doneContent(mb); !bytes.Equal(done, want) {
		return Manifest{}, fmt.Errorf("%w: %s: %s holds %q, but %s hashes to %q", ErrCorrupt, path, DoneFile, truncate(done), ManifestFile, strings.TrimSpace(string(want)))
	}
	man, err := ParseManifest(mb)
	if err != nil {
		return Manifest{}, fmt.Errorf("%w: %s: %v", ErrCorrupt, filepath.Join(path, ManifestFile), err)
	}
	if man.Step != dirStep {
		return Manifest{}, fmt.Errorf("%w: %s: %s: step: want %d (the directory name), found %d", ErrCorrupt, path, ManifestFile, dirStep, man.Step)
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return Manifest{}, fmt.Errorf("checkpoint: %w", err)
	}
	listed := map[string]FileEntry{}
	for _, f := range man.Files {
		listed[f.Name] = f
	}
	for _, e := range ents {
		n := e.Name()
		if n == ManifestFile || n == DoneFile {
			continue
		}
		f, ok := listed[n]
		if !ok {
			return Manifest{}, fmt.Errorf("%w: %s: file %s is not in %s", ErrCorrupt, path, n, ManifestFile)
		}
		info, err := e.Info()
		if err != nil {
			return Manifest{}, fmt.Errorf("checkpoint: %w", err)
		}
		if !info.Mode().IsRegular() {
			return Manifest{}, fmt.Errorf("%w: %s: %s is not a regular file", ErrCorrupt, path, n)
		}
		if info.Size() != f.Size {
			return Manifest{}, fmt.Errorf("%w: %s: size: %s says %d bytes, found %d", ErrCorrupt, filepath.Join(path, n), ManifestFile, f.Size, info.Size())
		}
		delete(listed, n)
	}
	for _, f := range man.Files {
		if _, missing := listed[f.Name]; missing {
			return Manifest{}, fmt.Errorf("%w: %s: %s lists %s, which is missing", ErrCorrupt, path, ManifestFile, f.Name)
		}
	}
	return man, nil
}

func truncate(b []byte) string {
	if len(b) > 80 {
		return string(b[:80]) + "..."
	}
	return string(b)
}

// openFile opens a checkpoint's file: a regular file (anything else, such
// as a named pipe, is damage, and never blocks the read).
func openFile(path string) (*os.File, error) {
	f, err := inputfile.Open(path, inputfile.Checkpoint)
	if errors.Is(err, inputfile.ErrNotRegular) {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return f, err
}

func readSmall(path string) ([]byte, error) {
	b, err := inputfile.ReadFile(path, inputfile.CheckpointJSON)
	if errors.Is(err, inputfile.ErrNotRegular) || errors.Is(err, inputfile.ErrTooLarge) {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return b, err
}

// VerifyFiles checks the named files of the checkpoint at path against its
// DONE marker and manifest (size and sha256), as Verify does for all of
// them: for a reader of an unsharded checkpoint (which has no block
// checksums) that needs only some of its files, such as an export's
// model.safetensors.
func VerifyFiles(path string, names ...string) error {
	man, err := checkStructure(path)
	if err != nil {
		return err
	}
	for _, n := range names {
		i := slices.IndexFunc(man.Files, func(f FileEntry) bool { return f.Name == n })
		if i < 0 {
			return fmt.Errorf("%w: %s: %s does not list %s", ErrCorrupt, path, ManifestFile, n)
		}
		if err := checkHash(filepath.Join(path, n), man.Files[i]); err != nil {
			return err
		}
	}
	return nil
}

func checkHash(path string, want FileEntry) error {
	f, err := openFile(path)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return fmt.Errorf("checkpoint: read %s: %w", path, err)
	}
	if n != want.Size {
		return fmt.Errorf("%w: %s: size: %s says %d bytes, read %d", ErrCorrupt, path, ManifestFile, want.Size, n)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want.SHA256 {
		return fmt.Errorf("%w: %s: sha256: %s says %s, file has %s", ErrCorrupt, path, ManifestFile, want.SHA256, got)
	}
	return nil
}

// ParseManifest parses and validates manifest.json.
func ParseManifest(b []byte) (Manifest, error) {
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return Manifest{}, fmt.Errorf("parse: %w", err)
	}
	if dec.More() {
		return Manifest{}, fmt.Errorf("parse: trailing data after the JSON object")
	}
	if m.Format != formatName {
		return Manifest{}, fmt.Errorf("format: want %q, found %q", formatName, m.Format)
	}
	if m.Version != FormatVersion {
		return Manifest{}, fmt.Errorf("version: want %d, found %d", FormatVersion, m.Version)
	}
	seen := map[string]bool{}
	var model, config, optim, ts, index int
	shards := map[int]bool{}
	world := -1
	for i, f := range m.Files {
		switch f.Name {
		case ModelFile:
			model++
		case ConfigFile:
			config++
		case OptimizerFile, OptimizerZstdFile:
			optim++
		case TrainerStateFile:
			ts++
		case ShardIndexFile:
			index++
		default:
			r, w, ok := parseShardFile(f.Name)
			if !ok {
				return Manifest{}, fmt.Errorf("files[%d].name: want one of the checkpoint's files, found %q", i, f.Name)
			}
			if world >= 0 && w != world {
				return Manifest{}, fmt.Errorf("files[%d].name: %q: shards of %d and of %d ranks in one checkpoint", i, f.Name, world, w)
			}
			world = w
			shards[r] = true
		}
		if seen[f.Name] {
			return Manifest{}, fmt.Errorf("files[%d].name: %q listed twice", i, f.Name)
		}
		seen[f.Name] = true
		if f.UncompressedSize < 0 || (f.UncompressedSize != 0) != (f.Name == OptimizerZstdFile) {
			return Manifest{}, fmt.Errorf("files[%d] (%s).uncompressed_size: want > 0 exactly for %s, found %d", i, f.Name, OptimizerZstdFile, f.UncompressedSize)
		}
		if f.Size < 0 {
			return Manifest{}, fmt.Errorf("files[%d] (%s).size: negative (%d)", i, f.Name, f.Size)
		}
		if len(f.SHA256) != 64 || strings.Trim(f.SHA256, "0123456789abcdef") != "" {
			return Manifest{}, fmt.Errorf("files[%d] (%s).sha256: want 64 lowercase hex digits, found %q", i, f.Name, f.SHA256)
		}
	}
	if index > 0 || world >= 0 {
		if model != 1 || config != 1 || optim != 0 || ts != 1 || index != 1 || len(shards) != world {
			return Manifest{}, fmt.Errorf("files: a sharded checkpoint has %s, %s, %s, %s and one shard file per rank (%d ranks: %d shard files), found %d entries",
				ModelFile, ConfigFile, TrainerStateFile, ShardIndexFile, max(world, 0), len(shards), len(m.Files))
		}
		return m, nil
	}
	if model != 1 || config != 1 || optim > 1 || ts != 1 {
		return Manifest{}, fmt.Errorf("files: want %s, %s, one optimizer file (none for a weights-only checkpoint) and %s, found %d entries", ModelFile, ConfigFile, TrainerStateFile, len(m.Files))
	}
	return m, nil
}

// ParseTrainerState parses and validates trainer_state.json.
func ParseTrainerState(b []byte) (TrainerState, error) {
	var ts TrainerState
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ts); err != nil {
		return TrainerState{}, fmt.Errorf("parse: %w", err)
	}
	if dec.More() {
		return TrainerState{}, fmt.Errorf("parse: trailing data after the JSON object")
	}
	if ts.FormatVersion != FormatVersion {
		return TrainerState{}, fmt.Errorf("format_version: want %d, found %d", FormatVersion, ts.FormatVersion)
	}
	if ts.Step < 0 || ts.ConsumedRollouts < 0 {
		return TrainerState{}, fmt.Errorf("step/consumed_logical_rollouts: want >= 0, found %d/%d", ts.Step, ts.ConsumedRollouts)
	}
	// The file is indented; the opaque values were compacted on save and
	// are returned compacted. A JSON null decodes into a RawMessage as the
	// bytes "null"; absent and null alike come back as nil.
	for _, f := range []*json.RawMessage{&ts.Optimizer, &ts.Scheduler, &ts.RolloutCursor, &ts.Config} {
		if string(*f) == "null" {
			*f = nil
			continue
		}
		if len(*f) > 0 {
			var c bytes.Buffer
			if err := json.Compact(&c, *f); err != nil {
				return TrainerState{}, fmt.Errorf("parse: %w", err)
			}
			*f = c.Bytes()
		}
	}
	return ts, nil
}

// Load verifies the checkpoint at path (everything Verify checks) and reads
// it. An uncompressed tensor file is hashed and decoded in one sequential
// pass; its tensors are returned only if the whole file matches its sha256.
func Load(path string, opt LoadOptions) (*State, error) {
	man, err := checkStructure(path)
	if err != nil {
		return nil, err
	}
	if man.Sharded() {
		return nil, fmt.Errorf("checkpoint: %s is sharded (%s): read its tensors through OpenTensors", path, ShardIndexFile)
	}
	st, err := loadMeta(path, man, opt)
	if err != nil {
		return nil, err
	}
	entry := map[string]FileEntry{}
	var optEntry FileEntry
	for _, f := range man.Files {
		entry[f.Name] = f
		if f.Name == OptimizerFile || f.Name == OptimizerZstdFile {
			optEntry = f
		}
	}
	var wg sync.WaitGroup
	var modelErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		st.Model, modelErr = loadTensorFile(filepath.Join(path, ModelFile), entry[ModelFile], "checkpoint-model", man.Step)
	}()
	optPath := filepath.Join(path, optEntry.Name)
	var optErr error
	switch {
	case st.Trainer.NoOptimizer:
	case optEntry.UncompressedSize > 0:
		if optErr = checkHash(optPath, optEntry); optErr == nil {
			st.Optimizer, optErr = readTensors(optPath, optEntry.UncompressedSize, "checkpoint-optimizer", man.Step)
		}
	default:
		st.Optimizer, optErr = loadTensorFile(optPath, optEntry, "checkpoint-optimizer", man.Step)
	}
	wg.Wait()
	if err := errors.Join(modelErr, optErr); err != nil {
		return nil, err
	}
	return st, nil
}

// loadMeta reads and checks the small files of the checkpoint at path.
func loadMeta(path string, man Manifest, opt LoadOptions) (*State, error) {
	entry := map[string]FileEntry{}
	for _, f := range man.Files {
		entry[f.Name] = f
	}
	st := &State{}
	readChecked := func(name string) ([]byte, error) {
		p := filepath.Join(path, name)
		b, err := readSmall(p)
		if err != nil {
			return nil, err
		}
		return b, checkBytes(p, b, entry[name])
	}
	tsPath := filepath.Join(path, TrainerStateFile)
	tb, err := readChecked(TrainerStateFile)
	if err != nil {
		return nil, err
	}
	if st.Trainer, err = ParseTrainerState(tb); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, tsPath, err)
	}
	if st.Trainer.Step != man.Step {
		return nil, fmt.Errorf("%w: %s: step: want %d (the manifest's), found %d", ErrCorrupt, tsPath, man.Step, st.Trainer.Step)
	}
	if !man.Sharded() {
		hasOpt := false
		for _, f := range man.Files {
			hasOpt = hasOpt || f.Name == OptimizerFile || f.Name == OptimizerZstdFile
		}
		if hasOpt == st.Trainer.NoOptimizer {
			return nil, fmt.Errorf("%w: %s: no_optimizer is %v, but the manifest lists %s optimizer file: the checkpoint lost its Adam moments, or was assembled from two",
				ErrCorrupt, tsPath, st.Trainer.NoOptimizer, map[bool]string{true: "an", false: "no"}[hasOpt])
		}
	}
	if st.ModelConfig, err = readChecked(ConfigFile); err != nil {
		return nil, err
	}
	if opt.ExpectConfig != nil {
		ignore := opt.IgnoreConfigFields
		if ignore == nil {
			ignore = DefaultIgnoredConfigFields
		}
		if err := CheckConfig(st.ModelConfig, opt.ExpectConfig, ignore); err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(path, ConfigFile), err)
		}
	}
	return st, nil
}

func checkBytes(path string, b []byte, want FileEntry) error {
	if int64(len(b)) != want.Size {
		return fmt.Errorf("%w: %s: size: %s says %d bytes, read %d", ErrCorrupt, path, ManifestFile, want.Size, len(b))
	}
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); got != want.SHA256 {
		return fmt.Errorf("%w: %s: sha256: %s says %s, file has %s", ErrCorrupt, path, ManifestFile, want.SHA256, got)
	}
	return nil
}

// loadChunk is the read size of the one-pass tensor loader.
const loadChunk = 4 << 20

// loadTensorFile reads an uncompressed safetensors file in one sequential
// pass that both hashes every byte and decodes the tensors, then checks the
// hash against want before returning them.
func loadTensorFile(path string, want FileEntry, kind string, step int64) ([]Tensor, error) {
	fh, err := openFile(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	defer fh.Close()
	sf, err := safetensors.NewFile(fh, want.Size, path)
	if err != nil {
		// Report the hash mismatch, which says more than a parse error.
		if herr := checkHash(path, want); herr != nil {
			return nil, herr
		}
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	infos := append([]safetensors.TensorInfo(nil), sf.Tensors()...)
	var dataLen int64
	for _, t := range infos {
		dataLen = max(dataLen, t.End)
	}
	dataStart := want.Size - dataLen
	out := make([]Tensor, len(infos)) // name order, as Tensors returns them
	order := make([]int, len(infos))
	for i, t := range infos {
		order[i] = i
		out[i].Spec = safetensors.Spec{Name: t.Name, DType: t.DType, Shape: append(make([]int, 0, len(t.Shape)), t.Shape...)}
		if t.DType == safetensors.F32 {
			out[i].F32 = make([]float32, t.NumElements())
		} else {
			out[i].Raw = make([]byte, t.End-t.Begin)
		}
	}
	sort.Slice(order, func(a, b int) bool { return infos[order[a]].Begin < infos[order[b]].Begin })
	// The file is read in chunks; a second goroutine hashes each chunk while
	// this one decodes it and reads the next (three buffers in rotation).
	h := sha256.New()
	free := make(chan []byte, 3)
	for range 3 {
		free <- make([]byte, min(loadChunk, max(want.Size, 1)))
	}
	toHash := make(chan []byte, 3)
	hashed := make(chan struct{})
	go func() {
		for b := range toHash {
			h.Write(b)
			free <- b[:cap(b)]
		}
		close(hashed)
	}()
	r := io.NewSectionReader(fh, 0, want.Size)
	var readErr error
	read := func(n int64) []byte {
		b := (<-free)[:n]
		if _, err := io.ReadFull(r, b); err != nil && readErr == nil {
			readErr = fmt.Errorf("checkpoint: read %s: %w", path, err)
		}
		return b
	}
	for done := int64(0); done < dataStart && readErr == nil; {
		n := min(loadChunk, dataStart-done)
		toHash <- read(n)
		done += n
	}
	for _, i := range order {
		t := infos[i]
		var pos int64 // bytes of this tensor done
		for pos < t.End-t.Begin && readErr == nil {
			n := min(loadChunk, t.End-t.Begin-pos) // loadChunk is a multiple of every dtype size
			b := read(n)
			if out[i].F32 != nil {
				dst := out[i].F32[pos/4:]
				for k := range len(b) / 4 {
					dst[k] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*k:]))
				}
			} else {
				copy(out[i].Raw[pos:], b)
			}
			toHash <- b
			pos += n
		}
	}
	close(toHash)
	<-hashed
	if readErr != nil {
		return nil, readErr
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want.SHA256 {
		return nil, fmt.Errorf("%w: %s: sha256: %s says %s, file has %s", ErrCorrupt, path, ManifestFile, want.SHA256, got)
	}
	md := sf.Metadata()
	if md["tracegrpo_format"] != kind || md["tracegrpo_version"] != strconv.Itoa(FormatVersion) || md["step"] != strconv.FormatInt(step, 10) {
		return nil, fmt.Errorf("%w: %s: __metadata__: want tracegrpo_format %q, tracegrpo_version %d, step %d; found %q, %q, %q",
			ErrCorrupt, path, kind, FormatVersion, step, md["tracegrpo_format"], md["tracegrpo_version"], md["step"])
	}
	return out, nil
}

// readTensors reads a safetensors file, zstd-compressed when uncompressed > 0
// (its exact decompressed size, from the manifest).
func readTensors(path string, uncompressed int64, kind string, step int64) ([]Tensor, error) {
	var f *safetensors.File
	var err error
	if uncompressed > 0 {
		fh, err := openFile(path)
		if err != nil {
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
		dec, err := zstd.NewReader(fh, zstd.WithDecoderConcurrency(1))
		if err != nil {
			fh.Close()
			return nil, fmt.Errorf("checkpoint: %s: %w", path, err)
		}
		raw := make([]byte, uncompressed)
		_, err = io.ReadFull(dec, raw)
		if err == nil {
			// The stream must end exactly here.
			var one [1]byte
			if n, _ := dec.Read(one[:]); n != 0 {
				err = fmt.Errorf("decompresses to more than the %d bytes %s says", uncompressed, ManifestFile)
			}
		}
		dec.Close()
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("%w: %s: zstd: %v", ErrCorrupt, path, err)
		}
		f, err = safetensors.NewFile(bytes.NewReader(raw), int64(len(raw)), path)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
	} else {
		if f, err = safetensors.Open(path); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
	}
	defer f.Close()
	md := f.Metadata()
	if md["tracegrpo_format"] != kind || md["tracegrpo_version"] != strconv.Itoa(FormatVersion) || md["step"] != strconv.FormatInt(step, 10) {
		return nil, fmt.Errorf("%w: %s: __metadata__: want tracegrpo_format %q, tracegrpo_version %d, step %d; found %q, %q, %q",
			ErrCorrupt, path, kind, FormatVersion, step, md["tracegrpo_format"], md["tracegrpo_version"], md["step"])
	}
	infos := f.Tensors()
	out := make([]Tensor, len(infos))
	for i, t := range infos {
		out[i].Spec = safetensors.Spec{Name: t.Name, DType: t.DType, Shape: append(make([]int, 0, len(t.Shape)), t.Shape...)}
		if t.DType == safetensors.F32 {
			out[i].F32 = make([]float32, t.NumElements())
			err = f.ReadF32(t.Name, out[i].F32)
		} else {
			out[i].Raw = make([]byte, t.End-t.Begin)
			err = f.ReadRaw(t.Name, out[i].Raw)
		}
		if err != nil {
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
	}
	return out, nil
}

// LoadResult is what LoadLatest found.
type LoadResult struct {
	State   *State
	Path    string
	Skipped []error // newer checkpoints passed over (only with Fallback)
}

// Latest returns the path of the newest step_<N> checkpoint of dir whose
// structure is complete (DONE matches the manifest, files and sizes match;
// Load also checks the hashes). If the newest is not complete, Latest returns
// its error unless opt.Fallback is set, in which case it tries older ones.
func Latest(dir string, opt LoadOptions) (string, error) {
	ents, err := List(dir)
	if err != nil {
		return "", err
	}
	var skipped []error
	for _, e := range ents {
		if _, err := checkStructure(e.Path); err != nil {
			if !opt.Fallback {
				return "", fmt.Errorf("checkpoint: newest checkpoint refused (set fallback to use an older one): %w", err)
			}
			skipped = append(skipped, err)
			continue
		}
		return e.Path, nil
	}
	return "", fmt.Errorf("%w in %s (%d refused)", errors.Join(append([]error{ErrNoCheckpoint}, skipped...)...), dir, len(skipped))
}

// LoadLatest loads the newest checkpoint of dir, verified in full. When it
// is refused, the error names why, unless opt.Fallback is set: then older
// checkpoints are tried in turn and the refused ones are listed in Skipped.
func LoadLatest(dir string, opt LoadOptions) (LoadResult, error) {
	ents, err := List(dir)
	if err != nil {
		return LoadResult{}, err
	}
	var res LoadResult
	for _, e := range ents {
		st, err := Load(e.Path, opt)
		if err != nil {
			if !opt.Fallback || errors.Is(err, ErrConfigMismatch) {
				return res, fmt.Errorf("checkpoint: newest checkpoint refused: %w", err)
			}
			res.Skipped = append(res.Skipped, err)
			continue
		}
		res.State, res.Path = st, e.Path
		return res, nil
	}
	return res, fmt.Errorf("%w in %s (%d refused)", errors.Join(append([]error{ErrNoCheckpoint}, res.Skipped...)...), dir, len(res.Skipped))
}
