package model

// RoPE in config.json: transformers v4's top-level rope_theta and
// rope_scaling, v5's rope_parameters block, or both (which must agree),
// read into Config.RopeTheta and Config.RopeScaling and written back in
// the form they were read (Config.Form).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
)

// defaultRopeTheta is the rope_theta transformers' config class of each
// model_type uses when config.json states none (LlamaConfig, Qwen2Config and
// Qwen3Config, Qwen3MoeConfig, v4 and v5: 10000).
var defaultRopeTheta = map[Arch]float32{Qwen2: 10000, Qwen3: 10000, Llama: 10000, Qwen3MoE: 10000}

// RopeScaling is a scaled RoPE: Type "llama3" (Llama 3.1/3.2/3.3) with
// transformers' _compute_llama3_parameters fields, or Type "" for none.
type RopeScaling struct {
	Type                          string
	Factor                        float64 // factor
	LowFreqFactor                 float64 // low_freq_factor
	HighFreqFactor                float64 // high_freq_factor
	OriginalMaxPositionEmbeddings int     // original_max_position_embeddings
}

// RopeLlama3 is the RopeScaling.Type of Llama 3.x.
const RopeLlama3 = "llama3"

// ropeKeys are the keys of a RoPE block that tracegrpo interprets.
var ropeKeys = map[string]bool{
	"rope_type": true, "type": true, "rope_theta": true, "factor": true, "low_freq_factor": true,
	"high_freq_factor": true, "original_max_position_embeddings": true, "partial_rotary_factor": true,
}

// The RoPE types tracegrpo implements.
const supportedRopeTypes = `"default", "llama3"`

// ropeBlock is what one RoPE statement (top-level keys, rope_scaling or
// rope_parameters) says.
type ropeBlock struct {
	where    string // "rope_scaling", "rope_parameters" or "" (top level)
	theta    float64
	hasTheta bool
	scaling  RopeScaling
	hasType  bool // states a RoPE type ("default" and rope_scaling null count)
	null     bool // rope_scaling: null
	ignored  []string
}

// parseRopeBlock reads a rope_scaling or rope_parameters object.
func parseRopeBlock(name, where string, raw map[string]json.RawMessage) (ropeBlock, error) {
	r := configReader{name: name, prefix: where + ".", raw: raw}
	b := ropeBlock{where: where}
	for k, v := range raw {
		if len(v) > 0 && v[0] == '{' {
			return b, r.bad(k, "a number or a string (per-layer RoPE parameters are not supported)", string(v))
		}
		if !ropeKeys[k] {
			b.ignored = append(b.ignored, where+"."+k)
		}
	}
	sort.Strings(b.ignored)
	var err error
	if b.hasTheta, err = r.num("rope_theta", false, &b.theta); err != nil {
		return b, err
	}
	var prf float64
	if ok, err := r.num("partial_rotary_factor", false, &prf); err != nil {
		return b, err
	} else if ok && prf != 1 {
		return b, r.bad("partial_rotary_factor", "1 (partial rotary embeddings are not supported)", string(raw["partial_rotary_factor"]))
	}
	typeKey := "rope_type"
	typ, ok, err := r.str("rope_type")
	if err != nil {
		return b, err
	}
	if !ok {
		typeKey = "type" // transformers' older name
		if typ, ok, err = r.str("type"); err != nil {
			return b, err
		}
	}
	if !ok {
		if where == "rope_scaling" {
			return b, r.bad("rope_type", "a RoPE type ("+supportedRopeTypes+")", "nothing")
		}
		typ = "default" // transformers v5 fills rope_type "default"
	} else {
		b.hasType = true
	}
	switch typ {
	case "default":
		for _, k := range []string{"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"} {
			if _, ok := raw[k]; ok {
				b.ignored = append(b.ignored, where+"."+k)
			}
		}
	case RopeLlama3:
		s := RopeScaling{Type: RopeLlama3}
		if _, err := r.num("factor", true, &s.Factor); err != nil {
			return b, err
		}
		if s.Factor < 1 {
			return b, r.bad("factor", "a number ≥ 1", string(raw["factor"]))
		}
		if _, err := r.num("low_freq_factor", true, &s.LowFreqFactor); err != nil {
			return b, err
		}
		if _, err := r.num("high_freq_factor", true, &s.HighFreqFactor); err != nil {
			return b, err
		}
		if !(s.HighFreqFactor > s.LowFreqFactor) {
			return b, r.bad("high_freq_factor", fmt.Sprintf("a number above low_freq_factor %g", s.LowFreqFactor), string(raw["high_freq_factor"]))
		}
		if _, err := r.intf("original_max_position_embeddings", true, &s.OriginalMaxPositionEmbeddings); err != nil {
			return b, err
		}
		if s.OriginalMaxPositionEmbeddings == 0 {
			return b, r.bad("original_max_position_embeddings", "a positive integer", 0)
		}
		b.scaling = s
	default:
		return b, r.bad(typeKey, "a supported RoPE type ("+supportedRopeTypes+")", fmt.Sprintf("%q, which tracegrpo does not implement", typ))
	}
	return b, nil
}

// parseRope reads RoPE from the v4 keys (rope_theta, rope_scaling), the v5
// rope_parameters block, or both, which must then agree; with neither theta,
// transformers' default for the model_type applies and a note says so.
func (c *Config) parseRope(r configReader) error {
	var blocks []ropeBlock
	var top ropeBlock
	var err error
	if top.hasTheta, err = r.num("rope_theta", false, &top.theta); err != nil {
		return err
	}
	c.Form.RopeV4 = top.hasTheta
	blocks = append(blocks, top)
	var prf float64
	if ok, err := r.num("partial_rotary_factor", false, &prf); err != nil {
		return err
	} else if ok && prf != 1 {
		return r.bad("partial_rotary_factor", "1 (partial rotary embeddings are not supported)", string(r.raw["partial_rotary_factor"]))
	}
	for _, where := range []string{"rope_scaling", "rope_parameters"} {
		v, ok := r.raw[where]
		if !ok {
			continue
		}
		if where == "rope_scaling" {
			c.Form.RopeV4 = true
		} else {
			c.Form.RopeV5 = true
		}
		if string(v) == "null" {
			if where == "rope_scaling" {
				blocks = append(blocks, ropeBlock{where: where, hasType: true, null: true}) // states "no scaling"
			}
			continue
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(v, &obj); err != nil || obj == nil {
			return r.bad(where, "an object or null", string(v))
		}
		for k, x := range obj {
			var buf bytes.Buffer
			if err := json.Compact(&buf, x); err == nil {
				obj[k] = buf.Bytes()
			}
		}
		b, err := parseRopeBlock(r.name, where, obj)
		if err != nil {
			return err
		}
		if len(b.ignored) > 0 {
			c.Notes = append(c.Notes, fmt.Sprintf("%s: %s not used by %q RoPE (kept in saved configs)", r.name, strings.Join(b.ignored, ", "), ropeTypeName(b.scaling.Type)))
		}
		blocks = append(blocks, b)
		if where == "rope_scaling" {
			c.Form.RopeScaling = obj
		} else {
			c.Form.RopeParameters = obj
		}
	}
	// Every statement of theta and of the scaling must agree.
	field := func(b ropeBlock, k string) string {
		if b.where == "" {
			return k
		}
		return b.where + "." + k
	}
	var theta *ropeBlock
	var scaling *ropeBlock
	for i := range blocks {
		b := &blocks[i]
		if b.hasTheta {
			if theta != nil && float32(theta.theta) != float32(b.theta) {
				return fmt.Errorf("model: %s: fields %s and %s disagree: %g and %g", r.name, field(*theta, "rope_theta"), field(*b, "rope_theta"), theta.theta, b.theta)
			}
			if theta == nil {
				theta = b
			}
		}
		if b.hasType || b.scaling.Type != "" {
			if scaling != nil {
				if err := sameScaling(r.name, *scaling, *b); err != nil {
					return err
				}
			} else {
				scaling = b
			}
		}
	}
	if theta != nil {
		c.RopeTheta = float32(theta.theta)
	} else {
		c.RopeTheta = defaultRopeTheta[c.Arch]
		c.Notes = append(c.Notes, fmt.Sprintf("%s states no rope_theta (nor rope_parameters.rope_theta): using %g, transformers' default for model_type %s",
			r.name, c.RopeTheta, c.Arch))
	}
	if scaling != nil {
		c.RopeScaling = scaling.scaling
	}
	return nil
}

// sameScaling checks that two RoPE statements give the same scaling.
func sameScaling(name string, a, b ropeBlock) error {
	fa := func(k string) string { return a.where + "." + k }
	fb := func(k string) string { return b.where + "." + k }
	if a.scaling.Type != b.scaling.Type {
		describe := func(x ropeBlock) string {
			if x.null {
				return "null (no scaling)"
			}
			return fmt.Sprintf("RoPE type %q", ropeTypeName(x.scaling.Type))
		}
		return fmt.Errorf("model: %s: fields %s and %s disagree: %s and %s", name, a.where, b.where, describe(a), describe(b))
	}
	sa, sb := a.scaling, b.scaling
	for _, f := range []struct {
		k    string
		x, y float64
	}{
		{"factor", sa.Factor, sb.Factor}, {"low_freq_factor", sa.LowFreqFactor, sb.LowFreqFactor},
		{"high_freq_factor", sa.HighFreqFactor, sb.HighFreqFactor},
		{"original_max_position_embeddings", float64(sa.OriginalMaxPositionEmbeddings), float64(sb.OriginalMaxPositionEmbeddings)},
	} {
		if f.x != f.y {
			return fmt.Errorf("model: %s: fields %s and %s disagree: %g and %g", name, fa(f.k), fb(f.k), f.x, f.y)
		}
	}
	return nil
}

func ropeTypeName(t string) string {
	if t == "" {
		return "default"
	}
	return t
}

// setRopeKey sets block[k] to v unless the block already holds that value
// (then its original spelling, such as 8.0 or 8, is kept).
func setRopeKey(block map[string]json.RawMessage, k string, v json.RawMessage) {
	if old, ok := block[k]; ok {
		var a, b any
		if json.Unmarshal(old, &a) == nil && json.Unmarshal(v, &b) == nil && a == b {
			return
		}
	}
	block[k] = v
}

// ropeBlockJSON renders a rope_scaling (withTheta false) or rope_parameters
// block: the block as read with the interpreted keys set from c.
func (c Config) ropeBlockJSON(read map[string]json.RawMessage, withTheta bool) map[string]json.RawMessage {
	block := map[string]json.RawMessage{}
	for k, v := range read {
		block[k] = v
	}
	typeKey := "rope_type"
	if _, ok := block["rope_type"]; !ok {
		if _, ok := block["type"]; ok {
			typeKey = "type"
		}
	}
	typ, _ := json.Marshal(ropeTypeName(c.RopeScaling.Type))
	setRopeKey(block, typeKey, typ)
	if withTheta || block["rope_theta"] != nil {
		setRopeKey(block, "rope_theta", pyFloat(float64(c.RopeTheta)))
	}
	if s := c.RopeScaling; s.Type == RopeLlama3 {
		setRopeKey(block, "factor", pyFloat(s.Factor))
		setRopeKey(block, "low_freq_factor", pyFloat(s.LowFreqFactor))
		setRopeKey(block, "high_freq_factor", pyFloat(s.HighFreqFactor))
		om, _ := json.Marshal(s.OriginalMaxPositionEmbeddings)
		setRopeKey(block, "original_max_position_embeddings", om)
	}
	return block
}

// validate checks a scaled RoPE's parameters.
func (s RopeScaling) validate() error {
	switch s.Type {
	case "":
	case RopeLlama3:
		if !(s.Factor >= 1) || !(s.LowFreqFactor > 0) || !(s.HighFreqFactor > s.LowFreqFactor) || s.OriginalMaxPositionEmbeddings <= 0 ||
			math.IsInf(s.Factor, 0) || math.IsInf(s.HighFreqFactor, 0) {
			return fmt.Errorf("RoPE scaling llama3: expected factor ≥ 1, 0 < low_freq_factor < high_freq_factor and original_max_position_embeddings > 0, found %+v", s)
		}
	default:
		return fmt.Errorf("RoPE type %q is not supported; supported: %s", s.Type, supportedRopeTypes)
	}
	return nil
}

// ropeJSON sets the RoPE keys in out in the form they were read (Form),
// the v4 keys when there is none.
func (c Config) ropeJSON(out map[string]any) {
	if c.Form.RopeV4 || !c.Form.RopeV5 {
		out["rope_theta"] = c.RopeTheta
		if c.RopeScaling.Type == "" && c.Form.RopeScaling == nil {
			out["rope_scaling"] = nil
		} else {
			out["rope_scaling"] = c.ropeBlockJSON(c.Form.RopeScaling, false)
		}
	}
	if c.Form.RopeV5 {
		out["rope_parameters"] = c.ropeBlockJSON(c.Form.RopeParameters, true)
	}
}
