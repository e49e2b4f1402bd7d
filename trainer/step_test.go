package trainer

import (
	"testing"
)

func TestAdvantageStats(t *testing.T) {
	// Two ranks' shares: group 2 is split only to show that stats are over
	// every rank (groups never split in a real step).
	shards := []shard{{
		Groups:    []int64{1, 1, 2},
		Rewards:   []float64{1, 1, 0}, // group 1 flat: no signal
		Valid:     []bool{true, true, true},
		Advantage: []float64{0, 0, -0.5},
	}, {
		Groups:    []int64{2, 3, 3},
		Rewards:   []float64{1, 0.5, 9}, // group 2 varied; group 3's second is invalid: flat
		Valid:     []bool{true, true, false},
		Advantage: []float64{0.5, 0, 7},
	}}
	var m Metrics
	advantageStats(&m, shards)
	if m.ZeroSignalGroups != Num(2.0/3) {
		t.Errorf("zero-signal groups %v, want 2/3", m.ZeroSignalGroups)
	}
	if m.AdvantageMin != -0.5 || m.AdvantageMax != 0.5 || m.AdvantageAbsMean != 0.2 {
		t.Errorf("advantage min %v max %v |mean| %v, want -0.5 0.5 0.2 (the invalid rollout's 7 excluded)",
			m.AdvantageMin, m.AdvantageMax, m.AdvantageAbsMean)
	}
}
