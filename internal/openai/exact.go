package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"unicode/utf8"

	"github.com/kvdir/kvdir/internal/tokenize"
)

// Unmarshal decodes a request body into v as the Python engines' json
// module reads it: object keys match field names exactly (encoding/json
// also accepts "Model" or "MODEL" for "model") and, of duplicate keys, the
// last one wins (encoding/json merges a duplicate object into the first).
// A router that read another "model" or "messages" than the engine would
// place the request by a prompt the engine never sees.
//
// Bodies whose keys already decode the same both ways, almost all of
// them, take encoding/json after one scan of their keys; only a body
// with a case variant or a duplicate of a request field's name is
// decoded through a generic tree, with those variants dropped, and
// re-encoded (a few times slower, still linear in its size).
//
// Errors are encoding/json's, with the JSON value a type error quotes cut
// short (see boundError).
func Unmarshal(data []byte, v any) error {
	return boundError(unmarshal(data, v))
}

func unmarshal(data []byte, v any) error {
	if !needsExact(data) {
		return json.Unmarshal(data, v)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		// What json.Unmarshal reports for trailing data.
		return json.Unmarshal(data, v)
	}
	out, err := json.Marshal(dropVariants(tree))
	if err != nil {
		return fmt.Errorf("openai: re-encoding the request: %w", err)
	}
	return json.Unmarshal(out, v)
}

// Bounds of an Unmarshal error's message: callers send it back to the
// client and log it, and encoding/json quotes a number it cannot store
// whole, so a body of a million digits would come back whole.
const (
	maxErrorValue = 64   // bytes of the value a type error quotes
	maxErrorLen   = 1024 // bytes of the whole message
)

// boundError cuts the value an *json.UnmarshalTypeError in err quotes to
// maxErrorValue bytes and, should the message still be longer than
// maxErrorLen, wraps err in one that is not (errors.As still finds the
// type error, with its Field and Type).
func boundError(err error) error {
	if err == nil {
		return nil
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && len(te.Value) > maxErrorValue {
		te.Value = cut(te.Value, maxErrorValue)
	}
	if len(err.Error()) > maxErrorLen {
		return &boundedError{err: err}
	}
	return err
}

// cut shortens s to at most n bytes, on a rune boundary, and marks the cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

// boundedError is an error whose message is too long, cut short.
type boundedError struct{ err error }

func (e *boundedError) Error() string { return cut(e.err.Error(), maxErrorLen-len("...")) }
func (e *boundedError) Unwrap() error { return e.err }

// requestKeys are the JSON names of every field the request types decode
// (derived from their tags), by index: at most 64, for needsExact's masks.
var requestKeys = func() map[string]int {
	keys := map[string]int{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return
		}
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				continue
			}
			if _, ok := keys[name]; !ok {
				keys[name] = len(keys)
			}
			walk(f.Type)
		}
	}
	for _, v := range []any{ChatCompletionRequest{}, CompletionRequest{}, TokenizeRequest{}, tokenize.ContentPart{},
		struct {
			Messages json.RawMessage `json:"messages"` // the router's chat-or-completion probe
		}{}} {
		walk(reflect.TypeOf(v))
	}
	if len(keys) > 64 {
		panic("openai: more than 64 request keys") // a programming error, caught by any test
	}
	return keys
}()

// firstBytes flags the lower-case first bytes of requestKeys; a key whose
// first byte is ASCII and folds to none of them is no variant of one.
var firstBytes = func() (b [128]bool) {
	for k := range requestKeys {
		b[k[0]] = true
	}
	return b
}()

// variant reports whether key (unescaped) is not a request key but
// encoding/json would match it to one (bytes.EqualFold, which is how it
// folds names).
func variant(key []byte) bool {
	if _, ok := requestKeys[string(key)]; ok || len(key) == 0 {
		return false
	}
	if c := key[0]; c < utf8.RuneSelf {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if !firstBytes[c] {
			return false
		}
	}
	for k := range requestKeys {
		if bytes.EqualFold(key, []byte(k)) {
			return true
		}
	}
	return false
}

// maxDepth is encoding/json's nesting limit: past it, it refuses the
// document, so needsExact need not track deeper.
const maxDepth = 10000

// needsExact reports whether data has an object key that encoding/json
// would read differently from Python: a case variant of a request key, or
// a request key given twice in one object. It only scans (json.Unmarshal
// validates); on malformed input it may answer either way.
func needsExact(data []byte) bool {
	var stack []uint64 // per open container: seen request keys; ^0 for an array
	const array = ^uint64(0)
	expectKey := false
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '{', '[':
			if len(stack) >= maxDepth {
				return false // json.Unmarshal refuses it
			}
			if data[i] == '{' {
				stack = append(stack, 0)
			} else {
				stack = append(stack, array)
			}
			expectKey = data[i] == '{'
		case '}', ']':
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
			expectKey = false
		case ',':
			expectKey = len(stack) > 0 && stack[len(stack)-1] != array
		case ':':
			expectKey = false
		case '"':
			end := stringEnd(data, i+1)
			if end < 0 {
				return false
			}
			if expectKey && len(stack) > 0 {
				key := data[i+1 : end]
				if bytes.IndexByte(key, '\\') >= 0 {
					var s string
					if json.Unmarshal(data[i:end+1], &s) != nil {
						return false
					}
					key = []byte(s)
				}
				if idx, ok := requestKeys[string(key)]; ok {
					top := &stack[len(stack)-1]
					if *top&(1<<idx) != 0 {
						return true // a duplicate
					}
					*top |= 1 << idx
				} else if variant(key) {
					return true
				}
			}
			expectKey = false
			i = end
		}
	}
	return false
}

// stringEnd returns the index of the quote closing the string whose
// contents start at data[from], or -1.
func stringEnd(data []byte, from int) int {
	for j := from; j < len(data); j++ {
		k := bytes.IndexByte(data[j:], '"')
		if k < 0 {
			return -1
		}
		j += k
		n := 0 // backslashes right before it: an odd count escapes it
		for p := j - 1; p >= from && data[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return j
		}
	}
	return -1
}

// dropVariants removes, in every object of a decoded tree, the keys that
// are case variants of request keys: Python ignores them as unknown
// fields, and encoding/json would read them as the field.
func dropVariants(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			if variant([]byte(k)) {
				delete(t, k)
				continue
			}
			t[k] = dropVariants(e)
		}
	case []any:
		for i, e := range t {
			t[i] = dropVariants(e)
		}
	}
	return v
}
