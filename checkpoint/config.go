package checkpoint

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
)

// DefaultIgnoredConfigFields are config.json keys that describe how a file
// was produced rather than the model: they may differ between a checkpoint
// (fp32 weights written by tracegrpo) and the base model's config.
var DefaultIgnoredConfigFields = []string{"_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache"}

// FieldDiff is one config.json field that differs (a dotted path for nested
// objects).
type FieldDiff struct {
	Field      string
	Checkpoint string // JSON of the checkpoint's value, or "(absent)"
	Model      string // JSON of the current model's value, or "(absent)"
}

func (d FieldDiff) String() string {
	return fmt.Sprintf("%s: checkpoint %s, model %s", d.Field, d.Checkpoint, d.Model)
}

// DiffConfig compares two config.json documents field by field, skipping
// the top-level keys in ignore, and returns the differences sorted by field.
// Numbers compare by value (1 equals 1.0).
func DiffConfig(checkpoint, model []byte, ignore []string) ([]FieldDiff, error) {
	a, err := decodeObject(checkpoint)
	if err != nil {
		return nil, fmt.Errorf("checkpoint config.json: %w", err)
	}
	b, err := decodeObject(model)
	if err != nil {
		return nil, fmt.Errorf("model config.json: %w", err)
	}
	for _, k := range ignore {
		delete(a, k)
		delete(b, k)
	}
	var out []FieldDiff
	diffValue("", a, b, &out)
	sort.Slice(out, func(i, j int) bool { return out[i].Field < out[j].Field })
	return out, nil
}

// CheckConfig returns an error wrapping ErrConfigMismatch that names every
// differing field, or nil.
func CheckConfig(checkpoint, model []byte, ignore []string) error {
	diffs, err := DiffConfig(checkpoint, model, ignore)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrConfigMismatch, err)
	}
	if len(diffs) == 0 {
		return nil
	}
	parts := make([]string, len(diffs))
	for i, d := range diffs {
		parts[i] = d.String()
	}
	return fmt.Errorf("%w in %d field(s): %s", ErrConfigMismatch, len(diffs), strings.Join(parts, "; "))
}

func decodeObject(b []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, fmt.Errorf("want a JSON object")
	}
	if dec.More() {
		return nil, fmt.Errorf("trailing data after the JSON object")
	}
	return m, nil
}

func render(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

func diffValue(path string, a, b any, out *[]FieldDiff) {
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if aok && bok {
		keys := map[string]bool{}
		for k := range am {
			keys[k] = true
		}
		for k := range bm {
			keys[k] = true
		}
		for k := range keys {
			p := k
			if path != "" {
				p = path + "." + k
			}
			av, ain := am[k]
			bv, bin := bm[k]
			switch {
			case !ain:
				*out = append(*out, FieldDiff{Field: p, Checkpoint: "(absent)", Model: render(bv)})
			case !bin:
				*out = append(*out, FieldDiff{Field: p, Checkpoint: render(av), Model: "(absent)"})
			default:
				diffValue(p, av, bv, out)
			}
		}
		return
	}
	if !equalJSON(a, b) {
		*out = append(*out, FieldDiff{Field: path, Checkpoint: render(a), Model: render(b)})
	}
}

func equalJSON(a, b any) bool {
	an, aok := a.(json.Number)
	bn, bok := b.(json.Number)
	if aok && bok {
		if an == bn {
			return true
		}
		af, err1 := an.Float64()
		bf, err2 := bn.Float64()
		return err1 == nil && err2 == nil && af == bf
	}
	as, aok := a.([]any)
	bs, bok := b.([]any)
	if aok && bok {
		if len(as) != len(bs) {
			return false
		}
		for i := range as {
			if !equalJSON(as[i], bs[i]) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a, b)
}
