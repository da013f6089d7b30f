package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Limits applied while decoding. A payload that exceeds them is refused
// (for the outer structure) or the offending event is skipped.
const (
	MaxEvents    = 1 << 20 // events per batch
	MaxTokens    = 1 << 24 // token_ids per event
	MaxStringLen = 1 << 16 // bytes per string or generic bin value
	MaxAnyDepth  = 32      // nesting depth of extra_keys items
	MaxBlockSize = 1 << 24 // block_size
)

// ErrMalformed is wrapped by every decoding error caused by bad input.
var ErrMalformed = errors.New("malformed msgpack")

var errTruncated = fmt.Errorf("%w: unexpected end of input", ErrMalformed)

// reader is a bounds-checked cursor over a msgpack buffer. Every method
// either consumes exactly one well-formed item or returns an error; lengths
// read from the input are checked against the remaining bytes before they
// are used to size an allocation.
type reader struct {
	b []byte
	p int
}

func (r *reader) remaining() int { return len(r.b) - r.p }

func (r *reader) peek() (byte, error) {
	if r.p >= len(r.b) {
		return 0, errTruncated
	}
	return r.b[r.p], nil
}

// take returns the next n bytes without copying.
func (r *reader) take(n int) ([]byte, error) {
	if n < 0 || n > r.remaining() {
		return nil, errTruncated
	}
	s := r.b[r.p : r.p+n]
	r.p += n
	return s, nil
}

// uintN reads an n-byte big-endian unsigned integer (n = 1, 2, 4 or 8).
func (r *reader) uintN(n int) (uint64, error) {
	if n > r.remaining() {
		return 0, errTruncated
	}
	b := r.b[r.p : r.p+n]
	r.p += n
	switch n {
	case 1:
		return uint64(b[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(b)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(b)), nil
	default:
		return binary.BigEndian.Uint64(b), nil
	}
}

func typeErr(want string, c byte) error {
	return fmt.Errorf("%w: want %s, got %s", ErrMalformed, want, codeName(c))
}

// codeName describes a msgpack type byte for error messages.
func codeName(c byte) string {
	switch {
	case c <= 0x7f || c >= 0xe0 || (c >= 0xcc && c <= 0xd3):
		return "int"
	case c <= 0x8f || c == 0xde || c == 0xdf:
		return "map"
	case c <= 0x9f || c == 0xdc || c == 0xdd:
		return "array"
	case c <= 0xbf || (c >= 0xd9 && c <= 0xdb):
		return "str"
	}
	switch c {
	case 0xc0:
		return "nil"
	case 0xc2, 0xc3:
		return "bool"
	case 0xc4, 0xc5, 0xc6:
		return "bin"
	case 0xca, 0xcb:
		return "float"
	case 0xc1:
		return "reserved byte 0xc1"
	}
	return "ext"
}

// checkCount refuses a container length that could not possibly fit in the
// rest of the input (each item takes at least one byte, per entry of a map
// two) or exceeds limit.
func (r *reader) checkCount(n uint64, perItem int, limit int, what string) (int, error) {
	if n > uint64(limit) {
		return 0, fmt.Errorf("%w: %s of %d items exceeds limit %d", ErrMalformed, what, n, limit)
	}
	if n*uint64(perItem) > uint64(r.remaining()) {
		return 0, fmt.Errorf("%w: %s of %d items longer than the remaining %d bytes", ErrMalformed, what, n, r.remaining())
	}
	return int(n), nil
}

// arrayLen reads an array header; limit bounds the length.
func (r *reader) arrayLen(limit int) (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c >= 0x90 && c <= 0x9f:
		r.p++
		n = uint64(c & 0x0f)
	case c == 0xdc:
		r.p++
		if n, err = r.uintN(2); err != nil {
			return 0, err
		}
	case c == 0xdd:
		r.p++
		if n, err = r.uintN(4); err != nil {
			return 0, err
		}
	default:
		return 0, typeErr("array", c)
	}
	return r.checkCount(n, 1, limit, "array")
}

// mapLen reads a map header.
func (r *reader) mapLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c >= 0x80 && c <= 0x8f:
		r.p++
		n = uint64(c & 0x0f)
	case c == 0xde:
		r.p++
		if n, err = r.uintN(2); err != nil {
			return 0, err
		}
	case c == 0xdf:
		r.p++
		if n, err = r.uintN(4); err != nil {
			return 0, err
		}
	default:
		return 0, typeErr("map", c)
	}
	return r.checkCount(n, 2, math.MaxInt32, "map")
}

// nilNext consumes a nil and reports true if the next item is nil.
func (r *reader) nilNext() bool {
	if r.p < len(r.b) && r.b[r.p] == 0xc0 {
		r.p++
		return true
	}
	return false
}

// strBytes reads a string and returns its bytes without copying.
func (r *reader) strBytes() ([]byte, error) {
	// Fast path for fixstr, the form of every key and tag.
	if p := r.p; p < len(r.b) {
		if c := r.b[p]; c&0xe0 == 0xa0 {
			end := p + 1 + int(c&0x1f)
			if end <= len(r.b) {
				r.p = end
				return r.b[p+1 : end], nil
			}
		}
	}
	return r.strBytesSlow()
}

func (r *reader) strBytesSlow() ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case c >= 0xa0 && c <= 0xbf:
		r.p++
		n = uint64(c & 0x1f)
	case c == 0xd9:
		r.p++
		n, err = r.uintN(1)
	case c == 0xda:
		r.p++
		n, err = r.uintN(2)
	case c == 0xdb:
		r.p++
		n, err = r.uintN(4)
	default:
		return nil, typeErr("str", c)
	}
	if err != nil {
		return nil, err
	}
	if n > MaxStringLen {
		return nil, fmt.Errorf("%w: string of %d bytes exceeds limit %d", ErrMalformed, n, MaxStringLen)
	}
	return r.take(int(n))
}

// binBytes reads a bin item of at most limit bytes without copying.
func (r *reader) binBytes(limit int) ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch c {
	case 0xc4:
		r.p++
		n, err = r.uintN(1)
	case 0xc5:
		r.p++
		n, err = r.uintN(2)
	case 0xc6:
		r.p++
		n, err = r.uintN(4)
	default:
		return nil, typeErr("bin", c)
	}
	if err != nil {
		return nil, err
	}
	if n > uint64(limit) {
		return nil, fmt.Errorf("%w: bin of %d bytes exceeds limit %d", ErrMalformed, n, limit)
	}
	return r.take(int(n))
}

// integer reads any msgpack integer. It returns the value's two's-complement
// bit pattern and whether the value is negative.
func (r *reader) integer() (u uint64, neg bool, err error) {
	c, err := r.peek()
	if err != nil {
		return 0, false, err
	}
	if c <= 0x7f {
		r.p++
		return uint64(c), false, nil
	}
	if c >= 0xe0 {
		r.p++
		return uint64(int64(int8(c))), true, nil
	}
	switch c {
	case 0xcc, 0xcd, 0xce, 0xcf:
		r.p++
		u, err = r.uintN(1 << (c - 0xcc))
		return u, false, err
	case 0xd0, 0xd1, 0xd2, 0xd3:
		r.p++
		n := 1 << (c - 0xd0)
		u, err = r.uintN(n)
		if err != nil {
			return 0, false, err
		}
		var v int64
		switch n {
		case 1:
			v = int64(int8(u))
		case 2:
			v = int64(int16(u))
		case 4:
			v = int64(int32(u))
		default:
			v = int64(u)
		}
		return uint64(v), v < 0, nil
	}
	return 0, false, typeErr("int", c)
}

// intValue reads an integer that must fit in [lo, hi].
func (r *reader) intValue(lo, hi int64, what string) (int64, error) {
	u, neg, err := r.integer()
	if err != nil {
		return 0, err
	}
	if !neg && u > math.MaxInt64 {
		return 0, fmt.Errorf("%w: %s %d out of range", ErrMalformed, what, u)
	}
	v := int64(u)
	if v < lo || v > hi {
		return 0, fmt.Errorf("%w: %s %d out of range [%d, %d]", ErrMalformed, what, v, lo, hi)
	}
	return v, nil
}

// float reads a float32, float64 or integer as float64.
func (r *reader) float() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xca:
		r.p++
		u, err := r.uintN(4)
		return float64(math.Float32frombits(uint32(u))), err
	case 0xcb:
		r.p++
		u, err := r.uintN(8)
		return math.Float64frombits(u), err
	}
	u, neg, err := r.integer()
	if err != nil {
		return 0, typeErr("float", c)
	}
	if neg {
		return float64(int64(u)), nil
	}
	return float64(u), nil
}

// hash reads a block hash: an integer or a bin of 1..MaxHashBytes bytes.
func (r *reader) hash() (Hash, error) {
	c, err := r.peek()
	if err != nil {
		return Hash{}, err
	}
	if c >= 0xc4 && c <= 0xc6 {
		b, err := r.binBytes(MaxHashBytes)
		if err != nil {
			return Hash{}, err
		}
		if len(b) == 0 {
			return Hash{}, fmt.Errorf("%w: empty bin block hash", ErrMalformed)
		}
		return Hash{u: tail64(b), raw: string(b)}, nil
	}
	u, _, err := r.integer()
	if err != nil {
		return Hash{}, typeErr("int or bin hash", c)
	}
	return Hash{u: u}, nil
}

// skip consumes one complete item of any type. It is iterative, so deeply
// nested input cannot exhaust the stack.
func (r *reader) skip() error {
	pending := uint64(1)
	for pending > 0 {
		if pending > uint64(r.remaining()) {
			return errTruncated
		}
		pending--
		c := r.b[r.p]
		r.p++
		var n uint64 // bytes of payload to skip
		var err error
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
			continue
		case c <= 0x8f:
			pending += 2 * uint64(c&0x0f)
			continue
		case c <= 0x9f:
			pending += uint64(c & 0x0f)
			continue
		case c <= 0xbf:
			n = uint64(c & 0x1f)
		case c == 0xc1:
			return fmt.Errorf("%w: reserved byte 0xc1", ErrMalformed)
		case c == 0xc4 || c == 0xd9:
			n, err = r.uintN(1)
		case c == 0xc5 || c == 0xda:
			n, err = r.uintN(2)
		case c == 0xc6 || c == 0xdb:
			n, err = r.uintN(4)
		case c == 0xc7:
			n, err = r.uintN(1)
			n++
		case c == 0xc8:
			n, err = r.uintN(2)
			n++
		case c == 0xc9:
			n, err = r.uintN(4)
			n++
		case c == 0xca:
			n = 4
		case c == 0xcb:
			n = 8
		case c >= 0xcc && c <= 0xcf:
			n = 1 << (c - 0xcc)
		case c >= 0xd0 && c <= 0xd3:
			n = 1 << (c - 0xd0)
		case c >= 0xd4 && c <= 0xd8:
			n = 1 + 1<<(c-0xd4)
		case c == 0xdc || c == 0xde:
			n, err = r.uintN(2)
			if c == 0xde {
				n *= 2
			}
			pending += n
			n = 0
		case c == 0xdd || c == 0xdf:
			n, err = r.uintN(4)
			if c == 0xdf {
				n *= 2
			}
			pending += n
			n = 0
		}
		if err != nil {
			return err
		}
		if n > uint64(r.remaining()) {
			return errTruncated
		}
		r.p += int(n)
	}
	return nil
}

// anyValue reads a generic value (used for extra_keys items). Integers
// become int64, or uint64 above MaxInt64; floats become float64; maps must
// have string keys and become map[string]any.
func (r *reader) anyValue(depth int) (any, error) {
	if depth > MaxAnyDepth {
		return nil, fmt.Errorf("%w: nesting deeper than %d", ErrMalformed, MaxAnyDepth)
	}
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	switch {
	case c == 0xc0:
		r.p++
		return nil, nil
	case c == 0xc2 || c == 0xc3:
		r.p++
		return c == 0xc3, nil
	case c <= 0x7f || c >= 0xe0 || (c >= 0xcc && c <= 0xd3):
		u, neg, err := r.integer()
		if err != nil {
			return nil, err
		}
		if !neg && u > math.MaxInt64 {
			return u, nil
		}
		return int64(u), nil
	case c == 0xca || c == 0xcb:
		return r.float()
	case (c >= 0xa0 && c <= 0xbf) || (c >= 0xd9 && c <= 0xdb):
		b, err := r.strBytes()
		if err != nil {
			return nil, err
		}
		return string(b), nil
	case c >= 0xc4 && c <= 0xc6:
		b, err := r.binBytes(MaxStringLen)
		if err != nil {
			return nil, err
		}
		return append([]byte{}, b...), nil
	case (c >= 0x90 && c <= 0x9f) || c == 0xdc || c == 0xdd:
		return r.anyList(depth)
	case (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf:
		n, err := r.mapLen()
		if err != nil {
			return nil, err
		}
		m := make(map[string]any, min(n, 64))
		for range n {
			k, err := r.strBytes()
			if err != nil {
				return nil, fmt.Errorf("map key: %w", err)
			}
			v, err := r.anyValue(depth + 1)
			if err != nil {
				return nil, err
			}
			m[string(k)] = v
		}
		return m, nil
	}
	return nil, typeErr("plain value", c)
}

// anyList reads an array of generic values.
func (r *reader) anyList(depth int) ([]any, error) {
	n, err := r.arrayLen(math.MaxInt32)
	if err != nil {
		return nil, err
	}
	l := make([]any, n)
	for i := range l {
		if l[i], err = r.anyValue(depth + 1); err != nil {
			return nil, err
		}
	}
	return l, nil
}
