package openai

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// benchChatBody is a chat body of about size bytes: 64 messages of
// English-like text with some escapes, as a long agent session sends.
func benchChatBody(size int, extra string) []byte {
	var b strings.Builder
	b.WriteString(`{"model":"llama3-8b","stream":true,"stream_options":{"include_usage":true},` + extra + `"messages":[`)
	per := size / 64
	word := `prefix caches save \"prefill\" time\n `
	for i := range 64 {
		if i > 0 {
			b.WriteByte(',')
		}
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		fmt.Fprintf(&b, `{"role":%q,"content":"%s"}`, role, strings.Repeat(word, per/len(word)))
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// BenchmarkNeedsExact1MiB is the key scan alone on the same body.
func BenchmarkNeedsExact1MiB(b *testing.B) {
	body := benchChatBody(1<<20, "")
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if needsExact(body) {
			b.Fatal("a plain body needs the exact path")
		}
	}
}

// BenchmarkUnmarshalChat1MiB decodes a 1 MiB chat body with encoding/json
// (what the router did), with Unmarshal (exact keys: a key scan, then
// encoding/json) and with Unmarshal on a body with a "Model" variant (the
// generic-tree path), side by side.
func BenchmarkUnmarshalChat1MiB(b *testing.B) {
	plain, variant := benchChatBody(1<<20, ""), benchChatBody(1<<20, `"Model":"x",`)
	for _, c := range []struct {
		name string
		body []byte
		dec  func([]byte, any) error
	}{{"encoding-json", plain, json.Unmarshal}, {"exact", plain, Unmarshal}, {"exact-variant", variant, Unmarshal}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				var r ChatCompletionRequest
				if err := c.dec(c.body, &r); err != nil || len(r.Messages) != 64 {
					b.Fatal(err)
				}
			}
		})
	}
}
