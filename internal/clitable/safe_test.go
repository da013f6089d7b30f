package clitable

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestEscape checks that control and bidirectional formatting characters
// and invalid UTF-8 come out as visible escapes and the rest unchanged.
func TestEscape(t *testing.T) {
	cases := map[string]string{
		"plain id-7":           "plain id-7",
		"é ü 漢字":               "é ü 漢字",
		"a\x1b[31mb":           `a\u001b[31mb`,
		"a\u009b2J":            `a\u009b2J`,
		"a\x7f":                `a\u007f`,
		"a\u202eb\u2066":       `a\u202eb\u2066`,
		"bad\xffutf8":          `bad\xffutf8`,
		"nl\nand\ttab\rcr\x07": `nl\u000aand\u0009tab\u000dcr\u0007`,
	}
	for in, want := range cases {
		if got := Escape(in, nil); got != want {
			t.Errorf("Escape(%q) = %q, want %q", in, got, want)
		}
	}
	var buf bytes.Buffer
	w := SafeWriter(&buf)
	if _, err := w.Write([]byte("line \x1b]0;title\x07 one\n\tindented\r\n")); err != nil {
		t.Fatal(err)
	}
	if got, want := buf.String(), "line \\u001b]0;title\\u0007 one\n\tindented\\u000d\n"; got != want {
		t.Errorf("SafeWriter wrote %q, want %q", got, want)
	}
}

// TestTableEscapesCells checks that a cell's escape sequence is escaped
// and its newline cannot add a row.
func TestTableEscapesCells(t *testing.T) {
	tab := NewTab("ID", "N")
	tab.Add("w\x1b[2J\nx", 1)
	var buf bytes.Buffer
	if _, err := tab.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	if got := buf.String(); strings.Count(got, "\n") != 2 || !strings.Contains(got, `w\u001b[2J x`) || strings.ContainsRune(got, 0x1b) {
		t.Fatalf("table:\n%q", got)
	}
}

// TestWriteNonFiniteAndControls writes a document with NaN and infinite
// Floats and control characters in strings: JSON and YAML encode it, the
// numbers as null, the strings escaped but decoding to the same text.
func TestWriteNonFiniteAndControls(t *testing.T) {
	type row struct {
		ID    string `json:"id"`
		Usage Float  `json:"usage"`
		Ptr   *Float `json:"ptr"`
	}
	inf := Float(math.Inf(1))
	doc := []row{{"a\x1b[1m\u009b\u202e\u0085", Float(math.NaN()), &inf}, {"b", 0.25, nil}}
	for _, f := range []Format{JSON, YAML} {
		var buf bytes.Buffer
		if err := Write(&buf, f, doc, nil); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if hasUnsafe(buf.Bytes()) {
			t.Fatalf("%s has raw control characters:\n%q", f, buf.String())
		}
		b := buf.Bytes()
		if f == YAML {
			var err error
			if b, err = yaml.YAMLToJSON(b); err != nil {
				t.Fatalf("yaml: %v\n%s", err, buf.String())
			}
		}
		var got []map[string]any
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%s: %v\n%s", f, err, buf.String())
		}
		if got[0]["id"] != doc[0].ID || got[0]["usage"] != nil || got[0]["ptr"] != nil || got[1]["usage"] != 0.25 {
			t.Fatalf("%s decodes to %v", f, got)
		}
	}
	if Percent(math.NaN(), 1) != "-" || Percent(math.Inf(1), 1) != "-" || Millis(math.NaN()) != "-" {
		t.Fatalf("Percent and Millis of non-finite values: %q %q %q", Percent(math.NaN(), 1), Percent(math.Inf(1), 1), Millis(math.NaN()))
	}
}
