package costmodel

import (
	"math"
	"testing"
	"time"
)

// TestStepMillis checks mixed, empty and decode-bound steps.
func TestStepMillis(t *testing.T) {
	p := mustProfile(t, "llama3-8b")
	// A mixed step: 2,048-token chunk plus 32 decodes at 4k context. The
	// calibration measured 62.2 ms (eager) and 56.4 ms for the chunk alone.
	mixed := p.StepMillis([]Chunk{{New: 2048}}, 32, 32*4096)
	if math.Abs(mixed-62.17)/62.17 > 0.10 {
		t.Errorf("mixed step %.1f ms, want 62.2 ± 10%%", mixed)
	}
	if got := p.StepMillis(nil, 0, 0); got != 0 {
		t.Errorf("empty step %v", got)
	}
	if got := p.StepMillis([]Chunk{{New: 1}}, 10, 1000); got < p.Decode.Millis(10, 1000) {
		t.Errorf("mixed step with a tiny chunk %.2f ms is cheaper than the decode step", got)
	}
}

// TestStepCostMatchesStepMillis checks that accumulating a step chunk by
// chunk and decode by decode prices it exactly as StepMillis does.
func TestStepCostMatchesStepMillis(t *testing.T) {
	for _, name := range ProfileNames() {
		p := mustProfile(t, name)
		for _, tc := range []struct {
			chunks   []Chunk
			contexts []int
		}{
			{},
			{chunks: []Chunk{{New: 2048}}},
			{chunks: []Chunk{{New: 512, Prefix: 4096}, {New: 17, Prefix: 0}}},
			{contexts: []int{4096, 1, 33000}},
			{chunks: []Chunk{{New: 1}}, contexts: []int{100, 200, 300}},
			{chunks: []Chunk{{New: 904, Prefix: 4096}, {New: 2048, Prefix: 16}}, contexts: []int{5001}},
		} {
			sc := NewStepCost(&p)
			total := 0
			for _, c := range tc.chunks {
				sc.AddChunk(c.New, c.Prefix)
			}
			for _, ctx := range tc.contexts {
				sc.AddDecode(ctx)
				total += ctx
			}
			if got, want := sc.Millis(), p.StepMillis(tc.chunks, len(tc.contexts), total); got != want {
				t.Errorf("%s %+v: StepCost %v ms, StepMillis %v ms", name, tc, got, want)
			}
		}
	}
}

func TestMillisToDuration(t *testing.T) {
	for _, tc := range []struct {
		ms   float64
		want time.Duration
	}{
		{0, 0},
		{1, time.Millisecond},
		{13.5900004, 13590000 * time.Nanosecond},
		{0.0000006, time.Nanosecond},
		{0.0000004, 0},
	} {
		if got := MillisToDuration(tc.ms); got != tc.want {
			t.Errorf("MillisToDuration(%v) = %v, want %v", tc.ms, got, tc.want)
		}
	}
}
