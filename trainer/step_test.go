package trainer

import (
	"testing"

	"github.com/tracegrpo/tracegrpo/grpo"
)

func TestAdvantageStats(t *testing.T) {
	logical := []grpo.LogicalRollout{
		{TaskGroup: 1, Reward: 1}, {TaskGroup: 1, Reward: 1}, // flat: no signal
		{TaskGroup: 2, Reward: 0}, {TaskGroup: 2, Reward: 1}, // varied
		{TaskGroup: 3, Reward: 0.5}, {TaskGroup: 3, Reward: 9}, // the second is invalid: group 3 is flat
	}
	b := &grpo.Batch{}
	b.Metrics.LogicalValid = []bool{true, true, true, true, true, false}
	b.Advantages.Advantage = []float64{0, 0, -0.5, 0.5, 0, 7}
	var m Metrics
	advantageStats(&m, logical, b)
	if m.ZeroSignalGroups != Num(2.0/3) {
		t.Errorf("zero-signal groups %v, want 2/3", m.ZeroSignalGroups)
	}
	if m.AdvantageMin != -0.5 || m.AdvantageMax != 0.5 || m.AdvantageAbsMean != 0.2 {
		t.Errorf("advantage min %v max %v |mean| %v, want -0.5 0.5 0.2 (the invalid rollout's 7 excluded)",
			m.AdvantageMin, m.AdvantageMax, m.AdvantageAbsMean)
	}
}
