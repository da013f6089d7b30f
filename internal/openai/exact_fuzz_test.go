package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

// exactReference decodes data into v the slow, obvious way: a generic
// tree (the last of duplicate keys wins), with every key that is not
// exactly the JSON name of a request field removed, then encoding/json.
// It does not fold names at all, so it shares no logic with needsExact
// and variant.
func exactReference(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data")
	}
	out, err := json.Marshal(keepExact(tree))
	if err != nil {
		return err
	}
	return json.Unmarshal(out, v)
}

func keepExact(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			if _, ok := requestKeys[k]; !ok {
				delete(t, k)
				continue
			}
			t[k] = keepExact(e)
		}
	case []any:
		for i, e := range t {
			t[i] = keepExact(e)
		}
	}
	return v
}

// probe is the router's chat-or-completion probe (explain.go).
type probe struct {
	Messages json.RawMessage `json:"messages"`
}

// FuzzUnmarshal decodes arbitrary bodies into every request type and
// checks that Unmarshal never panics, fails exactly when the exact-key
// reference fails, keeps its error messages short, decodes what the
// reference decodes, and that a decoded request re-encodes into a body
// that takes the fast path and decodes to the same request.
func FuzzUnmarshal(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","Model":"evil","messages":[{"role":"user","content":"hi"}]}`,
		`{"MODEL":"evil","model":"m","messages":[]}`,
		`{"model":"a","model":"b","messages":null}`,
		`{"model":"a","mod\u0065l":"b"}`,
		`{"model":"m","messages":[{"role":"user","content":"good","Content":"evil"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"good","TEXT":"evil"}]}]}`,
		`{"model":"m","stream_options":{"include_usage":true},"stream_options":{}}`,
		`{"model":"m","stream":true,"ſtream":false,"\u212aey":1}`,
		`{"model":"m","messages":[{"role":"user","content":"say \"Model\": \"x\", \\\"model\\\""}],"x":["model","Model"]}`,
		`{"model":"m","prompt":[1,2,3],"Prompt":"evil"}`,
		`{"model":"m","prompt":[[4,5]],"max_tokens":16,"n":2,"cache_salt":"s"}`,
		`{"model":"m","prompt":["text"],"stream":true,"stream_options":{"include_usage":false}}`,
		`{"model":"m","prompt":"p","add_generation_prompt":false}`,
		`{"model":"m","Model":"x","max_tokens":"many"}`,
		`{"model":"m","Model":"x","max_tokens":1e2}`,
		`{"model":"m","max_tokens":` + strings.Repeat("9", 2000) + `}`,
		`{"model":"m","Model":"x","max_tokens":` + strings.Repeat("9", 2000) + `}`,
		`{"model":"m","prompt":[` + strings.Repeat("1", 2000) + `]}`,
		`{"model":"m","Model":`,
		`{"model":"m"} {}`,
		`{"model":"m","Model":"x"} {}`,
		`{"model":"\xff\xfe","Model":"\xc0"}`,
		`[`, ``, `null`, `"model"`, `[{"Model":1}]`,
		`{"x":` + strings.Repeat("[", 64) + strings.Repeat("]", 64) + `,"Model":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkUnmarshal[ChatCompletionRequest](t, data, true)
		checkUnmarshal[CompletionRequest](t, data, true)
		checkUnmarshal[TokenizeRequest](t, data, true)
		checkUnmarshal[probe](t, data, false)
	})
}

// checkUnmarshal runs FuzzUnmarshal's checks for one request type; the
// round trip only when roundTrip (a RawMessage keeps the body's spelling).
func checkUnmarshal[T any](t *testing.T, data []byte, roundTrip bool) {
	t.Helper()
	var got, want T
	err := Unmarshal(data, &got)
	werr := exactReference(data, &want)
	if (err == nil) != (werr == nil) {
		t.Fatalf("%T: Unmarshal error %v, reference error %v", got, err, werr)
	}
	if err != nil {
		if n := len(err.Error()); n > maxErrorLen {
			t.Fatalf("%T: a %d-byte error message: %.200s...", got, n, err)
		}
		return
	}
	if !roundTrip {
		if p, w := any(got).(probe), any(want).(probe); (len(p.Messages) == 0) != (len(w.Messages) == 0) {
			t.Fatalf("probe messages %q, reference %q", p.Messages, w.Messages)
		}
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%T: Unmarshal decoded\n%+v\nthe exact-key reference\n%+v", got, got, want)
	}
	enc, err := json.Marshal(got)
	if err != nil {
		t.Fatalf("%T: re-encoding %+v: %v", got, got, err)
	}
	if needsExact(enc) {
		t.Fatalf("%T: encoding/json's output %s takes the exact path", got, enc)
	}
	var again T
	if err := Unmarshal(enc, &again); err != nil {
		t.Fatalf("%T: decoding the re-encoded %s: %v", got, enc, err)
	}
	if !reflect.DeepEqual(got, again) {
		t.Fatalf("%T: round trip through %s:\n%+v\nbecame\n%+v", got, enc, got, again)
	}
}

// caseFields are request fields FuzzUnmarshalKeyCase puts a decoy next to:
// the JSON name, and the body around the members of its object.
var caseFields = []struct {
	name, pre, post string
	read            func(r *ChatCompletionRequest) string
}{
	{"model", `{`, `,"messages":[{"role":"user","content":"c"}]}`,
		func(r *ChatCompletionRequest) string { return r.Model }},
	{"cache_salt", `{"model":"m",`, `,"messages":[{"role":"user","content":"c"}]}`,
		func(r *ChatCompletionRequest) string { return r.CacheSalt }},
	{"role", `{"model":"m","messages":[{"content":"c",`, `}]}`,
		func(r *ChatCompletionRequest) string { return r.Messages[0].Role }},
	{"content", `{"model":"m","messages":[{"role":"user",`, `}]}`,
		func(r *ChatCompletionRequest) string { return r.Messages[0].Content.Text }},
	{"text", `{"model":"m","messages":[{"role":"user","content":[{"type":"text",`, `}]}]}`,
		func(r *ChatCompletionRequest) string { return r.Messages[0].Content.Parts[0].Text }},
}

// caseVariant spells name with the letters whose bit is set in mask in
// upper case; with the bit of a letter's position plus 32 it takes the
// letter's non-ASCII fold instead where there is one (ſ for s, K for k).
func caseVariant(name string, mask uint64) string {
	var b strings.Builder
	for i, r := range name {
		switch {
		case i < 32 && mask>>(i+32)&1 != 0 && r == 's':
			b.WriteRune('ſ')
		case i < 32 && mask>>(i+32)&1 != 0 && r == 'k':
			b.WriteRune('\u212a')
		case i < 32 && mask>>i&1 != 0 && 'a' <= r && r <= 'z':
			b.WriteRune(r - 'a' + 'A')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// FuzzUnmarshalKeyCase puts a decoy member next to a request field, under
// a case variant of its name (or a fuzzed key), before or after it: the
// field must hold the decoy only when the decoy's key is exactly the
// field's name and comes last, as Python reads it.
func FuzzUnmarshalKeyCase(f *testing.F) {
	f.Add(uint8(0), uint64(1), "", "m", "evil", false)
	f.Add(uint8(0), uint64(0xff), "", "m", "evil", true)
	f.Add(uint8(0), uint64(0), "", "a", "b", false)
	f.Add(uint8(1), uint64(1<<32), "", "salt", "evil", true)
	f.Add(uint8(2), uint64(4), "", "user", "system", false)
	f.Add(uint8(3), uint64(2), "", "good", "evil", true)
	f.Add(uint8(4), uint64(1<<32|1<<35), "", "good", "evil", false)
	f.Add(uint8(0), uint64(0), "mod\\u0065l", "a", "b", false)
	f.Add(uint8(0), uint64(0), "MOD\\u0045L", "a", "b", false)
	f.Add(uint8(3), uint64(0), "con\\ntent", "a", "b", true)
	f.Fuzz(func(t *testing.T, field uint8, mask uint64, rawKey, value, decoy string, decoyFirst bool) {
		c := caseFields[int(field)%len(caseFields)]
		key := caseVariant(c.name, mask)
		quotedKey, _ := json.Marshal(key)
		if rawKey != "" {
			// A key as the body spells it, escapes included.
			quotedKey = []byte(`"` + rawKey + `"`)
			if err := json.Unmarshal(quotedKey, &key); err != nil {
				return // not a JSON string
			}
		}
		if _, ok := requestKeys[key]; ok && key != c.name {
			return // another field, perhaps of another type
		}
		qv, _ := json.Marshal(value)
		qd, _ := json.Marshal(decoy)
		real, fake := `"`+c.name+`":`+string(qv), string(quotedKey)+":"+string(qd)
		members := real + "," + fake
		if decoyFirst {
			members = fake + "," + real
		}
		body := c.pre + members + c.post
		var r ChatCompletionRequest
		if err := Unmarshal([]byte(body), &r); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		// Values come back as encoding/json reads them (invalid UTF-8
		// replaced).
		var wantValue string
		if key == c.name && !decoyFirst {
			_ = json.Unmarshal(qd, &wantValue)
		} else {
			_ = json.Unmarshal(qv, &wantValue)
		}
		if got := c.read(&r); got != wantValue {
			t.Fatalf("%s: %s is %q, want %q", body, c.name, got, wantValue)
		}
	})
}
