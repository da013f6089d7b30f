package costmodel

import (
	"errors"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
)

func TestProfileByName(t *testing.T) {
	for _, name := range ProfileNames() {
		p, err := ProfileByName(name)
		if err != nil || p.Name != name {
			t.Fatalf("ProfileByName(%q) = %+v, %v", name, p, err)
		}
		if err := p.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ProfileByName("gpt-5"); !errors.Is(err, ErrUnknownProfile) {
		t.Fatalf("unknown profile: %v", err)
	}
}

// TestDecodeFit checks the decode model against the graph_ms decode rows of
// h200_batch.json (as tabulated in the calibration README).
func TestDecodeFit(t *testing.T) {
	rows := []struct{ batch, ctx int }{{1, 4096}, {8, 4096}, {32, 4096}, {64, 4096}, {128, 2048}, {32, 16384}, {8, 32768}}
	measured := map[string][]float64{
		"llama3-8b":  {5.3, 6.6, 9.8, 13.8, 14.3, 21.1, 13.2},
		"llama3-70b": {38.8, 41.6, 49.0, 59.3, 64.1, 77.1, 58.2},
	}
	for name, ms := range measured {
		p := mustProfile(t, name)
		worst := 0.0
		for i, r := range rows {
			got := p.Decode.Millis(r.batch, r.batch*r.ctx)
			worst = max(worst, math.Abs(got-ms[i])/ms[i])
		}
		if worst > 0.035 {
			t.Errorf("%s: worst decode error %.1f%%", name, worst*100)
		}
		t.Logf("%s: worst decode error vs README table %.1f%%", name, worst*100)
	}
}

func TestLoadProfile(t *testing.T) {
	f, err := os.Open("testdata/profile_valid.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := LoadProfile(f)
	if err != nil {
		t.Fatal(err)
	}
	want := mustProfile(t, "llama3-8b")
	want.Name = "llama3-8b-example"
	if !reflect.DeepEqual(p, want) {
		t.Fatalf("loaded %+v, want %+v", p, want)
	}
}

func TestLoadProfileErrors(t *testing.T) {
	file := func(name string) string {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	valid := file("profile_valid.json")
	for _, tc := range []struct {
		name, in, want string
	}{
		{"empty", "", "decode profile"},
		{"not json", "name: x", "decode profile"},
		{"array", "[]", "decode profile"},
		{"missing", file("profile_missing.json"), "missing fields [decode prefill.d_ms_per_prefix_token]"},
		{"unknown field", file("profile_unknown_field.json"), `unknown field "per_ctx_token_ms"`},
		{"trailing", valid + "{}", "trailing data"},
		{"negative", strings.Replace(valid, `"a_ms": 3.21`, `"a_ms": -1`, 1), "prefill.a_ms = -1"},
		{"zero floor", strings.Replace(valid, `"floor_ms": 5.34`, `"floor_ms": 0`, 1), "decode.floor_ms must be > 0"},
		{"zero kv", strings.Replace(valid, `131072`, `0`, 1), "kv_bytes_per_token must be > 0"},
		{"empty name", strings.Replace(valid, `"llama3-8b-example"`, `""`, 1), "name is empty"},
		{"string coefficient", strings.Replace(valid, `3.21`, `"3.21"`, 1), "decode profile"},
		{"huge", valid + strings.Repeat(" ", maxProfileBytes), "larger than"},
		{"overflow", strings.Replace(valid, `3.21`, `1e999`, 1), "decode profile"},
	} {
		_, err := LoadProfile(strings.NewReader(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to contain %q", tc.name, err, tc.want)
		}
	}
	if err := (Profile{Name: "x", Decode: DecodeModel{Floor: 1}, KVBytesPerToken: 1}).Validate(); err == nil {
		t.Error("zero prefill accepted")
	}
	if err := (Profile{Name: "x", Prefill: PrefillModel{A: math.NaN()}}).Validate(); err == nil {
		t.Error("NaN accepted")
	}
}

func TestDefaultProfileIsBuiltIn(t *testing.T) {
	p, err := ProfileByName(DefaultProfileName)
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != DefaultProfileName {
		t.Fatalf("default profile named %q", p.Name)
	}
}

func TestResolveProfile(t *testing.T) {
	p, err := ResolveProfile("llama3-70b")
	if err != nil || p.Name != "llama3-70b" {
		t.Fatalf("built-in: %+v, %v", p, err)
	}
	p, err = ResolveProfile("testdata/profile_valid.json")
	if err != nil || p.Name != "llama3-8b-example" {
		t.Fatalf("file: %+v, %v", p, err)
	}
	if _, err := ResolveProfile("gpt-9"); err == nil || !strings.Contains(err.Error(), "neither a built-in profile") {
		t.Fatalf("unknown name: %v", err)
	}
	if _, err := ResolveProfile("testdata/profile_missing.json"); err == nil || !strings.Contains(err.Error(), "testdata/profile_missing.json") {
		t.Fatalf("bad file: %v", err)
	}
}

func mustProfile(t testing.TB, name string) Profile {
	t.Helper()
	p, err := ProfileByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
