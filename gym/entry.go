package gym

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
)

// TokenEntrySchemaVersion is the TokenEntry schema of NeMo Gym PR #3212
// (spec §2.1): the request-time lineage (parent_call_id, cum_len, digest,
// parent_resolution, the continuation lookup) on top of schema 1. The
// package writes it by default.
const TokenEntrySchemaVersion = 3

// TokenEntrySchemaV1 is the TokenEntry schema NeMo Gym's main writes today
// (records.py at 07d6b0d07b22fcf530b4c211dae2ee23100428e4,
// TOKEN_ENTRY_RECORD_SCHEMA_VERSION = 1): rollout and call identity, the
// token arrays, routed_experts, the output items, their carrier index and
// created_at, nothing else. Gym's schema-1 reader keeps every other field as
// an unknown extra, so a schema-1 line's lineage-looking fields (a
// parent_call_id, a digest) are kept verbatim in Extra and mean nothing; its
// calls are chained by token prefixes, as Gym main's builder chains them
// (PrefixMergingV1).
//
// These two are the only schemas read. Schema 2 never left Gym's
// development (Gym main's reader refuses it as newer than 1, the PR's as
// older than 3); 4 and 5 are later PR schemas whose fields change token
// meaning (parent-relative prompts). Either masks the rollout
// (unsupported_schema).
const TokenEntrySchemaV1 = 1

// SupportedSchema reports whether v is a TokenEntry schema this package
// reads.
func SupportedSchema(v int) bool { return v == TokenEntrySchemaV1 || v == TokenEntrySchemaVersion }

// ParentResolution is the request-time parent decision of a call.
type ParentResolution string

// The parent resolutions a schema-3 TokenEntry may carry.
const (
	ParentRoot       ParentResolution = "root"
	ParentResolved   ParentResolution = "resolved"
	ParentUnresolved ParentResolution = "unresolved"
)

// TokenEntry is Gym's durable record of one model call, schema v3 (spec
// §2.1). Optional fields are pointers (nil = JSON null or absent). Fields the
// schema does not name are kept verbatim in Extra and written back.
type TokenEntry struct {
	SchemaVersion      int
	RolloutID          string
	ModelCallID        string
	Model              string
	PromptTokenIDs     []int32
	GenerationTokenIDs []int32
	GenerationLogProbs []float64
	// RoutedExperts is the raw JSON of routed_experts, nil when absent or null.
	RoutedExperts json.RawMessage
	// OutputItems are the raw JSON objects of output_items.
	OutputItems               []json.RawMessage
	TokenItemIndex            *int
	ResponseID                *string
	CreatedAt                 float64
	ParentCallID              *string
	CumLen                    *int
	Digest                    *string
	ParentResolution          *ParentResolution
	ContinuationFingerprint   string
	ContinuationContextLen    int
	ContinuationContextDigest string
	ParentResolutionReason    string
	FingerprintVersion        *int
	PromptIsDelta             bool
	// Extra holds unknown fields (Gym's model allows them), compacted.
	Extra map[string]json.RawMessage
}

// FieldError is a problem with one field of a decoded object. Index is the
// element position inside an array field, or -1.
type FieldError struct {
	Field string
	Index int
	Msg   string
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	if e.Index >= 0 {
		return fmt.Sprintf("field %s[%d]: %s", e.Field, e.Index, e.Msg)
	}
	return fmt.Sprintf("field %s: %s", e.Field, e.Msg)
}

// ErrSchemaVersion marks a TokenEntry whose schema_version is neither 1 nor 3. In a
// capture store it masks that rollout (unsupported_schema), as Gym's
// finalizer masks a snapshot it cannot read.
var ErrSchemaVersion = errors.New("gym: unsupported TokenEntry schema_version")

type schemaVersionError struct{ found int64 }

func (e *schemaVersionError) Error() string {
	return fmt.Sprintf("field schema_version: token record is schema_version %d, but this reader supports only %d "+
		"(NeMo Gym main's records) and %d (NeMo Gym PR #3212's); regenerate the capture with a matching NeMo Gym writer",
		e.found, TokenEntrySchemaV1, TokenEntrySchemaVersion)
}
func (e *schemaVersionError) Unwrap() error { return ErrSchemaVersion }

func fieldErr(field string, index int, err error) error {
	var se *syntaxError
	if errors.As(err, &se) {
		return &FieldError{Field: field, Index: index, Msg: se.Error()}
	}
	return &FieldError{Field: field, Index: index, Msg: err.Error()}
}

// DecodeTokenEntry decodes one JSON line strictly: integers must be JSON
// integers, token ids non-negative int32, logprobs finite, the generation
// arrays equally long, and every schema-3 cross-field rule holds (Validate).
// Unknown fields are kept in Extra. Duplicate keys are an error.
func DecodeTokenEntry(line []byte) (*TokenEntry, error) {
	e := &TokenEntry{SchemaVersion: TokenEntrySchemaVersion}
	s := &scanner{data: line}
	seen := map[string]bool{}
	var have struct{ rollout, call, prompt, gen, lp bool }
	var lineage []rawField
	err := s.object(func(key string) error {
		if seen[key] {
			return &FieldError{Field: key, Index: -1, Msg: "duplicate key"}
		}
		seen[key] = true
		var err error
		switch key {
		case "schema_version":
			var v int64
			v, err = s.readInt(math.MinInt64, math.MaxInt64)
			if err == nil && (v < math.MinInt32 || v > math.MaxInt32 || !SupportedSchema(int(v))) {
				return &schemaVersionError{found: v}
			}
			e.SchemaVersion = int(v)
		case "rollout_id":
			e.RolloutID, err = s.readString()
			have.rollout = true
		case "model_call_id":
			e.ModelCallID, err = s.readString()
			have.call = true
		case "model":
			e.Model, err = s.readString()
		case "prompt_token_ids":
			e.PromptTokenIDs, err = readTokenArray(s, key)
			have.prompt = true
		case "generation_token_ids":
			e.GenerationTokenIDs, err = readTokenArray(s, key)
			have.gen = true
		case "generation_log_probs":
			e.GenerationLogProbs, err = readFloatArray(s, key)
			have.lp = true
		case "routed_experts":
			if !s.readNull() {
				var raw []byte
				raw, err = s.readRaw()
				e.RoutedExperts = compactRaw(raw)
			}
		case "output_items":
			e.OutputItems = nil
			err = s.array(func(i int) error {
				if s.peek() != '{' {
					return &FieldError{Field: key, Index: i, Msg: "expected an object, found " + s.describe()}
				}
				raw, err := s.readRaw()
				if err != nil {
					return fieldErr(key, i, err)
				}
				e.OutputItems = append(e.OutputItems, compactRaw(raw))
				return nil
			})
		case "token_item_index":
			e.TokenItemIndex, err = readOptInt(s)
		case "created_at":
			e.CreatedAt, err = s.readFloat()
		case "response_id", "parent_call_id", "cum_len", "digest", "parent_resolution", "continuation_fingerprint",
			"continuation_context_len", "continuation_context_digest", "parent_resolution_reason",
			"fingerprint_version", "prompt_is_delta":
			// Schema-3 fields: their meaning depends on schema_version,
			// which a sorted-key line states after most of them.
			var raw []byte
			raw, err = s.readRaw()
			lineage = append(lineage, rawField{key, raw})
		default:
			var raw []byte
			raw, err = s.readRaw()
			if err == nil {
				if e.Extra == nil {
					e.Extra = map[string]json.RawMessage{}
				}
				e.Extra[key] = compactRaw(raw)
			}
		}
		if err != nil {
			var fe *FieldError
			var sv *schemaVersionError
			if errors.As(err, &fe) || errors.As(err, &sv) {
				return err
			}
			return fieldErr(key, -1, err)
		}
		return nil
	})
	if err == nil {
		err = s.end()
	}
	if err != nil {
		var fe *FieldError
		var sv *schemaVersionError
		if errors.As(err, &fe) || errors.As(err, &sv) {
			return nil, err
		}
		return nil, &FieldError{Index: -1, Msg: err.Error()}
	}
	for _, f := range lineage {
		if e.SchemaVersion == TokenEntrySchemaV1 {
			// Gym main's schema-1 model keeps these as unknown extras.
			if e.Extra == nil {
				e.Extra = map[string]json.RawMessage{}
			}
			e.Extra[f.key] = compactRaw(f.raw)
			continue
		}
		if err := e.decodeLineageField(f.key, f.raw); err != nil {
			return nil, err
		}
	}
	for _, req := range []struct {
		ok   bool
		name string
	}{{have.rollout, "rollout_id"}, {have.call, "model_call_id"}, {have.prompt, "prompt_token_ids"},
		{have.gen, "generation_token_ids"}, {have.lp, "generation_log_probs"}} {
		if !req.ok {
			return nil, &FieldError{Field: req.name, Index: -1, Msg: "required field is missing"}
		}
	}
	if err := e.Validate(); err != nil {
		return nil, err
	}
	return e, nil
}

type rawField struct {
	key string
	raw []byte
}

// decodeLineageField decodes one schema-3 field of a schema-3 entry from
// its raw JSON value.
func (e *TokenEntry) decodeLineageField(key string, raw []byte) error {
	s := &scanner{data: raw}
	var err error
	switch key {
	case "response_id":
		e.ResponseID, err = readOptString(s)
	case "parent_call_id":
		e.ParentCallID, err = readOptString(s)
	case "cum_len":
		e.CumLen, err = readOptInt(s)
	case "digest":
		e.Digest, err = readOptString(s)
	case "parent_resolution":
		if !s.readNull() {
			var v string
			v, err = s.readString()
			if err == nil {
				switch pr := ParentResolution(v); pr {
				case ParentRoot, ParentResolved, ParentUnresolved:
					e.ParentResolution = &pr
				default:
					return &FieldError{Field: key, Index: -1,
						Msg: fmt.Sprintf("expected \"root\", \"resolved\", \"unresolved\" or null, found %q", v)}
				}
			}
		}
	case "continuation_fingerprint":
		e.ContinuationFingerprint, err = s.readString()
	case "continuation_context_len":
		var v int64
		v, err = s.readInt(math.MinInt, math.MaxInt)
		e.ContinuationContextLen = int(v)
	case "continuation_context_digest":
		e.ContinuationContextDigest, err = s.readString()
	case "parent_resolution_reason":
		e.ParentResolutionReason, err = s.readString()
	case "fingerprint_version":
		e.FingerprintVersion, err = readOptInt(s)
	case "prompt_is_delta":
		e.PromptIsDelta, err = s.readBool()
	}
	if err != nil {
		var fe *FieldError
		if errors.As(err, &fe) {
			return err
		}
		return fieldErr(key, -1, err)
	}
	return nil
}

// UnmarshalJSON is DecodeTokenEntry.
func (e *TokenEntry) UnmarshalJSON(b []byte) error {
	d, err := DecodeTokenEntry(b)
	if err != nil {
		return fmt.Errorf("gym: TokenEntry: %w", err)
	}
	*e = *d
	return nil
}

func compactRaw(raw []byte) json.RawMessage {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		// The scanner validated raw; Compact cannot fail on it.
		return append(json.RawMessage(nil), raw...)
	}
	return json.RawMessage(b.Bytes())
}

// arrayCapHint estimates the element count of the flat number array at the
// cursor (commas before the first ']'), bounded by the input length, so the
// hot arrays are allocated once.
func arrayCapHint(s *scanner) int {
	if s.peek() != '[' {
		return 0
	}
	rest := s.data[s.pos:]
	end := bytes.IndexByte(rest, ']')
	if end < 0 {
		return 0
	}
	return bytes.Count(rest[:end], []byte{','}) + 1
}

func readTokenArray(s *scanner, field string) ([]int32, error) {
	out := make([]int32, 0, arrayCapHint(s))
	err := s.array(func(i int) error {
		v, err := s.readInt(math.MinInt64, math.MaxInt64)
		if err != nil {
			return fieldErr(field, i, err)
		}
		if v < 0 {
			return &FieldError{Field: field, Index: i, Msg: fmt.Sprintf("token ids must be non-negative, found %d", v)}
		}
		if v > math.MaxInt32 {
			return &FieldError{Field: field, Index: i, Msg: fmt.Sprintf("token id %d does not fit int32", v)}
		}
		out = append(out, int32(v))
		return nil
	})
	return out, err
}

func readFloatArray(s *scanner, field string) ([]float64, error) {
	out := make([]float64, 0, arrayCapHint(s))
	err := s.array(func(i int) error {
		v, err := s.readFloat()
		if err != nil {
			return fieldErr(field, i, err)
		}
		out = append(out, v)
		return nil
	})
	return out, err
}

func readOptInt(s *scanner) (*int, error) {
	if s.readNull() {
		return nil, nil
	}
	v, err := s.readInt(math.MinInt, math.MaxInt)
	if err != nil {
		return nil, err
	}
	x := int(v)
	return &x, nil
}

func readOptString(s *scanner) (*string, error) {
	if s.readNull() {
		return nil, nil
	}
	v, err := s.readString()
	if err != nil {
		return nil, err
	}
	return &v, nil
}

// Validate checks the rules that do not depend on JSON types: version,
// token ranges, finite logprobs, equal generation lengths, the
// token_item_index range and, in schema 3, the
// parent_resolution/parent_call_id pairing. A schema-1 entry has none of
// the schema-3 fields set (they are Extra there).
func (e *TokenEntry) Validate() error {
	if !SupportedSchema(e.SchemaVersion) {
		return &schemaVersionError{found: int64(e.SchemaVersion)}
	}
	if e.SchemaVersion == TokenEntrySchemaV1 && e.hasLineage() {
		return &FieldError{Field: "schema_version", Index: -1,
			Msg: "a schema-1 entry carries no schema-3 fields (response_id, parent_call_id, cum_len, digest, parent_resolution, " +
				"continuation_*, parent_resolution_reason, fingerprint_version, prompt_is_delta)"}
	}
	for i, t := range e.PromptTokenIDs {
		if t < 0 {
			return &FieldError{Field: "prompt_token_ids", Index: i, Msg: fmt.Sprintf("token ids must be non-negative, found %d", t)}
		}
	}
	for i, t := range e.GenerationTokenIDs {
		if t < 0 {
			return &FieldError{Field: "generation_token_ids", Index: i, Msg: fmt.Sprintf("token ids must be non-negative, found %d", t)}
		}
	}
	for i, f := range e.GenerationLogProbs {
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return &FieldError{Field: "generation_log_probs", Index: i, Msg: fmt.Sprintf("expected a finite number, found %v", f)}
		}
	}
	if len(e.GenerationTokenIDs) != len(e.GenerationLogProbs) {
		return &FieldError{Field: "generation_log_probs", Index: -1, Msg: fmt.Sprintf(
			"generation_token_ids and generation_log_probs must have the same length (got %d and %d)",
			len(e.GenerationTokenIDs), len(e.GenerationLogProbs))}
	}
	if e.TokenItemIndex != nil && (*e.TokenItemIndex < 0 || *e.TokenItemIndex >= len(e.OutputItems)) {
		return &FieldError{Field: "token_item_index", Index: -1, Msg: fmt.Sprintf(
			"token_item_index %d is outside output_items of length %d", *e.TokenItemIndex, len(e.OutputItems))}
	}
	if math.IsNaN(e.CreatedAt) || math.IsInf(e.CreatedAt, 0) {
		return &FieldError{Field: "created_at", Index: -1, Msg: "expected a finite number"}
	}
	if e.ParentResolution != nil {
		switch *e.ParentResolution {
		case ParentResolved:
			if e.ParentCallID == nil || *e.ParentCallID == "" {
				return &FieldError{Field: "parent_call_id", Index: -1, Msg: "resolved parent metadata requires parent_call_id"}
			}
		case ParentRoot, ParentUnresolved:
			if e.ParentCallID != nil {
				return &FieldError{Field: "parent_call_id", Index: -1,
					Msg: fmt.Sprintf("%s parent metadata cannot carry parent_call_id", *e.ParentResolution)}
			}
		default:
			return &FieldError{Field: "parent_resolution", Index: -1, Msg: fmt.Sprintf("unknown value %q", *e.ParentResolution)}
		}
	}
	for k := range e.Extra {
		if e.knownField(k) {
			return &FieldError{Field: k, Index: -1, Msg: "a schema field may not be carried in Extra"}
		}
	}
	return nil
}

// hasLineage reports whether any schema-3 field is set.
func (e *TokenEntry) hasLineage() bool {
	return e.ResponseID != nil || e.ParentCallID != nil || e.CumLen != nil || e.Digest != nil ||
		e.ParentResolution != nil || e.ContinuationFingerprint != "" || e.ContinuationContextLen != 0 ||
		e.ContinuationContextDigest != "" || e.ParentResolutionReason != "" || e.FingerprintVersion != nil ||
		e.PromptIsDelta
}

// v1FieldNames are schema 1's fields, sorted: the keys of Gym main's
// TokenEntry.model_dump.
var v1FieldNames = []string{
	"created_at", "generation_log_probs", "generation_token_ids", "model", "model_call_id", "output_items",
	"prompt_token_ids", "rollout_id", "routed_experts", "schema_version", "token_item_index",
}

// fieldNames are the schema fields of the entry's version, sorted.
func (e *TokenEntry) fieldNames() []string {
	if e.SchemaVersion == TokenEntrySchemaV1 {
		return v1FieldNames
	}
	return entryFieldNames
}

func (e *TokenEntry) knownField(k string) bool {
	names := e.fieldNames()
	i := sort.SearchStrings(names, k)
	return i < len(names) && names[i] == k
}

var entryFieldNames = []string{
	"continuation_context_digest", "continuation_context_len", "continuation_fingerprint", "created_at",
	"cum_len", "digest", "fingerprint_version", "generation_log_probs", "generation_token_ids", "model",
	"model_call_id", "output_items", "parent_call_id", "parent_resolution", "parent_resolution_reason",
	"prompt_is_delta", "prompt_token_ids", "response_id", "rollout_id", "routed_experts", "schema_version",
	"token_item_index",
}

// AppendJSON appends the entry as one sorted-key JSON object (no newline),
// with every field of its schema present (null for unset optionals) and the
// Extra fields in their sorted places: the line format of Gym's file store
// (of Gym main's for a schema-1 entry).
func (e *TokenEntry) AppendJSON(dst []byte) []byte {
	names := e.fieldNames()
	keys := make([]string, 0, len(names)+len(e.Extra))
	keys = append(keys, names...)
	for k := range e.Extra {
		if !e.knownField(k) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	dst = append(dst, '{')
	for i, k := range keys {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendJSONString(dst, k)
		dst = append(dst, ':')
		dst = e.appendField(dst, k)
	}
	return append(dst, '}')
}

func (e *TokenEntry) appendField(dst []byte, k string) []byte {
	if !e.knownField(k) {
		return append(dst, e.Extra[k]...)
	}
	switch k {
	case "continuation_context_digest":
		return appendJSONString(dst, e.ContinuationContextDigest)
	case "continuation_context_len":
		return strconv.AppendInt(dst, int64(e.ContinuationContextLen), 10)
	case "continuation_fingerprint":
		return appendJSONString(dst, e.ContinuationFingerprint)
	case "created_at":
		return appendPyFloat(dst, e.CreatedAt)
	case "cum_len":
		return appendOptInt(dst, e.CumLen)
	case "digest":
		return appendOptString(dst, e.Digest)
	case "fingerprint_version":
		return appendOptInt(dst, e.FingerprintVersion)
	case "generation_log_probs":
		dst = append(dst, '[')
		for i, f := range e.GenerationLogProbs {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendPyFloat(dst, f)
		}
		return append(dst, ']')
	case "generation_token_ids":
		return appendTokens(dst, e.GenerationTokenIDs)
	case "model":
		return appendJSONString(dst, e.Model)
	case "model_call_id":
		return appendJSONString(dst, e.ModelCallID)
	case "output_items":
		dst = append(dst, '[')
		for i, it := range e.OutputItems {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, it...)
		}
		return append(dst, ']')
	case "parent_call_id":
		return appendOptString(dst, e.ParentCallID)
	case "parent_resolution":
		if e.ParentResolution == nil {
			return append(dst, "null"...)
		}
		return appendJSONString(dst, string(*e.ParentResolution))
	case "parent_resolution_reason":
		return appendJSONString(dst, e.ParentResolutionReason)
	case "prompt_is_delta":
		return strconv.AppendBool(dst, e.PromptIsDelta)
	case "prompt_token_ids":
		return appendTokens(dst, e.PromptTokenIDs)
	case "response_id":
		return appendOptString(dst, e.ResponseID)
	case "rollout_id":
		return appendJSONString(dst, e.RolloutID)
	case "routed_experts":
		if e.RoutedExperts == nil {
			return append(dst, "null"...)
		}
		return append(dst, e.RoutedExperts...)
	case "schema_version":
		return strconv.AppendInt(dst, int64(e.SchemaVersion), 10)
	case "token_item_index":
		return appendOptInt(dst, e.TokenItemIndex)
	}
	return append(dst, e.Extra[k]...)
}

func appendTokens(dst []byte, t []int32) []byte {
	dst = append(dst, '[')
	for i, v := range t {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendInt(dst, int64(v), 10)
	}
	return append(dst, ']')
}

func appendOptInt(dst []byte, p *int) []byte {
	if p == nil {
		return append(dst, "null"...)
	}
	return strconv.AppendInt(dst, int64(*p), 10)
}

func appendOptString(dst []byte, p *string) []byte {
	if p == nil {
		return append(dst, "null"...)
	}
	return appendJSONString(dst, *p)
}

// MarshalJSON encodes the entry as AppendJSON does.
func (e *TokenEntry) MarshalJSON() ([]byte, error) {
	if err := e.Validate(); err != nil {
		return nil, fmt.Errorf("gym: TokenEntry %s: %w", e.ModelCallID, err)
	}
	return e.AppendJSON(nil), nil
}

// Cumulative returns prompt ++ generation (a new slice).
func (e *TokenEntry) Cumulative() []int32 {
	out := make([]int32, 0, len(e.PromptTokenIDs)+len(e.GenerationTokenIDs))
	out = append(out, e.PromptTokenIDs...)
	return append(out, e.GenerationTokenIDs...)
}

// Stamp fills CumLen and Digest from the entry's own tokens, as Gym's
// stamp_lineage does.
func (e *TokenEntry) Stamp() {
	n := len(e.PromptTokenIDs) + len(e.GenerationTokenIDs)
	d, ok := digestOfConcat(e.PromptTokenIDs, e.GenerationTokenIDs)
	if !ok {
		panic("gym: Stamp: negative token id")
	}
	e.CumLen = &n
	e.Digest = &d
}

// sameRecordExceptCreatedAt reports whether two entries are the same record
// apart from created_at (the all_traces duplicate rule of spec §3.1).
func sameRecordExceptCreatedAt(a, b *TokenEntry) bool {
	x, y := *a, *b
	x.CreatedAt, y.CreatedAt = 0, 0
	if len(x.Extra) != len(y.Extra) {
		return false
	}
	for k, v := range x.Extra {
		w, ok := y.Extra[k]
		if !ok || !jsonValueEqual(v, w) {
			return false
		}
	}
	x.Extra, y.Extra = nil, nil
	return bytes.Equal(x.AppendJSON(nil), y.AppendJSON(nil))
}

// jsonValueEqual compares two JSON values semantically (object key order and
// white space do not matter; numbers compare by their decimal text).
func jsonValueEqual(a, b []byte) bool {
	if bytes.Equal(a, b) {
		return true
	}
	var x, y any
	da := json.NewDecoder(bytes.NewReader(a))
	da.UseNumber()
	db := json.NewDecoder(bytes.NewReader(b))
	db.UseNumber()
	if da.Decode(&x) != nil || db.Decode(&y) != nil {
		return false
	}
	ma, _ := json.Marshal(x)
	mb, _ := json.Marshal(y)
	return bytes.Equal(ma, mb)
}

// NewCallEntry returns the schema-3 TokenEntry of one served call, stamped
// with cum_len and digest as Gym's capture middleware writes it: an empty
// parentCallID makes a root (parent_resolution "root"), otherwise the call
// is "resolved" to that parent; an empty responseID leaves response_id null.
// The slices are not copied.
func NewCallEntry(rolloutID, modelCallID, model string, prompt, gen []int32, logprobs []float64, parentCallID, responseID string) *TokenEntry {
	e := &TokenEntry{SchemaVersion: TokenEntrySchemaVersion, RolloutID: rolloutID, ModelCallID: modelCallID, Model: model,
		PromptTokenIDs: prompt, GenerationTokenIDs: gen, GenerationLogProbs: logprobs}
	if parentCallID == "" {
		r := ParentRoot
		e.ParentResolution = &r
	} else {
		r, p := ParentResolved, parentCallID
		e.ParentResolution, e.ParentCallID = &r, &p
	}
	if responseID != "" {
		id := responseID
		e.ResponseID = &id
	}
	if _, ok := digestOfConcat(prompt, gen); ok {
		e.Stamp()
	}
	return e
}
