// Package mpenc appends MessagePack values to a byte slice, each in its
// smallest form, as msgspec and Python's msgpack write them. Encoders that
// must match those libraries byte for byte (vLLM's and SGLang's KV-cache
// events) build on it; decoding lives with each format.
package mpenc

import (
	"encoding/binary"
	"math"
)

// AppendNil appends nil.
func AppendNil(dst []byte) []byte { return append(dst, 0xc0) }

// AppendBool appends b.
func AppendBool(dst []byte, b bool) []byte {
	if b {
		return append(dst, 0xc3)
	}
	return append(dst, 0xc2)
}

// AppendArrayLen appends the header of an array of n items.
func AppendArrayLen(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xdc), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(dst, 0xdd), uint32(n))
	}
}

// AppendMapLen appends the header of a map of n pairs.
func AppendMapLen(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x80|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xde), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(dst, 0xdf), uint32(n))
	}
}

// AppendStr appends s as a str.
func AppendStr(dst []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		dst = append(dst, 0xa0|byte(n))
	case n <= math.MaxUint8:
		dst = append(dst, 0xd9, byte(n))
	case n <= math.MaxUint16:
		dst = binary.BigEndian.AppendUint16(append(dst, 0xda), uint16(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, 0xdb), uint32(n))
	}
	return append(dst, s...)
}

// AppendOptStr appends s, or nil when s is empty (Python's None).
func AppendOptStr(dst []byte, s string) []byte {
	if s == "" {
		return AppendNil(dst)
	}
	return AppendStr(dst, s)
}

// AppendBin appends b as bin.
func AppendBin(dst []byte, b []byte) []byte {
	n := len(b)
	switch {
	case n <= math.MaxUint8:
		dst = append(dst, 0xc4, byte(n))
	case n <= math.MaxUint16:
		dst = binary.BigEndian.AppendUint16(append(dst, 0xc5), uint16(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, 0xc6), uint32(n))
	}
	return append(dst, b...)
}

// AppendUint appends u in its smallest unsigned form, as msgspec does for
// a non-negative Python int.
func AppendUint(dst []byte, u uint64) []byte {
	switch {
	case u <= 0x7f:
		return append(dst, byte(u))
	case u <= math.MaxUint8:
		return append(dst, 0xcc, byte(u))
	case u <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xcd), uint16(u))
	case u <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(dst, 0xce), uint32(u))
	default:
		return binary.BigEndian.AppendUint64(append(dst, 0xcf), u)
	}
}

// AppendInt appends v in its smallest form: unsigned for v >= 0, signed
// otherwise (msgspec's rule).
func AppendInt(dst []byte, v int64) []byte {
	switch {
	case v >= 0:
		return AppendUint(dst, uint64(v))
	case v >= -32:
		return append(dst, byte(int8(v)))
	case v >= math.MinInt8:
		return append(dst, 0xd0, byte(int8(v)))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(dst, 0xd1), uint16(int16(v)))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(dst, 0xd2), uint32(int32(v)))
	default:
		return binary.BigEndian.AppendUint64(append(dst, 0xd3), uint64(v))
	}
}

// AppendFloat64 appends f as a float 64 (Python floats are doubles).
func AppendFloat64(dst []byte, f float64) []byte {
	return binary.BigEndian.AppendUint64(append(dst, 0xcb), math.Float64bits(f))
}
