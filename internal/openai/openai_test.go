package openai

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"testing"
)

func TestPromptUnmarshal(t *testing.T) {
	good := []struct {
		in     string
		text   string
		tokens []uint32
	}{
		{`"hello"`, "hello", nil},
		{`["hello"]`, "hello", nil},
		{`[1, 2, 3]`, "", []uint32{1, 2, 3}},
		{`[[4, 5]]`, "", []uint32{4, 5}},
		{`[]`, "", []uint32{}},
	}
	for _, c := range good {
		var p Prompt
		if err := json.Unmarshal([]byte(c.in), &p); err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if !p.Set || p.Text != c.text || p.IsTokens != (c.tokens != nil) || !slices.Equal(p.Tokens, c.tokens) {
			t.Fatalf("%s: got %+v", c.in, p)
		}
	}
	for _, in := range []string{`{"a":1}`, `["a","b"]`, `[1,"a"]`, `[-1]`, `[1.5]`, `[4294967296]`, `[[1],[2]]`, `[["a"]]`, `true`} {
		var p Prompt
		if err := json.Unmarshal([]byte(in), &p); !errors.Is(err, ErrBadPrompt) {
			t.Errorf("%s: err %v, want ErrBadPrompt", in, err)
		}
	}
	var req CompletionRequest
	if err := json.Unmarshal([]byte(`{"prompt":null,"extra":{"x":1}}`), &req); err != nil || req.Prompt.Set {
		t.Fatalf("null prompt: %+v %v", req, err)
	}
}

// TestPromptMarshal checks that a decoded prompt encodes back to a body
// that decodes to the same Prompt, in each of its forms.
func TestPromptMarshal(t *testing.T) {
	for _, in := range []string{`null`, `"hello"`, `""`, `["hello"]`, `[1, 2, 3]`, `[[4, 5]]`, `[]`} {
		var p, again Prompt
		if err := json.Unmarshal([]byte(in), &p); err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		out, err := json.Marshal(p)
		if err != nil {
			t.Fatalf("%s: marshal: %v", in, err)
		}
		if err := json.Unmarshal(out, &again); err != nil || !reflect.DeepEqual(p, again) {
			t.Fatalf("%s: encoded as %s, decoded back to %+v (%v), want %+v", in, out, again, err, p)
		}
	}
}
