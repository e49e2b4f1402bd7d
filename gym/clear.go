package gym

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Clear deletes every capture file of a rollout, as Gym's
// clear_token_captures_for_rollouts does before a rollout id is dispatched
// again: a trainer that re-runs a step (after a resume) must not find the
// previous attempt's entries, intents or frozen state under the same key.
// A rollout with no files is not an error. Readers never call it.
func (w *Writer) Clear(rolloutID string) error {
	if err := ValidateRolloutID(rolloutID); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.state, rolloutID)
	removed := false
	for _, suffix := range []string{SuffixEntries, SuffixEntriesZst, SuffixIncomplete, SuffixIntents, SuffixState, SuffixLock} {
		err := w.fs.remove(filepath.Join(w.fs.root(), rolloutID+suffix))
		switch {
		case err == nil:
			removed = true
		case !errors.Is(err, os.ErrNotExist):
			return fmt.Errorf("gym: clear %s: %w", rolloutID, err)
		}
	}
	if removed && w.fsync {
		return w.syncDir()
	}
	return nil
}
