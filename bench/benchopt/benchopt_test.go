package benchopt

import (
	"math"
	"testing"
	"time"
)

func TestDefault(t *testing.T) {
	for _, c := range []struct{ v, want int }{{0, 7}, {-1, 7}, {3, 3}} {
		v := c.v
		if Default(&v, 7); v != c.want {
			t.Errorf("Default(%d, 7) = %d, want %d", c.v, v, c.want)
		}
	}
	d := -time.Second
	if Default(&d, time.Minute); d != time.Minute {
		t.Errorf("duration: %v", d)
	}
	f := math.NaN()
	if Default(&f, 1); !math.IsNaN(f) {
		t.Errorf("NaN became %v", f)
	}
}
