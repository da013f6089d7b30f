package node

import "testing"

// A group waits to fill only while it is small and other groups keep Raft
// busy; alone in flight, or at minGroupBatches, it is proposed at once.
func TestKeepFilling(t *testing.T) {
	cases := []struct {
		n, inFlight int
		want        bool
	}{
		{1, 1, false},
		{1, 2, true},
		{minGroupBatches - 1, maxGroupsInFlight, true},
		{minGroupBatches, maxGroupsInFlight, false},
		{minGroupBatches - 1, 1, false},
	}
	for _, c := range cases {
		if got := keepFilling(c.n, c.inFlight); got != c.want {
			t.Errorf("keepFilling(%d batches, %d groups in flight) = %v, want %v", c.n, c.inFlight, got, c.want)
		}
	}
}
