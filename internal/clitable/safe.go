package clitable

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Float is a float64 that encodes as null in JSON (and YAML) when it is
// NaN or infinite, which encoding/json refuses: one bad value (a load a
// worker reported) must not break a command's whole document. Views use it
// for every number that comes from elsewhere.
type Float float64

// MarshalJSON writes f, or null when f is not finite.
func (f Float) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, v, 'g', -1, 64), nil
}

// unsafeRune reports whether r must not reach a terminal as it is: a
// control character (C0, DEL, C1: ANSI escape sequences start with ESC or
// CSI) or a bidirectional formatting character (which reorders what
// follows on the line).
func unsafeRune(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r)
}

// needsEscape reports whether s has a byte that may start an unsafe rune
// or is not valid UTF-8.
func needsEscape(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f || c >= 0x80 {
			return true
		}
	}
	return false
}

// Escape returns s with every control character and bidirectional
// formatting character written as a \uXXXX escape (ESC as \u001b, CSI as
// \u009b: the same in Go, JSON and Python), and every byte that is not
// UTF-8 as \xNN, so that text from the
// directory (a worker id, an address) cannot move the cursor, recolour or
// clear an operator's terminal. Characters for which keep reports true
// pass (nil: none).
func Escape(s string, keep func(rune) bool) string {
	if !needsEscape(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unsafeRune(r) && (keep == nil || !keep(r)):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// layout keeps the characters plain text is laid out with.
func layout(r rune) bool { return r == '\n' || r == '\t' }

// SafeWriter returns a writer that passes text to w with the control
// characters of Escape escaped, but newlines and tabs: for a command's
// output and its errors. In a JSON document (or JSON log lines) the
// escapes are JSON's own, so the document means the same. Each Write is
// escaped on its own (a write that splits a UTF-8 character shows its
// bytes as \xNN).
func SafeWriter(w io.Writer) io.Writer { return safeWriter{w} }

type safeWriter struct{ w io.Writer }

func (s safeWriter) Write(p []byte) (int, error) {
	if !needsEscape(string(p)) {
		return s.w.Write(p)
	}
	if _, err := io.WriteString(s.w, Escape(string(p), layout)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// hasUnsafe reports whether b has a rune Escape would escape but newline,
// tab and carriage return.
func hasUnsafe(b []byte) bool {
	if !needsEscape(string(b)) {
		return false
	}
	for _, r := range string(b) {
		if r != '\n' && r != '\t' && r != '\r' && (r == utf8.RuneError || unsafeRune(r)) {
			return true
		}
	}
	return false
}

// jsonSafe escapes in a JSON document (valid UTF-8, from encoding/json or
// checked by json.Indent) the characters encoding/json leaves raw that a
// terminal acts on: DEL, C1 controls and bidirectional formatting
// characters, as \uXXXX. They can only be inside strings, where the
// escape means the same character, so the document is unchanged.
func jsonSafe(b []byte) []byte {
	if !needsEscape(string(b)) {
		return b
	}
	var out bytes.Buffer
	out.Grow(len(b))
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r != '\n' && r != '\t' && r != '\r' && unsafeRune(r) {
			fmt.Fprintf(&out, `\u%04x`, r)
		} else {
			out.Write(b[i : i+size])
		}
		i += size
	}
	return out.Bytes()
}

// JSONSafe is jsonSafe for a document kvdirctl passes on as it is (the
// router's explain answer).
func JSONSafe(b []byte) []byte { return jsonSafe(b) }
