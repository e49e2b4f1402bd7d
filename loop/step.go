package loop

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tracegrpo/tracegrpo/internal/inputfile"
)

// Meta is a step file's sidecar, step_<N>.meta.json: the policy version that
// generated the step's rollouts. Other fields a generator adds are kept by
// it and ignored by the trainer.
type Meta struct {
	// PolicyStep is K of the weights directory step_<K> the generator
	// served (N-1 in synchronous GRPO).
	PolicyStep int64 `json:"policy_step"`
	// WeightsSHA256 is the sha256 (lowercase hex) of that directory's
	// model.safetensors as the generator loaded it.
	WeightsSHA256 string `json:"weights_sha256"`
}

// StepFile is step's rollout records file in the rollouts directory dir.
func StepFile(dir string, step int64) string {
	return filepath.Join(dir, "step_"+strconv.FormatInt(step, 10)+".jsonl")
}

// MetaFile is step's sidecar in the rollouts directory dir.
func MetaFile(dir string, step int64) string {
	return filepath.Join(dir, "step_"+strconv.FormatInt(step, 10)+".meta.json")
}

// ReadMeta reads the sidecar at path; an error wrapping os.ErrNotExist
// when there is none.
func ReadMeta(path string) (Meta, error) {
	b, err := inputfile.ReadFile(path, inputfile.LoopJSON)
	if err != nil {
		return Meta{}, err
	}
	return ParseMeta(b, path)
}

// ParseMeta parses a sidecar's bytes (name is its file, for errors): a JSON
// object whose policy_step is a non-negative integer and whose
// weights_sha256 is 64 lowercase hex digits.
func ParseMeta(b []byte, name string) (Meta, error) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil || raw == nil {
		if err == nil {
			err = errors.New("null")
		}
		return Meta{}, fmt.Errorf("%s: want a JSON object {\"policy_step\": K, \"weights_sha256\": \"<hex>\"}: %v", name, err)
	}
	if dec.More() {
		return Meta{}, fmt.Errorf("%s: data after the JSON object", name)
	}
	if k := duplicateKey(b); k != "" {
		// encoding/json (and Python's json) keep the last value silently:
		// which weights the generator meant is unknown.
		return Meta{}, fmt.Errorf("%s: %s: given twice; a sidecar names one policy version", name, k)
	}
	var m Meta
	ps, ok := raw["policy_step"]
	if !ok {
		return Meta{}, fmt.Errorf("%s: policy_step: missing (the step K of the weights directory step_<K> that generated these rollouts)", name)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(ps)), 10, 64)
	if err != nil || n < 0 {
		return Meta{}, fmt.Errorf("%s: policy_step: want a non-negative integer, found %s", name, ps)
	}
	m.PolicyStep = n
	hs, ok := raw["weights_sha256"]
	if !ok {
		return Meta{}, fmt.Errorf("%s: weights_sha256: missing (the sha256 of the model.safetensors the generator loaded)", name)
	}
	if err := json.Unmarshal(hs, &m.WeightsSHA256); err != nil || !isSHA256(m.WeightsSHA256) {
		return Meta{}, fmt.Errorf("%s: weights_sha256: want 64 lowercase hex digits, found %s", name, hs)
	}
	return m, nil
}

// CheckMeta is the trainer's check of step's sidecar m (read from file):
// the rollouts came from the weights of step-1, whose model.safetensors
// had sha256 want ("": not known here, only the step is checked).
func CheckMeta(file string, m Meta, step int64, want string) error {
	if m.PolicyStep != step-1 {
		return fmt.Errorf("%s: policy_step is %d, but synchronous GRPO trains step %d on rollouts of the weights of step %d: "+
			"the generator served stale (or future) weights; regenerate the step from step_%d's weights", file, m.PolicyStep, step, step-1, step-1)
	}
	if want != "" && m.WeightsSHA256 != want {
		return fmt.Errorf("%s: weights_sha256 is %s, but the trainer published step_%d's model.safetensors with sha256 %s: "+
			"the generator loaded other weights (another run's, or a copy from before a resume); regenerate the step from step_%d's weights",
			file, m.WeightsSHA256, step-1, want, step-1)
	}
	return nil
}

// WriteStep writes step's records and sidecar meta (nil: none) into the
// rollouts directory dir, each whole: a temporary file, synced and renamed
// into place, the sidecar first, then dir synced. A trainer waiting for the
// step file finds it complete, with its sidecar beside it.
func WriteStep(dir string, step int64, records []byte, meta *Meta) error {
	if meta != nil {
		b, err := json.Marshal(meta)
		if err != nil {
			return err
		}
		if err := writeSynced(MetaFile(dir, step), append(b, '\n')); err != nil {
			return err
		}
		if err := syncDir(dir); err != nil {
			return err
		}
	}
	if err := writeSynced(StepFile(dir, step), records); err != nil {
		return err
	}
	return syncDir(dir)
}

// NextStep is the step a generator resuming on the rollouts directory dir
// writes next: one past the highest step_<N>.jsonl there (1 for none).
func NextStep(dir string) (int64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("loop: %w", err)
	}
	var top int64
	for _, e := range ents {
		s, ok := strings.CutSuffix(e.Name(), ".jsonl")
		if !ok {
			continue
		}
		if n, ok := parseStepDir(s); ok && n > top && e.Type().IsRegular() {
			top = n
		}
	}
	return top + 1, nil
}

// duplicateKey returns a key that b, a valid JSON object, holds twice at
// its top level ("" when none).
func duplicateKey(b []byte) string {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return ""
	}
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return ""
		}
		k, _ := t.(string)
		if seen[k] {
			return k
		}
		seen[k] = true
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return ""
		}
	}
	return ""
}
