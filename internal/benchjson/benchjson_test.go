package benchjson

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestValidate(t *testing.T) {
	ok := func() *Results {
		r := New("index")
		r.Command = []string{"kvbench", "index"}
		r.Add(Figure{Name: "match_p99_us", Unit: "µs", Target: Max(30), Measured: 19.2})
		return r
	}
	if err := ok().Validate(); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(r *Results){
		"no tool":          func(r *Results) { r.Tool = "" },
		"no command":       func(r *Results) { r.Command = nil },
		"no figures":       func(r *Results) { r.Figures = nil },
		"twice":            func(r *Results) { r.Add(r.Figures[0]) },
		"no name":          func(r *Results) { r.Add(Figure{Unit: "s"}) },
		"target direction": func(r *Results) { r.Figures[0].Target.Direction = "below" },
		"no start time":    func(r *Results) { r.Started = time.Time{} },
	}
	for want, breakIt := range cases {
		r := ok()
		breakIt(r)
		if err := r.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err %v", want, err)
		}
	}
}

func TestTarget(t *testing.T) {
	if !Max(30).Met(30) || Max(30).Met(30.1) || !Min(200).Met(200) || Min(200).Met(176) {
		t.Fatal("Met")
	}
	if Max(1).Op() != "<=" || Min(1).Op() != ">=" {
		t.Fatal("Op")
	}
}

func TestRoundTrip(t *testing.T) {
	r := New("agent")
	r.Command = []string{"kvbench", "agent", "--skip-e2e"}
	r.Add(Figure{Name: "decode_hash_blocks_per_sec", Unit: "blocks/s", Target: Min(1e6), Measured: 1874926.9968638164, Note: "a < b & c"})
	if err := r.SetDetails(map[string]any{"method": "x -> y"}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "agent.json")
	if err := Write(path, r); err != nil {
		t.Fatal(err)
	}
	back, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := back.Validate(); err != nil {
		t.Fatal(err)
	}
	f, ok := back.Figure("decode_hash_blocks_per_sec")
	if !ok || f.Measured != 1874926.9968638164 || f.Target.Value != 1e6 || f.Note != "a < b & c" || !back.Started.Equal(r.Started) {
		t.Fatalf("read back %+v", back)
	}
	var d map[string]string
	if err := back.DecodeDetails(&d); err != nil || d["method"] != "x -> y" {
		t.Fatalf("details %v, %v", d, err)
	}
	if strings.Contains(string(back.Details), `\u003e`) {
		t.Fatalf("details HTML-escaped: %s", back.Details)
	}
}

type fakeMeasures struct{ v float64 }

func (m *fakeMeasures) Results(r *Results) error {
	r.Add(Figure{Name: "x", Unit: "s", Measured: m.v})
	return nil
}

func TestMeasure(t *testing.T) {
	r, err := Measure("fake", func() (*fakeMeasures, error) { return &fakeMeasures{v: 2}, nil })
	if err != nil || r.Tool != "fake" || r.Started.IsZero() || len(r.Figures) != 1 || r.Figures[0].Measured != 2 {
		t.Fatalf("results %+v, err %v", r, err)
	}
	failed := errors.New("no engine")
	if r, err := Measure("fake", func() (*fakeMeasures, error) { return nil, failed }); r != nil || !errors.Is(err, failed) {
		t.Fatalf("a failed run: results %+v, err %v", r, err)
	}
}
