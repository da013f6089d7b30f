package mpenc

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

// The expected bytes are the MessagePack specification's smallest forms
// (github.com/msgpack/msgpack/blob/master/spec.md), at each boundary.
func TestAppendSmallestForms(t *testing.T) {
	for _, c := range []struct {
		name string
		got  []byte
		want []byte
	}{
		{"nil", AppendNil(nil), []byte{0xc0}},
		{"true", AppendBool(nil, true), []byte{0xc3}},
		{"false", AppendBool(nil, false), []byte{0xc2}},
		{"fixarray 15", AppendArrayLen(nil, 15), []byte{0x9f}},
		{"array16", AppendArrayLen(nil, 16), []byte{0xdc, 0, 16}},
		{"array32", AppendArrayLen(nil, 1<<16), []byte{0xdd, 0, 1, 0, 0}},
		{"fixmap 15", AppendMapLen(nil, 15), []byte{0x8f}},
		{"map16", AppendMapLen(nil, 16), []byte{0xde, 0, 16}},
		{"map32", AppendMapLen(nil, 1<<16), []byte{0xdf, 0, 1, 0, 0}},
		{"fixstr", AppendStr(nil, "ab"), []byte{0xa2, 'a', 'b'}},
		{"str8", AppendStr(nil, strings.Repeat("x", 32))[:2], []byte{0xd9, 32}},
		{"str16", AppendStr(nil, strings.Repeat("x", 256))[:3], []byte{0xda, 1, 0}},
		{"str32", AppendStr(nil, strings.Repeat("x", 1<<16))[:5], []byte{0xdb, 0, 1, 0, 0}},
		{"opt empty", AppendOptStr(nil, ""), []byte{0xc0}},
		{"opt set", AppendOptStr(nil, "a"), []byte{0xa1, 'a'}},
		{"bin8", AppendBin(nil, []byte{1, 2}), []byte{0xc4, 2, 1, 2}},
		{"bin16", AppendBin(nil, make([]byte, 256))[:3], []byte{0xc5, 1, 0}},
		{"bin32", AppendBin(nil, make([]byte, 1<<16))[:5], []byte{0xc6, 0, 1, 0, 0}},
		{"positive fixint", AppendUint(nil, 0x7f), []byte{0x7f}},
		{"uint8", AppendUint(nil, 0x80), []byte{0xcc, 0x80}},
		{"uint16", AppendUint(nil, 0x100), []byte{0xcd, 1, 0}},
		{"uint32", AppendUint(nil, 1<<16), []byte{0xce, 0, 1, 0, 0}},
		{"uint64", AppendUint(nil, 1<<32), []byte{0xcf, 0, 0, 0, 1, 0, 0, 0, 0}},
		{"int non-negative", AppendInt(nil, 5), []byte{0x05}},
		{"negative fixint", AppendInt(nil, -32), []byte{0xe0}},
		{"int8", AppendInt(nil, -33), []byte{0xd0, 0xdf}},
		{"int16", AppendInt(nil, math.MinInt8-1), []byte{0xd1, 0xff, 0x7f}},
		{"int32", AppendInt(nil, math.MinInt16-1), []byte{0xd2, 0xff, 0xff, 0x7f, 0xff}},
		{"int64", AppendInt(nil, math.MinInt32-1), []byte{0xd3, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff}},
		{"float64", AppendFloat64(nil, 1.5), []byte{0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0}},
	} {
		if !bytes.Equal(c.got, c.want) {
			t.Errorf("%s: % x, want % x", c.name, c.got, c.want)
		}
	}
}

func TestAppendKeepsPrefix(t *testing.T) {
	got := AppendStr([]byte{0x01}, "a")
	if !bytes.Equal(got, []byte{0x01, 0xa1, 'a'}) {
		t.Fatalf("% x", got)
	}
}
