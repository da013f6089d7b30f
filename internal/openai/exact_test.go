package openai

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestUnmarshalMatchesKeysExactly decodes bodies with case variants and
// duplicates of request keys: each field is what Python's json module
// reads (exact keys, the last duplicate winning), where encoding/json
// alone would read another.
func TestUnmarshalMatchesKeysExactly(t *testing.T) {
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		name, body    string
		model         string
		content       string
		includeUsage  bool
		stream        bool
		stdDiffers    bool // encoding/json reads something else
		wantFastPath  bool
		wantMsgsCount int
	}{
		{name: "plain", body: `{"model":"m",` + msgs + `}`, model: "m", content: "hi", wantFastPath: true, wantMsgsCount: 1},
		{name: "variant after", body: `{"model":"m","Model":"evil",` + msgs + `}`, model: "m", content: "hi", stdDiffers: true, wantMsgsCount: 1},
		{name: "variant before", body: `{"MODEL":"evil","model":"m",` + msgs + `}`, model: "m", content: "hi", wantMsgsCount: 1},
		{name: "variant only", body: `{"Model":"evil",` + msgs + `}`, model: "", content: "hi", stdDiffers: true, wantMsgsCount: 1},
		{name: "duplicate", body: `{"model":"a","model":"b",` + msgs + `}`, model: "b", content: "hi", wantMsgsCount: 1},
		{name: "escaped duplicate", body: `{"model":"a","mod\u0065l":"b",` + msgs + `}`, model: "b", content: "hi", wantMsgsCount: 1},
		{name: "nested variant", body: `{"model":"m","messages":[{"role":"user","content":"good","Content":"evil"}]}`, model: "m", content: "good", stdDiffers: true, wantMsgsCount: 1},
		{name: "part variant", body: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"good","TEXT":"evil"}]}]}`, model: "m", content: "good", stdDiffers: true, wantMsgsCount: 1},
		{name: "duplicate object", body: `{"model":"m",` + msgs + `,"stream_options":{"include_usage":true},"stream_options":{}}`, model: "m", content: "hi", includeUsage: false, stdDiffers: true, wantMsgsCount: 1},
		{name: "duplicate messages", body: `{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}],` + msgs + `}`, model: "m", content: "hi", wantMsgsCount: 1},
		{name: "unicode fold", body: `{"model":"m",` + msgs + `,"ſtream":true}`, model: "m", content: "hi", stream: false, stdDiffers: true, wantMsgsCount: 1},
		{name: "keys in values", body: `{"model":"m","messages":[{"role":"user","content":"say \"Model\": \"x\", \\\"model\\\""}],"x":["model","Model"]}`, model: "m", content: `say "Model": "x", \"model\"`, wantFastPath: true, wantMsgsCount: 1},
		{name: "unknown keys", body: `{"model":"m",` + msgs + `,"tools":[{"type":"function","Name":"f"}],"Temperature":1}`, model: "m", content: "hi", wantFastPath: true, wantMsgsCount: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := !needsExact([]byte(c.body)); got != c.wantFastPath {
				t.Errorf("fast path %v, want %v", got, c.wantFastPath)
			}
			var r ChatCompletionRequest
			if err := Unmarshal([]byte(c.body), &r); err != nil {
				t.Fatal(err)
			}
			if len(r.Messages) != c.wantMsgsCount {
				t.Fatalf("%d messages, want %d", len(r.Messages), c.wantMsgsCount)
			}
			text, err := r.Messages[0].Content.PlainText()
			if err != nil {
				t.Fatal(err)
			}
			usage := r.StreamOptions != nil && r.StreamOptions.IncludeUsage
			if r.Model != c.model || text != c.content || usage != c.includeUsage || r.Stream != c.stream {
				t.Fatalf("model %q content %q include_usage %v stream %v; want %q %q %v %v", r.Model, text, usage, r.Stream, c.model, c.content, c.includeUsage, c.stream)
			}
			var std ChatCompletionRequest
			if err := json.Unmarshal([]byte(c.body), &std); err != nil {
				t.Fatal(err)
			}
			stdText, _ := std.Messages[0].Content.PlainText()
			stdUsage := std.StreamOptions != nil && std.StreamOptions.IncludeUsage
			if differs := std.Model != r.Model || stdText != text || stdUsage != usage || std.Stream != r.Stream; differs != c.stdDiffers {
				t.Errorf("encoding/json differs: %v, want %v (the case no longer shows what it names)", differs, c.stdDiffers)
			}
		})
	}
}

// TestUnmarshalCompletionAndErrors covers a completion's prompt under a
// variant key, and that malformed bodies and trailing data still fail on
// either path.
func TestUnmarshalCompletionAndErrors(t *testing.T) {
	var c CompletionRequest
	if err := Unmarshal([]byte(`{"model":"m","prompt":[1,2,3],"Prompt":"evil"}`), &c); err != nil {
		t.Fatal(err)
	}
	if !c.Prompt.IsTokens || len(c.Prompt.Tokens) != 3 || c.Model != "m" {
		t.Fatalf("prompt %+v model %q", c.Prompt, c.Model)
	}
	for _, body := range []string{`{"model":"m","Model":`, `{"model":"m"} {}`, `{"model":"m","Model":"x"} {}`, `[`} {
		var r ChatCompletionRequest
		if err := Unmarshal([]byte(body), &r); err == nil {
			t.Errorf("%s: no error", body)
		}
	}
	// A type error names the field, as from encoding/json.
	var r ChatCompletionRequest
	err := Unmarshal([]byte(`{"model":"m","Model":"x","max_tokens":"many"}`), &r)
	var te *json.UnmarshalTypeError
	if !asTypeError(err, &te) || !strings.Contains(te.Field, "max_tokens") {
		t.Fatalf("type error %v", err)
	}
}

func asTypeError(err error, te **json.UnmarshalTypeError) bool {
	t, ok := err.(*json.UnmarshalTypeError)
	*te = t
	return ok
}

// TestUnmarshalDeepNesting checks that a body nested past encoding/json's
// limit fails without the key scan keeping a frame per level.
func TestUnmarshalDeepNesting(t *testing.T) {
	body := `{"model":"m","x":` + strings.Repeat("[", 1<<20) + strings.Repeat("]", 1<<20) + `}`
	var r ChatCompletionRequest
	if err := Unmarshal([]byte(body), &r); err == nil {
		t.Fatal("a body nested a million deep decoded")
	}
}

// TestUnmarshalBoundsErrors decodes a number too large for max_tokens
// spelled in a hundred thousand digits: encoding/json quotes it whole,
// and the router echoes the error to the client; on either path the
// message stays short and the type error still names the field.
func TestUnmarshalBoundsErrors(t *testing.T) {
	digits := strings.Repeat("9", 100_000)
	for _, body := range []string{
		`{"model":"m","max_tokens":` + digits + `}`,
		`{"model":"m","Model":"x","max_tokens":` + digits + `}`,
	} {
		var r ChatCompletionRequest
		err := Unmarshal([]byte(body), &r)
		if err == nil {
			t.Fatal("a 100000-digit max_tokens decoded")
		}
		if n := len(err.Error()); n > maxErrorLen {
			t.Errorf("a %d-byte error message", n)
		}
		var te *json.UnmarshalTypeError
		if !errors.As(err, &te) || te.Field != "max_tokens" || len(te.Value) > maxErrorValue+len("...") {
			t.Errorf("type error %v (value of %d bytes)", err, len(te.Value))
		}
	}
}
