package gym

import (
	"errors"
	"fmt"
	"math"
	"strconv"
)

// ErrNoCorrelationKey is returned for a rollout record that carries neither
// _ng_rollout_id nor both _ng_task_index and _ng_rollout_index.
var ErrNoCorrelationKey = errors.New("gym: no capture correlation key (_ng_rollout_id, or _ng_task_index and _ng_rollout_index)")

// CorrelationKeys are the correlation fields of a run body or result (spec
// §2.7). A nil pointer is an absent (or null) field.
type CorrelationKeys struct {
	RolloutID    *string
	TaskIndex    *int64
	RolloutIndex *int64
	AttemptIndex *int64
}

// Key derives the capture key: the explicit id if present (it must
// match ^[A-Za-z0-9][A-Za-z0-9._-]*$ and is never sanitized), else
// "{task}-{rollout}"; then "-a{attempt}" when attempt > 0, explicit ids
// included. Without an explicit id and with either index missing it returns
// ErrNoCorrelationKey. Negative indices are malformed (ErrBadRolloutID).
func (k CorrelationKeys) Key() (string, error) {
	var id string
	switch {
	case k.RolloutID != nil:
		if err := ValidateRolloutID(*k.RolloutID); err != nil {
			return "", fmt.Errorf("field %s: %w", KeyRolloutID, err)
		}
		id = *k.RolloutID
	case k.TaskIndex != nil && k.RolloutIndex != nil:
		if *k.TaskIndex < 0 || *k.RolloutIndex < 0 {
			return "", fmt.Errorf("fields %s/%s: %w: negative index %d-%d", KeyTaskIndex, KeyRolloutIndex,
				ErrBadRolloutID, *k.TaskIndex, *k.RolloutIndex)
		}
		id = strconv.FormatInt(*k.TaskIndex, 10) + "-" + strconv.FormatInt(*k.RolloutIndex, 10)
	default:
		return "", ErrNoCorrelationKey
	}
	if k.AttemptIndex != nil {
		if *k.AttemptIndex < 0 {
			return "", fmt.Errorf("field %s: %w: negative attempt %d", KeyAttemptIndex, ErrBadRolloutID, *k.AttemptIndex)
		}
		if *k.AttemptIndex > 0 {
			id += "-a" + strconv.FormatInt(*k.AttemptIndex, 10)
		}
	}
	return id, nil
}

// CorrelationKeysFromRecord reads the correlation fields type-exactly: the
// id must be a string, the indices JSON integers (null counts as absent).
func CorrelationKeysFromRecord(r *Record) (CorrelationKeys, error) {
	var k CorrelationKeys
	id, ok, err := r.stringField(KeyRolloutID)
	if err != nil {
		return k, err
	}
	if ok {
		k.RolloutID = &id
	}
	for _, f := range []struct {
		key string
		dst **int64
	}{{KeyTaskIndex, &k.TaskIndex}, {KeyRolloutIndex, &k.RolloutIndex}, {KeyAttemptIndex, &k.AttemptIndex}} {
		raw, present := r.vals[f.key]
		if !present {
			continue
		}
		s := &scanner{data: raw}
		if s.readNull() {
			continue
		}
		v, err := s.readInt(math.MinInt64, math.MaxInt64)
		if err != nil {
			return k, r.errf(f.key, err)
		}
		*f.dst = &v
	}
	return k, nil
}

// RolloutIDFromRecord is the capture key of a rollout record. A missing key
// (ErrNoCorrelationKey) or a malformed one (ErrBadRolloutID) is an error
// naming the record's file and line.
func RolloutIDFromRecord(r *Record) (string, error) {
	k, err := CorrelationKeysFromRecord(r)
	if err != nil {
		return "", err
	}
	id, err := k.Key()
	if err != nil {
		return "", &RecordError{File: r.File, Line: r.Line, Err: err}
	}
	return id, nil
}
