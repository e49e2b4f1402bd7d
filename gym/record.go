package gym

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
)

// Record keys this package reads or writes on a Gym rollout record.
const (
	KeyTrainingTraces   = "training_traces"
	KeyMaskSample       = "mask_sample"
	KeyTokenCapture     = "_ng_token_capture"
	KeyReward           = "reward"
	KeyInstanceConfig   = "instance_config"
	KeyRolloutID        = "_ng_rollout_id"
	KeyTaskIndex        = "_ng_task_index"
	KeyRolloutIndex     = "_ng_rollout_index"
	KeyAttemptIndex     = "_ng_attempt_index"
	KeyTerminalCallID   = "_ng_terminal_model_call_id"
	KeyTerminalResponse = "terminal_response_id"
	KeyResponse         = "response"
)

// maxRecordLine bounds one rollout record line.
const maxRecordLine = 1 << 30

// Record is one rollout record (one JSON object) from Gym's rollout
// collection. Fields keep their order and their exact bytes; Set appends a
// new field at the end or replaces one in place, so re-encoding preserves
// every field this package does not touch.
type Record struct {
	// File and Line locate the record for error messages ("" and 0 if unknown).
	File string
	Line int
	keys []string
	vals map[string]json.RawMessage
}

// RecordError is a problem with one field of a rollout record.
type RecordError struct {
	File  string
	Line  int
	Field string
	Err   error
}

func (e *RecordError) Error() string {
	loc := e.File
	if loc == "" {
		loc = "<record>"
	}
	if e.Field == "" {
		return fmt.Sprintf("%s:%d: %v", loc, e.Line, e.Err)
	}
	return fmt.Sprintf("%s:%d: field %s: %v", loc, e.Line, e.Field, e.Err)
}

func (e *RecordError) Unwrap() error { return e.Err }

func (r *Record) errf(field string, err error) error {
	return &RecordError{File: r.File, Line: r.Line, Field: field, Err: err}
}

// ParseRecord parses one rollout record. It must be a JSON object without
// duplicate keys.
func ParseRecord(line []byte) (*Record, error) {
	r := &Record{vals: map[string]json.RawMessage{}}
	s := &scanner{data: line}
	err := s.object(func(key string) error {
		if _, dup := r.vals[key]; dup {
			return &FieldError{Field: key, Index: -1, Msg: "duplicate key"}
		}
		raw, err := s.readRaw()
		if err != nil {
			return fieldErr(key, -1, err)
		}
		r.keys = append(r.keys, key)
		r.vals[key] = raw
		return nil
	})
	if err == nil {
		err = s.end()
	}
	if err != nil {
		var fe *FieldError
		if errors.As(err, &fe) {
			return nil, &RecordError{Field: fe.Field, Err: errors.New(fe.Msg)}
		}
		return nil, &RecordError{Err: fmt.Errorf("a rollout record must be one JSON object: %w", err)}
	}
	return r, nil
}

// Keys returns the field names in order.
func (r *Record) Keys() []string { return append([]string(nil), r.keys...) }

// Get returns a field's raw JSON.
func (r *Record) Get(key string) (json.RawMessage, bool) {
	v, ok := r.vals[key]
	return v, ok
}

// Set replaces a field in place or appends it. v must be valid JSON.
func (r *Record) Set(key string, v json.RawMessage) {
	if _, ok := r.vals[key]; !ok {
		r.keys = append(r.keys, key)
	}
	r.vals[key] = v
}

// Delete removes a field.
func (r *Record) Delete(key string) {
	if _, ok := r.vals[key]; !ok {
		return
	}
	delete(r.vals, key)
	for i, k := range r.keys {
		if k == key {
			r.keys = append(r.keys[:i], r.keys[i+1:]...)
			break
		}
	}
}

// AppendJSON appends the record as one JSON object (no newline).
func (r *Record) AppendJSON(dst []byte) []byte {
	dst = append(dst, '{')
	for i, k := range r.keys {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendJSONString(dst, k)
		dst = append(dst, ':')
		dst = append(dst, r.vals[k]...)
	}
	return append(dst, '}')
}

// MarshalJSON encodes the record.
func (r *Record) MarshalJSON() ([]byte, error) { return r.AppendJSON(nil), nil }

// Where is "file:line" for messages.
func (r *Record) Where() string { return fmt.Sprintf("%s:%d", r.File, r.Line) }

// Reward returns the finite numeric reward field.
func (r *Record) Reward() (float64, error) {
	raw, ok := r.vals[KeyReward]
	if !ok {
		return 0, r.errf(KeyReward, errors.New("required field is missing"))
	}
	s := &scanner{data: raw}
	f, err := s.readFloat()
	if err != nil {
		return 0, r.errf(KeyReward, err)
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, r.errf(KeyReward, errors.New("must be finite"))
	}
	return f, nil
}

func (r *Record) optBool(raw json.RawMessage, field string) (bool, error) {
	s := &scanner{data: raw}
	if s.readNull() {
		return false, nil
	}
	v, err := s.readBool()
	if err != nil {
		return false, r.errf(field, err)
	}
	return v, nil
}

// MaskSample is the top-level mask_sample (false when absent or null).
func (r *Record) MaskSample() (bool, error) {
	raw, ok := r.vals[KeyMaskSample]
	if !ok {
		return false, nil
	}
	return r.optBool(raw, KeyMaskSample)
}

// InstanceMaskSample is instance_config.mask_sample, the environment's flag
// (false when absent or null).
func (r *Record) InstanceMaskSample() (bool, error) {
	raw, ok := r.vals[KeyInstanceConfig]
	if !ok {
		return false, nil
	}
	s := &scanner{data: raw}
	if s.readNull() {
		return false, nil
	}
	var found json.RawMessage
	err := s.object(func(key string) error {
		v, err := s.readRaw()
		if key == "mask_sample" {
			found = v
		}
		return err
	})
	if err != nil {
		return false, r.errf(KeyInstanceConfig, err)
	}
	if found == nil {
		return false, nil
	}
	return r.optBool(found, KeyInstanceConfig+".mask_sample")
}

// TrainingTraces decodes and validates an attached envelope. ok is false
// when the record has none (absent or null).
func (r *Record) TrainingTraces() (b *TrainingTraceBatch, ok bool, err error) {
	raw, present := r.vals[KeyTrainingTraces]
	if !present || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil, false, nil
	}
	b, err = DecodeTrainingTraces(raw)
	if err != nil {
		return nil, true, r.errf(KeyTrainingTraces, err)
	}
	return b, true, nil
}

// stringField returns a string field; ok is false when absent or null.
func (r *Record) stringField(key string) (string, bool, error) {
	raw, present := r.vals[key]
	if !present {
		return "", false, nil
	}
	s := &scanner{data: raw}
	if s.readNull() {
		return "", false, nil
	}
	v, err := s.readString()
	if err != nil {
		return "", false, r.errf(key, err)
	}
	return v, true, nil
}

// RecordReader streams rollout records from JSONL, one in memory at a time.
// Blank lines are skipped.
type RecordReader struct {
	name   string
	br     *bufio.Reader
	line   int
	offset int64
}

// NewRecordReader reads records from r; name is used in errors.
func NewRecordReader(r io.Reader, name string) *RecordReader {
	return &RecordReader{name: name, br: bufio.NewReaderSize(r, 1<<20)}
}

// Offset is the byte offset just past the last record returned.
func (rr *RecordReader) Offset() int64 { return rr.offset }

// Next returns the next record, or io.EOF.
func (rr *RecordReader) Next() (*Record, error) {
	for {
		line, err := rr.readLine()
		if err != nil {
			return nil, err
		}
		rr.line++
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		rec, perr := ParseRecord(line)
		if perr != nil {
			var re *RecordError
			if errors.As(perr, &re) {
				re.File, re.Line = rr.name, rr.line
				return nil, re
			}
			return nil, &RecordError{File: rr.name, Line: rr.line, Err: perr}
		}
		rec.File, rec.Line = rr.name, rr.line
		return rec, nil
	}
}

func (rr *RecordReader) readLine() ([]byte, error) {
	var buf []byte
	for {
		chunk, err := rr.br.ReadSlice('\n')
		buf = append(buf, chunk...)
		if len(buf) > maxRecordLine {
			return nil, &RecordError{File: rr.name, Line: rr.line + 1, Err: fmt.Errorf("line longer than %d bytes", maxRecordLine)}
		}
		switch {
		case err == nil:
			rr.offset += int64(len(buf))
			return buf, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			if len(buf) == 0 {
				return nil, io.EOF
			}
			rr.offset += int64(len(buf))
			return buf, nil
		default:
			return nil, fmt.Errorf("gym: read %s: %w", rr.name, err)
		}
	}
}
