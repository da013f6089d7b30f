// Package tokenize turns OpenAI-style prompts into token ids, identically in the
// router and in the engine simulator, so that the block hashes both compute
// agree.
//
// It provides a cl100k_base byte-pair encoder whose ranks come from the
// tiktoken-go-loader module (embedded in the binary, never downloaded), a
// ChatML chat template with explicit special tokens, and a per-session cache
// that makes rendering a conversation incremental: turn N tokenizes only the
// messages that are new since turn N-1.
//
// The encoder reproduces tiktoken's cl100k_base exactly (the tests check it
// against github.com/pkoukk/tiktoken-go on random and adversarial text) but
// uses its own pre-tokenizer and a heap-based merge, so its cost stays close
// to linear in the input: tiktoken-go's merge is quadratic in the length of a
// single pre-tokenized piece, which a long run of letters or whitespace makes
// a denial-of-service vector.
package tokenize

import (
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"

	loader "github.com/pkoukk/tiktoken-go-loader"
)

// Tokenizer maps text to token ids and back. Implementations are safe for
// concurrent use.
type Tokenizer interface {
	// Encode returns the ids of text encoded as ordinary text: special-token
	// strings in text are never turned into special ids.
	Encode(text string) []uint32
	// Decode returns the text of ids; ids the tokenizer does not know are
	// skipped.
	Decode(ids []uint32) string
	// Name names the encoding, e.g. "cl100k_base".
	Name() string
	// VocabSize is one more than the largest id the tokenizer knows.
	VocabSize() int
}

// Special-token strings and ids of the ChatML template over cl100k_base.
//
// tiktoken-go's cl100k_base defines only <|endoftext|> (100257), the three
// FIM tokens (100258-100260) and <|endofprompt|> (100276). The ChatML ids are
// the ones OpenAI's "cl100k_im" extension of cl100k_base uses (tiktoken's
// README), which fall in the unused gap above the BPE ranks (0-100255).
const (
	IMStart   = "<|im_start|>"
	IMEnd     = "<|im_end|>"
	IMStartID = uint32(100264)
	IMEndID   = uint32(100265)
)

// cl100k_base constants: the asset name inside tiktoken-go-loader, the number
// of BPE ranks and tiktoken's own special tokens.
const (
	cl100kAsset = "cl100k_base.tiktoken"
	cl100kRanks = 100256
)

var cl100kSpecials = map[string]uint32{
	"<|endoftext|>":   100257,
	"<|fim_prefix|>":  100258,
	"<|fim_middle|>":  100259,
	"<|fim_suffix|>":  100260,
	IMStart:           IMStartID,
	IMEnd:             IMEndID,
	"<|endofprompt|>": 100276,
}

// ErrBadRanks reports that the embedded BPE rank file is not what the
// encoder expects.
var ErrBadRanks = errors.New("tokenize: invalid BPE ranks")

// BPE is a byte-pair encoder with tiktoken semantics. It is immutable and
// safe for concurrent use.
type BPE struct {
	name     string
	table    *rankTable // ordinary tokens for encoding, all tokens for decoding
	specials map[string]uint32
}

var (
	cl100kOnce sync.Once
	cl100kBPE  *BPE
	cl100kErr  error
)

// CL100K returns the cl100k_base encoder with the ChatML special tokens
// (IMStartID, IMEndID) added for decoding. The first call parses the ranks
// embedded by tiktoken-go-loader (about 0.1 s, ~20 MB of garbage, ~2.5 MB
// kept);
// later calls return the same encoder. Call it at start-up to keep that cost
// off the first request.
func CL100K() (*BPE, error) {
	cl100kOnce.Do(func() {
		cl100kBPE, cl100kErr = loadCL100K()
	})
	return cl100kBPE, cl100kErr
}

func loadCL100K() (*BPE, error) {
	ranks, err := loader.NewOfflineLoader().LoadTiktokenBpe(cl100kAsset)
	if err != nil {
		return nil, fmt.Errorf("tokenize: load %s: %w", cl100kAsset, err)
	}
	b, err := newBPE("cl100k_base", ranks, cl100kRanks, cl100kSpecials)
	if err != nil {
		return nil, fmt.Errorf("tokenize: load %s: %w", cl100kAsset, err)
	}
	return b, nil
}

// newBPE checks that ranks are exactly 0..nRanks-1, that every single byte is
// a token (so any input can be encoded) and that specials do not collide
// with ranks.
func newBPE(name string, ranks map[string]int, nRanks int, specials map[string]uint32) (*BPE, error) {
	if len(ranks) != nRanks {
		return nil, fmt.Errorf("%w: %d ranks, want %d", ErrBadRanks, len(ranks), nRanks)
	}
	vocab := nRanks
	for _, id := range specials {
		if int(id) < nRanks {
			return nil, fmt.Errorf("%w: special id %d inside the rank range", ErrBadRanks, id)
		}
		vocab = max(vocab, int(id)+1)
	}
	tokens := make([]string, vocab)
	ordinary := make([]bool, vocab)
	for tok, r := range ranks {
		if r < 0 || r >= nRanks || ordinary[r] || tok == "" {
			return nil, fmt.Errorf("%w: bad or duplicate rank %d", ErrBadRanks, r)
		}
		ordinary[r] = true
		tokens[r] = tok
	}
	for b := 0; b < 256; b++ {
		if _, ok := ranks[string([]byte{byte(b)})]; !ok {
			return nil, fmt.Errorf("%w: byte %#x has no token", ErrBadRanks, b)
		}
	}
	sp := make(map[string]uint32, len(specials))
	for s, id := range specials {
		if tokens[id] != "" {
			return nil, fmt.Errorf("%w: special id %d used twice", ErrBadRanks, id)
		}
		tokens[id] = s
		sp[s] = id
	}
	return &BPE{name: name, table: newRankTable(tokens, ordinary), specials: sp}, nil
}

// Name returns the encoding's name, "cl100k_base" for CL100K.
func (b *BPE) Name() string { return b.name }

// VocabSize returns one more than the largest known id (100277 for CL100K,
// as in tiktoken). Some ids below it are unused (100256, 100261-100263,
// 100266-100275).
func (b *BPE) VocabSize() int { return b.table.size() }

// SpecialID returns the id of a special-token string such as IMStart.
func (b *BPE) SpecialID(token string) (uint32, bool) {
	id, ok := b.specials[token]
	return id, ok
}

// Encode encodes text as ordinary text (see AppendEncode).
func (b *BPE) Encode(text string) []uint32 {
	return b.AppendEncode(make([]uint32, 0, len(text)/4+1), text)
}

// AppendEncode appends the ids of text to dst and returns the extended slice.
// Special-token strings are encoded as ordinary text. Invalid UTF-8 is first
// replaced rune by rune with U+FFFD, as tiktoken-go does.
func (b *BPE) AppendEncode(dst []uint32, text string) []uint32 {
	if !utf8.ValidString(text) {
		text = string([]rune(text))
	}
	var sc mergeScratch
	for i := 0; i < len(text); {
		j := nextPiece(text, i)
		if j <= i { // cannot happen; guarantees progress on any input
			j = i + 1
		}
		dst = b.appendPiece(dst, text[i:j], &sc)
		i = j
	}
	return dst
}

// Decode concatenates the bytes of ids, special tokens included as their
// strings; unknown ids are skipped. The result is not valid UTF-8 when ids
// split a multi-byte character.
func (b *BPE) Decode(ids []uint32) string {
	n := 0
	for _, id := range ids {
		if int64(id) < int64(b.table.size()) {
			n += len(b.table.token(id))
		}
	}
	buf := make([]byte, 0, n)
	for _, id := range ids {
		if int64(id) < int64(b.table.size()) {
			buf = append(buf, b.table.token(id)...)
		}
	}
	return string(buf)
}

var _ Tokenizer = (*BPE)(nil)
