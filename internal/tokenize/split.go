package tokenize

import (
	"unicode"
	"unicode/utf8"
)

// The pre-tokenizer splits text into the pieces that cl100k_base's pattern
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//	 ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// matches, with the semantics of tiktoken-go's backtracking engine (regexp2):
// \p{L} and \p{N} are Go's unicode.L and unicode.N, \s is unicode.IsSpace and
// case folding is unicode.ToLower. It is written by hand because Go's regexp
// has no look-ahead and regexp2 is slow.

// Character classes; a rune with no bit set is "other" ([^\s\p{L}\p{N}]).
const (
	clsLetter uint8 = 1 << iota
	clsNumber
	clsSpace
)

var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for r := rune(0); r < utf8.RuneSelf; r++ {
		t[r] = slowClass(r)
	}
	return t
}()

func slowClass(r rune) uint8 {
	switch {
	case unicode.IsLetter(r):
		return clsLetter
	case unicode.IsNumber(r):
		return clsNumber
	case unicode.IsSpace(r):
		return clsSpace
	}
	return 0
}

func classOf(r rune) uint8 {
	if r < utf8.RuneSelf {
		return asciiClass[r]
	}
	return slowClass(r)
}

// runeAt decodes the rune at s[i]; i < len(s).
func runeAt(s string, i int) (rune, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

func isNewline(r rune) bool { return r == '\r' || r == '\n' }

// nextPiece returns the end of the piece that starts at s[i]; i < len(s) and
// the result is > i.
func nextPiece(s string, i int) int {
	n := len(s)
	r0, w0 := runeAt(s, i)
	c0 := classOf(r0)

	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if r0 == '\'' && i+w0 < n {
		if k := contraction(s, i+w0); k > 0 {
			return i + w0 + k
		}
	}
	switch c0 {
	case clsLetter: // [^\r\n\p{L}\p{N}]?\p{L}+ without the prefix
		return scanLetters(s, i+w0)
	case clsNumber: // \p{N}{1,3}
		j := i + w0
		for k := 1; k < 3 && j < n; k++ {
			r, w := runeAt(s, j)
			if classOf(r) != clsNumber {
				break
			}
			j += w
		}
		return j
	}
	// [^\r\n\p{L}\p{N}]\p{L}+: r0 is white space or other here.
	if !isNewline(r0) && i+w0 < n {
		if r1, _ := runeAt(s, i+w0); classOf(r1) == clsLetter {
			return scanLetters(s, i+w0)
		}
	}
	// ` ?[^\s\p{L}\p{N}]+[\r\n]*`
	j := i
	if r0 == ' ' {
		j = i + 1
	}
	k := j
	for k < n {
		r, w := runeAt(s, k)
		if classOf(r) != 0 {
			break
		}
		k += w
	}
	if k > j {
		for k < n && (s[k] == '\r' || s[k] == '\n') {
			k++
		}
		return k
	}
	// r0 is white space. \s*[\r\n]+ ends after the last newline of the run.
	lastNL, last := -1, i
	k = i
	for k < n {
		r, w := runeAt(s, k)
		if classOf(r) != clsSpace {
			break
		}
		if isNewline(r) {
			lastNL = k
		}
		last = k
		k += w
	}
	switch {
	case lastNL >= 0:
		return lastNL + 1
	case k == n: // \s+(?!\S) at the end of the text
		return k
	case last > i: // \s+(?!\S): leave the last space for the next word
		return last
	default: // \s+
		return k
	}
}

// contraction returns the length of s/t/re/ve/m/ll/d (any case) at s[j], or 0.
func contraction(s string, j int) int {
	r1, w1 := runeAt(s, j)
	var want rune
	switch unicode.ToLower(r1) {
	case 's', 't', 'm', 'd':
		return w1
	case 'r', 'v':
		want = 'e'
	case 'l':
		want = 'l'
	default:
		return 0
	}
	if j+w1 >= len(s) {
		return 0
	}
	if r2, w2 := runeAt(s, j+w1); unicode.ToLower(r2) == want {
		return w1 + w2
	}
	return 0
}

// scanLetters returns the end of the run of letters starting at s[j].
func scanLetters(s string, j int) int {
	for j < len(s) {
		r, w := runeAt(s, j)
		if classOf(r) != clsLetter {
			break
		}
		j += w
	}
	return j
}
