package gym

import (
	"errors"
	"testing"
)

func TestClearLetsARolloutBeRecordedAgain(t *testing.T) {
	dir := t.TempDir()
	w, err := NewWriter(dir)
	if err != nil {
		t.Fatal(err)
	}
	rid := "step000003-0-1"
	e := &TokenEntry{SchemaVersion: 3, RolloutID: rid, ModelCallID: "c1",
		PromptTokenIDs: []int32{1, 2}, GenerationTokenIDs: []int32{3}, GenerationLogProbs: []float64{-0.5}}
	if err := w.BeginCall(rid, "c1"); err != nil {
		t.Fatal(err)
	}
	if err := w.Put(e); err != nil {
		t.Fatal(err)
	}
	if err := w.Freeze(rid); err != nil {
		t.Fatal(err)
	}
	e2 := *e
	e2.GenerationLogProbs = []float64{-0.25}
	if err := w.Put(&e2); !errors.Is(err, ErrFrozen) {
		t.Fatalf("Put after Freeze: %v, want ErrFrozen", err)
	}
	if err := w.Clear(rid); err != nil {
		t.Fatal(err)
	}
	// A fresh writer and reader see nothing of the cleared attempt.
	r, _ := NewReader(dir)
	snap, err := r.Snapshot(rid)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Entries) != 0 || snap.Incomplete {
		t.Fatalf("after Clear: %d entries, incomplete %v", len(snap.Entries), snap.Incomplete)
	}
	if err := w.BeginCall(rid, "c1"); err != nil {
		t.Fatal(err)
	}
	if err := w.Put(&e2); err != nil {
		t.Fatalf("Put of a new payload after Clear: %v", err)
	}
	snap, err = w.Snapshot(rid)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Entries) != 1 || snap.Entries[0].GenerationLogProbs[0] != -0.25 {
		t.Fatalf("after re-recording: %+v", snap.Entries)
	}
	if err := w.Clear("../etc"); !errors.Is(err, ErrBadRolloutID) {
		t.Fatalf("Clear of a traversing id: %v", err)
	}
	if err := w.Clear("never-recorded"); err != nil {
		t.Fatalf("Clear of an unknown rollout: %v", err)
	}
}
