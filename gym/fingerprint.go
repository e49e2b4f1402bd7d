package gym

// NeMo Gym's content fingerprint of model-authored turns (Gym's
// fingerprint.py, FINGERPRINT_VERSION 3), used by the content witness of
// terminal attribution (terminal.go).
//
//	assistant_fingerprint(items) =
//	  "" when no item is model-authored (role "assistant", or type "function_call"), else
//	  hex(sha256("nemo-gym-lineage" || for each model-authored item, in order:
//	      for each content part (type, payload):   F(0x00, type) F(0x01, payload)
//	      for each tool call (id, name, arguments): F(0x02, id) F(0x03, name) F(0x04, arguments)))
//	F(tag, s) = tag || u64be(len(utf8(s))) || utf8(s)
//
// Content parts: a string content is one ("text", s) part when non-empty; a
// list content yields ("text", s) for each non-empty string block and for
// each block whose "text" is a string and whose type is "", "text",
// "input_text" or "output_text"; tool_use/tool_result blocks are skipped;
// any other block with a type contributes (str(type), orjson(block)). Tool
// calls, in this order: the item itself when its type is "function_call"
// (id = call_id or id, name = [namespace "__"] name), each "tool_use" block
// of the content (id, name, input), each entry of tool_calls (id,
// function.name, function.arguments). Arguments are canonicalized: None →
// "", a string → orjson(json.loads(s)) or, if that fails, s.strip(), any
// other value → orjson(value). orjson(v) is orjson.dumps(v, OPT_SORT_KEYS).
// Every str() and truthiness test is Python's (pyvalue.go).

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"unicode/utf8"
)

// FingerprintVersion is Gym's FINGERPRINT_VERSION: an entry stamped with
// another fingerprint_version never matches on its continuation_fingerprint.
const FingerprintVersion = 3

const fingerprintDomain = "nemo-gym-lineage"

type toolCall struct{ id, name, args string }

type contentPart struct{ typ, payload string }

// AssistantFingerprint is Gym's assistant_fingerprint over JSON items (each
// raw JSON, parsed as json.loads does). It returns "" when no item is
// model-authored. An error means Gym's function raises for this input.
func AssistantFingerprint(items [][]byte) (string, error) {
	vals := make([]*pyValue, len(items))
	for i, raw := range items {
		v, err := parsePy(raw, false)
		if err != nil {
			return "", err
		}
		vals[i] = v
	}
	return assistantFingerprint(vals)
}

// assistantFingerprint is Gym's assistant_fingerprint. Its error wraps
// errPyValue (Gym raises an exception its caller catches) or errPyCrash
// (Gym raises AttributeError, which escapes resolve_terminal).
func assistantFingerprint(messages []*pyValue) (string, error) {
	h := sha256.New()
	h.Write([]byte(fingerprintDomain))
	count := 0
	for _, m := range messages {
		if m == nil || m.kind != pyDict {
			return "", pyValueErr("request item is not an object: %s", m.typeName())
		}
		if !isAssistantAuthored(m) {
			continue
		}
		count++
		parts, err := contentOf(m.get("content"))
		if err != nil {
			return "", err
		}
		for _, p := range parts {
			if err := updateField(h, 0x00, p.typ); err != nil {
				return "", err
			}
			if err := updateField(h, 0x01, p.payload); err != nil {
				return "", err
			}
		}
		tools, err := toolsOf(m)
		if err != nil {
			return "", err
		}
		for _, tc := range tools {
			for i, s := range [3]string{tc.id, tc.name, tc.args} {
				if err := updateField(h, byte(0x02+i), s); err != nil {
					return "", err
				}
			}
		}
	}
	if count == 0 {
		return "", nil
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// updateField hashes one tagged, length-delimited UTF-8 field. A string
// holding a lone surrogate cannot be encoded (Python's UnicodeEncodeError).
func updateField(h hash.Hash, tag byte, s string) error {
	if !utf8.ValidString(s) {
		return pyValueErr("'utf-8' codec can't encode a surrogate")
	}
	var hdr [9]byte
	hdr[0] = tag
	binary.BigEndian.PutUint64(hdr[1:], uint64(len(s)))
	h.Write(hdr[:])
	h.Write([]byte(s))
	return nil
}

func isAssistantAuthored(m *pyValue) bool {
	return m.get("role").isStr("assistant") || m.get("type").isStr("function_call")
}

// strOr is str(v or "") of Python.
func strOr(v *pyValue) string {
	if !v.truthy() {
		return ""
	}
	return pyStr(v)
}

// strDefault is str(d.get(key, "")): "" only when the key is absent.
func strDefault(d *pyValue, key string) string {
	v := d.get(key)
	if v == nil {
		return ""
	}
	return pyStr(v)
}

var textBlockTypes = map[string]bool{"": true, "text": true, "input_text": true, "output_text": true}

func contentOf(c *pyValue) ([]contentPart, error) {
	if c == nil || c.kind == pyNone {
		return nil, nil
	}
	if c.kind == pyStr_ {
		if c.s == "" {
			return nil, nil
		}
		return []contentPart{{"text", c.s}}, nil
	}
	if c.kind != pyList {
		return nil, pyValueErr("unsupported message content: %s", c.typeName())
	}
	var parts []contentPart
	for _, block := range c.list {
		if block.kind == pyStr_ {
			if block.s != "" {
				parts = append(parts, contentPart{"text", block.s})
			}
			continue
		}
		if block.kind != pyDict {
			return nil, pyValueErr("unsupported content block: %s", block.typeName())
		}
		bt := strOr(block.get("type"))
		if bt == "tool_use" || bt == "tool_result" {
			continue
		}
		if t := block.get("text"); t != nil && t.kind == pyStr_ && textBlockTypes[bt] {
			if t.s != "" {
				parts = append(parts, contentPart{"text", t.s})
			}
			continue
		}
		if bt == "" {
			return nil, pyValueErr("content block has no supported type")
		}
		payload, err := orjsonDumps(block)
		if err != nil {
			return nil, pyValueErr("unsupported prompt content: dict")
		}
		parts = append(parts, contentPart{bt, payload})
	}
	return parts, nil
}

func canonicalizeToolArguments(v *pyValue) (string, error) {
	if v == nil || v.kind == pyNone {
		return "", nil
	}
	parsed := v
	if v.kind == pyStr_ {
		p, err := parsePy([]byte(v.s), false)
		if err != nil {
			return pyStrip(v.s), nil
		}
		parsed = p
	}
	s, err := orjsonDumps(parsed)
	if err != nil {
		return "", pyValueErr("unsupported prompt content: %s", parsed.typeName())
	}
	return s, nil
}

func toolsOf(m *pyValue) ([]toolCall, error) {
	var tools []toolCall
	if m.get("type").isStr("function_call") {
		name := strDefault(m, "name")
		if ns := m.get("namespace"); ns.truthy() {
			name = pyStr(ns) + "__" + name
		}
		id := strOr(m.get("call_id"))
		if !m.get("call_id").truthy() {
			id = strOr(m.get("id"))
		}
		args, err := canonicalizeToolArguments(m.get("arguments"))
		if err != nil {
			return nil, err
		}
		tools = append(tools, toolCall{id, name, args})
	}
	if c := m.get("content"); c != nil && c.kind == pyList {
		for _, block := range c.list {
			if block.kind == pyDict && block.get("type").isStr("tool_use") {
				args, err := canonicalizeToolArguments(block.get("input"))
				if err != nil {
					return nil, err
				}
				tools = append(tools, toolCall{strOr(block.get("id")), strDefault(block, "name"), args})
			}
		}
	}
	tc := m.get("tool_calls")
	if !tc.truthy() {
		return tools, nil
	}
	var calls []*pyValue
	switch tc.kind {
	case pyList:
		calls = tc.list
	case pyDict:
		for _, k := range tc.keys {
			calls = append(calls, &pyValue{kind: pyStr_, s: k})
		}
	case pyStr_:
		for _, r := range tc.s {
			calls = append(calls, &pyValue{kind: pyStr_, s: string(r)})
		}
	default:
		return nil, pyValueErr("'%s' object is not iterable", tc.typeName())
	}
	empty := &pyValue{kind: pyDict, vals: map[string]*pyValue{}}
	for _, call := range calls {
		if !call.truthy() {
			call = empty
		} else if call.kind != pyDict {
			return nil, pyCrash("'%s' object has no attribute 'get'", call.typeName())
		}
		fn := call.get("function")
		if !fn.truthy() {
			fn = empty
		} else if fn.kind != pyDict {
			return nil, pyCrash("'%s' object has no attribute 'get'", fn.typeName())
		}
		args, err := canonicalizeToolArguments(fn.get("arguments"))
		if err != nil {
			return nil, err
		}
		tools = append(tools, toolCall{strOr(call.get("id")), strDefault(fn, "name"), args})
	}
	return tools, nil
}
