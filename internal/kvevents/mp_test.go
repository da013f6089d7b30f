package kvevents

import (
	"encoding/binary"
	"encoding/hex"
	"math"
	"strings"
	"testing"
)

// This file holds a deliberately tiny msgpack writer, independent of the
// package's encoder, for building test fixtures. Every helper returns the
// bytes of one item; cat joins them.

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// hx decodes hex with optional spaces.
func hx(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

func mArr(n int) []byte {
	if n < 16 {
		return []byte{0x90 | byte(n)}
	}
	if n < 1<<16 {
		return []byte{0xdc, byte(n >> 8), byte(n)}
	}
	return []byte{0xdd, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
}

func mMap(n int) []byte {
	if n < 16 {
		return []byte{0x80 | byte(n)}
	}
	return []byte{0xde, byte(n >> 8), byte(n)}
}

func mStr(s string) []byte {
	switch {
	case len(s) < 32:
		return append([]byte{0xa0 | byte(len(s))}, s...)
	case len(s) < 256:
		return append([]byte{0xd9, byte(len(s))}, s...)
	case len(s) < 1<<16:
		return append([]byte{0xda, byte(len(s) >> 8), byte(len(s))}, s...)
	}
	return append([]byte{0xdb, byte(len(s) >> 24), byte(len(s) >> 16), byte(len(s) >> 8), byte(len(s))}, s...)
}

func mNil() []byte { return []byte{0xc0} }

func mBin(b []byte) []byte { return append([]byte{0xc4, byte(len(b))}, b...) }

// mU writes the smallest unsigned form.
func mU(v uint64) []byte {
	switch {
	case v < 128:
		return []byte{byte(v)}
	case v < 256:
		return []byte{0xcc, byte(v)}
	case v < 1<<16:
		return []byte{0xcd, byte(v >> 8), byte(v)}
	case v < 1<<32:
		return []byte{0xce, byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
	}
	return binary.BigEndian.AppendUint64([]byte{0xcf}, v)
}

// mI writes the smallest form of a negative value (or defers to mU).
func mI(v int64) []byte {
	switch {
	case v >= 0:
		return mU(uint64(v))
	case v >= -32:
		return []byte{byte(v)}
	case v >= -128:
		return []byte{0xd0, byte(v)}
	case v >= -32768:
		return []byte{0xd1, byte(v >> 8), byte(v)}
	case v >= math.MinInt32:
		return []byte{0xd2, byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
	}
	return binary.BigEndian.AppendUint64([]byte{0xd3}, uint64(v))
}

func mF64(f float64) []byte {
	return binary.BigEndian.AppendUint64([]byte{0xcb}, math.Float64bits(f))
}

// mTokens writes an array of tokens.
func mTokens(toks ...uint64) []byte {
	out := mArr(len(toks))
	for _, t := range toks {
		out = append(out, mU(t)...)
	}
	return out
}

func seqTokens(n int, base uint64) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = base + uint64(i)
	}
	return out
}

func u32s(v []uint64) []uint32 {
	out := make([]uint32, len(v))
	for i, x := range v {
		out[i] = uint32(x)
	}
	return out
}

func ptr[T any](v T) *T { return &v }
