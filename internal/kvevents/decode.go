package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// MaxProblems bounds Stats.Problems; further problems are only counted.
const MaxProblems = 32

// Stats describes what DecodeBatch did with the events of a batch.
type Stats struct {
	// Events is the number of events decoded into the batch.
	Events int
	// Unknown counts events of unknown type, which were skipped.
	Unknown int
	// UnknownTypes lists up to MaxProblems distinct unknown type tags.
	UnknownTypes []string
	// Malformed counts events that were skipped because they were invalid.
	Malformed int
	// Problems details skipped events and ignored fields, at most MaxProblems.
	Problems []Problem
}

// Problem reports one event that was skipped, or a field that was ignored.
type Problem struct {
	// Index is the event's position in the batch's events array.
	Index int
	// Type is the event's tag, if it could be read.
	Type string
	// Skipped is true if the event was dropped; false if only a field was
	// ignored and the event was kept.
	Skipped bool
	// Err says what was wrong.
	Err error
}

// String formats the problem for logs.
func (p Problem) String() string {
	what := "ignored field in"
	if p.Skipped {
		what = "skipped"
	}
	return fmt.Sprintf("%s event %d (%q): %v", what, p.Index, p.Type, p.Err)
}

func (s *Stats) addProblem(p Problem) {
	if p.Skipped {
		s.Malformed++
	}
	if len(s.Problems) < MaxProblems {
		s.Problems = append(s.Problems, p)
	}
}

func (s *Stats) addUnknown(tag string) {
	s.Unknown++
	if len(s.UnknownTypes) >= MaxProblems {
		return
	}
	for _, t := range s.UnknownTypes {
		if t == tag {
			return
		}
	}
	s.UnknownTypes = append(s.UnknownTypes, tag)
}

// errUnknownType marks an event whose tag is not known; it is not a problem.
var errUnknownType = errors.New("unknown event type")

// decoder holds the per-batch state of DecodeBatch: the cursor, the stats,
// slabs that let the events of a batch share a few allocations, and a small
// cache of recent strings ("GPU", "full_attention", ...).
type decoder struct {
	r      reader
	stats  Stats
	tokens slab[uint32]
	hashes slab[Hash]
	ints   slab[int]
	int64s slab[int64]
	lists  slab[[]any]
	stored slab[BlockStored]
	strs   [8]string
	nstrs  int
	index  int // index of the event being decoded
	tag    string
}

// slab hands out sub-slices of larger allocations. A slice it returns has
// its capacity clipped, so appending to it never touches a neighbour.
type slab[T any] struct{ s []T }

// take returns n zeroed elements. When the current backing array is full
// a new one is made, twice as large as the last (at least 32) but never
// larger than room, an upper bound on what the rest of the input can need.
func (a *slab[T]) take(n, room int) []T {
	if cap(a.s)-len(a.s) < n {
		a.s = make([]T, 0, max(n, min(room, max(2*cap(a.s), 32))))
	}
	start := len(a.s)
	a.s = a.s[:start+n]
	return a.s[start : start+n : start+n]
}

// one returns a pointer to a new element holding v.
func (a *slab[T]) one(v T, room int) *T {
	s := a.take(1, room)
	s[0] = v
	return &s[0]
}

// str returns b as a string, reusing a recent identical string.
func (d *decoder) str(b []byte) string {
	for i := range min(d.nstrs, len(d.strs)) {
		if d.strs[i] == string(b) {
			return d.strs[i]
		}
	}
	s := string(b)
	d.strs[d.nstrs%len(d.strs)] = s
	d.nstrs++
	return s
}

// optString reads a string or nil ("" for nil), interning it.
func (d *decoder) optString() (string, error) {
	if d.r.nilNext() {
		return "", nil
	}
	b, err := d.r.strBytes()
	if err != nil {
		return "", err
	}
	return d.str(b), nil
}

// optInt reads an int or nil into the int slab.
func (d *decoder) optInt(what string) (*int, error) {
	if d.r.nilNext() {
		return nil, nil
	}
	v, err := d.r.intValue(math.MinInt, math.MaxInt, what)
	if err != nil {
		return nil, err
	}
	return d.ints.one(int(v), d.r.remaining()+1), nil
}

// DecodeBatch decodes one KVEventBatch payload.
//
// The batch may be a msgpack array [ts, events, data_parallel_rank?, ...] or
// a map {ts, events, data_parallel_rank}; each event a tagged array
// ["BlockStored", f1, ...] (trailing default fields may be missing, extra
// trailing items are ignored) or a map {"type": ..., fields} (unknown keys are
// ignored, missing fields are nil). Events of unknown type are skipped and
// counted; invalid events are skipped and reported in Stats.Problems while
// the rest of the batch still decodes. A malformed outer structure, trailing
// bytes or a payload beyond the package limits yield an error wrapping
// ErrMalformed.
//
// For full-attention stores (kv_cache_spec_kind unset or "full_attention")
// len(TokenIDs) must equal len(BlockHashes)*BlockSize; sparse groups may
// announce fewer hashes than token blocks. token_ids may be integers,
// integers mixed with strings (kept in StrTokens) or, from its first item
// on, bigram pairs whose overlaps must agree (see BlockStored.Bigram); a
// list that is none of these is a malformed event.
//
// Slices in the result may share backing arrays with other events of the
// same batch (never with data).
func DecodeBatch(data []byte) (Batch, Stats, error) {
	d := decoder{r: reader{b: data}}
	b, err := d.batch()
	if err != nil {
		return Batch{}, d.stats, fmt.Errorf("kvevents: decode batch: %w", err)
	}
	if d.r.remaining() != 0 {
		return Batch{}, d.stats, fmt.Errorf("kvevents: decode batch: %w: %d trailing bytes", ErrMalformed, d.r.remaining())
	}
	d.stats.Events = len(b.Events)
	return b, d.stats, nil
}

func (d *decoder) batch() (Batch, error) {
	var b Batch
	c, err := d.r.peek()
	if err != nil {
		return b, err
	}
	if (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf {
		return d.batchMap()
	}
	n, err := d.r.arrayLen(math.MaxInt32)
	if err != nil {
		return b, fmt.Errorf("outer batch: %w", err)
	}
	if n < 2 {
		return b, fmt.Errorf("%w: outer batch array has %d items, want at least 2", ErrMalformed, n)
	}
	if b.TS, err = d.r.float(); err != nil {
		return b, fmt.Errorf("ts: %w", err)
	}
	if b.Events, err = d.events(); err != nil {
		return b, err
	}
	if n >= 3 {
		if b.DPRank, err = d.optInt("data_parallel_rank"); err != nil {
			return b, fmt.Errorf("data_parallel_rank: %w", err)
		}
	}
	for i := 3; i < n; i++ {
		if err := d.r.skip(); err != nil {
			return b, fmt.Errorf("outer batch item %d: %w", i, err)
		}
	}
	return b, nil
}

func (d *decoder) batchMap() (Batch, error) {
	var b Batch
	n, err := d.r.mapLen()
	if err != nil {
		return b, fmt.Errorf("outer batch: %w", err)
	}
	var haveTS, haveEvents bool
	for range n {
		k, err := d.r.strBytes()
		if err != nil {
			return b, fmt.Errorf("outer batch key: %w", err)
		}
		switch string(k) {
		case "ts":
			if b.TS, err = d.r.float(); err != nil {
				return b, fmt.Errorf("ts: %w", err)
			}
			haveTS = true
		case "events":
			if b.Events, err = d.events(); err != nil {
				return b, err
			}
			haveEvents = true
		case "data_parallel_rank":
			if b.DPRank, err = d.optInt("data_parallel_rank"); err != nil {
				return b, fmt.Errorf("data_parallel_rank: %w", err)
			}
		default:
			if err := d.r.skip(); err != nil {
				return b, fmt.Errorf("outer batch field %q: %w", k, err)
			}
		}
	}
	if !haveTS || !haveEvents {
		return b, fmt.Errorf("%w: outer batch map lacks ts or events", ErrMalformed)
	}
	return b, nil
}

func (d *decoder) events() ([]Event, error) {
	n, err := d.r.arrayLen(MaxEvents)
	if err != nil {
		return nil, fmt.Errorf("events: %w", err)
	}
	if n == 0 {
		return nil, nil
	}
	evs := make([]Event, 0, n)
	for i := range n {
		start := d.r.p
		d.index, d.tag = i, ""
		ev, err := d.event()
		if err == nil {
			evs = append(evs, ev)
			continue
		}
		d.r.p = start
		if serr := d.r.skip(); serr != nil {
			return nil, fmt.Errorf("event %d: %w", i, serr)
		}
		if errors.Is(err, errUnknownType) {
			d.stats.addUnknown(d.tag)
			continue
		}
		d.stats.addProblem(Problem{Index: i, Type: d.tag, Skipped: true, Err: err})
	}
	if len(evs) == 0 {
		return nil, nil
	}
	return evs, nil
}

// event decodes one event in array or map form.
func (d *decoder) event() (Event, error) {
	c, err := d.r.peek()
	if err != nil {
		return nil, err
	}
	if (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf {
		return d.eventMap()
	}
	n, err := d.r.arrayLen(math.MaxInt32)
	if err != nil {
		return nil, fmt.Errorf("event: %w", err)
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: empty event array", ErrMalformed)
	}
	tag, err := d.r.strBytes()
	if err != nil {
		return nil, fmt.Errorf("event tag: %w", err)
	}
	nf := n - 1 // fields present after the tag
	switch string(tag) {
	case TypeBlockStored:
		d.tag = TypeBlockStored
		if nf < 4 {
			return nil, fmt.Errorf("%w: BlockStored array has %d fields, want at least 4", ErrMalformed, nf)
		}
		ev := d.newStored()
		for f := range nf {
			if f > fLocality || f == fLocality && !d.strOrNilNext() {
				// Positions after locality (TensorRT-LLM's mm_keys, ...)
				// are not read, nor is a non-string item in locality's.
				f = -1
			}
			if err := d.storedField(ev, f); err != nil {
				return nil, err
			}
		}
		return ev, d.checkStored(ev)
	case TypeBlockRemoved:
		d.tag = TypeBlockRemoved
		ev := &BlockRemoved{}
		if nf < 1 {
			return nil, fmt.Errorf("%w: BlockRemoved array has no fields", ErrMalformed)
		}
		for f := range nf {
			if f == rLocality && !d.strOrNilNext() {
				f = -1
			}
			if err := d.removedField(ev, f); err != nil {
				return nil, err
			}
		}
		return ev, nil
	case TypeAllBlocksCleared:
		d.tag = TypeAllBlocksCleared
		for range nf {
			if err := d.r.skip(); err != nil {
				return nil, err
			}
		}
		return &AllBlocksCleared{}, nil
	}
	d.tag = string(tag)
	return nil, errUnknownType
}

// Field numbers (array positions after the tag).
const (
	fBlockHashes = iota
	fParent
	fTokenIDs
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fGroupIdx
	fSpecKind
	fSlidingWindow
	fLocality
	// Map-only fields (SGLang); array position 12 is something else.
	fCacheSalt
	fMetadata
	numStoredFields
)

// storedKey maps a BlockStored map key to its field number, or -1.
func storedKey(k []byte) int {
	switch string(k) {
	case "block_hashes":
		return fBlockHashes
	case "parent_block_hash":
		return fParent
	case "token_ids":
		return fTokenIDs
	case "block_size":
		return fBlockSize
	case "lora_id":
		return fLoRAID
	case "medium":
		return fMedium
	case "lora_name":
		return fLoRAName
	case "extra_keys":
		return fExtraKeys
	case "group_idx":
		return fGroupIdx
	case "kv_cache_spec_kind":
		return fSpecKind
	case "kv_cache_spec_sliding_window":
		return fSlidingWindow
	case "locality":
		return fLocality
	case "cache_salt":
		return fCacheSalt
	case "metadata":
		return fMetadata
	}
	return -1
}

// Field numbers of BlockRemoved.
const (
	rBlockHashes = iota
	rMedium
	rGroupIdx
	rLocality
)

// eventMap decodes a map-form event. The "type" key usually comes first; if
// it does not, the map is scanned for it before the fields are decoded.
func (d *decoder) eventMap() (Event, error) {
	n, err := d.r.mapLen()
	if err != nil {
		return nil, fmt.Errorf("event: %w", err)
	}
	body := d.r.p
	tag, first, err := d.findType(n)
	if err != nil {
		return nil, err
	}
	d.tag = tag
	d.r.p = body
	var stored *BlockStored
	var removed *BlockRemoved
	var have [numStoredFields]bool
	switch tag {
	case TypeBlockStored:
		stored = d.newStored()
	case TypeBlockRemoved:
		removed = &BlockRemoved{}
	case TypeAllBlocksCleared:
	default:
		return nil, errUnknownType
	}
	for i := range n {
		k, err := d.r.strBytes()
		if err != nil {
			return nil, fmt.Errorf("event key: %w", err)
		}
		if i == 0 && first {
			// The tag was already read by findType.
			if err := d.r.skip(); err != nil {
				return nil, err
			}
			continue
		}
		f := -1
		switch {
		case stored != nil:
			if f = storedKey(k); f >= 0 {
				err = d.storedField(stored, f)
			}
		case removed != nil:
			switch string(k) {
			case "block_hashes":
				f = rBlockHashes
			case "medium":
				f = rMedium
			case "group_idx":
				f = rGroupIdx
			case "locality":
				f = rLocality
			}
			if f >= 0 {
				err = d.removedField(removed, f)
			}
		}
		if f < 0 {
			err = d.r.skip()
		} else {
			have[f] = true
		}
		if err != nil {
			return nil, err
		}
	}
	switch {
	case stored != nil:
		if !have[fBlockHashes] || !have[fTokenIDs] || !have[fBlockSize] {
			return nil, fmt.Errorf("%w: BlockStored map lacks block_hashes, token_ids or block_size", ErrMalformed)
		}
		return stored, d.checkStored(stored)
	case removed != nil:
		if !have[rBlockHashes] {
			return nil, fmt.Errorf("%w: BlockRemoved map lacks block_hashes", ErrMalformed)
		}
		return removed, nil
	}
	return &AllBlocksCleared{}, nil
}

// findType returns the value of the "type" key of a map whose n entries start
// at the cursor, and whether it was the first key. The cursor is left
// somewhere inside the map; the caller rewinds it.
func (d *decoder) findType(n int) (string, bool, error) {
	for i := range n {
		k, err := d.r.strBytes()
		if err != nil {
			return "", false, fmt.Errorf("event key: %w", err)
		}
		if string(k) == "type" {
			t, err := d.r.strBytes()
			if err != nil {
				return "", false, fmt.Errorf("event type: %w", err)
			}
			return tagString(t), i == 0, nil
		}
		if err := d.r.skip(); err != nil {
			return "", false, err
		}
	}
	return "", false, fmt.Errorf("%w: event map has no \"type\" key", ErrMalformed)
}

// tagString returns the event tag t as a string, without allocating for
// the known tags.
func tagString(t []byte) string {
	switch string(t) {
	case TypeBlockStored:
		return TypeBlockStored
	case TypeBlockRemoved:
		return TypeBlockRemoved
	case TypeAllBlocksCleared:
		return TypeAllBlocksCleared
	}
	return string(t)
}

// newStored returns a zeroed BlockStored from the decoder's slab.
func (d *decoder) newStored() *BlockStored {
	return &d.stored.take(1, d.r.remaining()>>4+1)[0]
}

// fieldErr adds the field name to a non-nil err.
func fieldErr(name string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", name, err)
}

// storedField decodes BlockStored field number f into ev; fields beyond the
// known ones are skipped.
func (d *decoder) storedField(ev *BlockStored, f int) error {
	r := &d.r
	var err error
	switch f {
	case fBlockHashes:
		ev.BlockHashes, err = d.hashList()
		return fieldErr("block_hashes", err)
	case fParent:
		if r.nilNext() {
			ev.Parent = nil
			return nil
		}
		h, err := r.hash()
		if err != nil {
			return fieldErr("parent_block_hash", err)
		}
		ev.Parent = d.hashes.one(h, d.r.remaining()+1)
	case fTokenIDs:
		return fieldErr("token_ids", d.tokenList(ev))
	case fBlockSize:
		v, err := r.intValue(1, MaxBlockSize, "block_size")
		if err != nil {
			return fieldErr("block_size", err)
		}
		ev.BlockSize = int(v)
	case fLoRAID:
		if r.nilNext() {
			ev.LoRAID = nil
			return nil
		}
		v, err := r.intValue(math.MinInt64, math.MaxInt64, "lora_id")
		if err != nil {
			return fieldErr("lora_id", err)
		}
		ev.LoRAID = d.int64s.one(v, d.r.remaining()+1)
	case fMedium:
		ev.Medium, err = d.optString()
		return fieldErr("medium", err)
	case fLoRAName:
		if d.mapNext() {
			// SGLang's BlockStoredWithMetadata: its metadata map follows
			// medium where vLLM has lora_name.
			return fieldErr("metadata", d.metadata(ev))
		}
		ev.LoRAName, err = d.optString()
		return fieldErr("lora_name", err)
	case fExtraKeys:
		return d.extraKeys(ev)
	case fGroupIdx:
		ev.GroupIdx, err = d.optInt("group_idx")
		return fieldErr("group_idx", err)
	case fSpecKind:
		ev.SpecKind, err = d.optString()
		return fieldErr("kv_cache_spec_kind", err)
	case fSlidingWindow:
		ev.SlidingWindow, err = d.optInt("kv_cache_spec_sliding_window")
		return fieldErr("kv_cache_spec_sliding_window", err)
	case fLocality:
		ev.Locality, err = d.optString()
		return fieldErr("locality", err)
	case fCacheSalt:
		ev.CacheSalt, err = d.optString()
		return fieldErr("cache_salt", err)
	case fMetadata:
		if r.nilNext() {
			return nil
		}
		return fieldErr("metadata", d.metadata(ev))
	default:
		return r.skip()
	}
	return nil
}

// removedField decodes BlockRemoved field number f into ev.
func (d *decoder) removedField(ev *BlockRemoved, f int) error {
	var err error
	switch f {
	case rBlockHashes:
		ev.BlockHashes, err = d.hashList()
		return fieldErr("block_hashes", err)
	case rMedium:
		ev.Medium, err = d.optString()
		return fieldErr("medium", err)
	case rGroupIdx:
		ev.GroupIdx, err = d.optInt("group_idx")
		return fieldErr("group_idx", err)
	case rLocality:
		ev.Locality, err = d.optString()
		return fieldErr("locality", err)
	}
	return d.r.skip()
}

func (d *decoder) checkStored(ev *BlockStored) error {
	if ev.SpecKind != "" && ev.SpecKind != SpecKindFullAttention {
		return nil
	}
	want := uint64(len(ev.BlockHashes)) * uint64(ev.BlockSize)
	if uint64(len(ev.TokenIDs)) != want {
		return fmt.Errorf("%w: %d token_ids for %d blocks of %d tokens", ErrMalformed, len(ev.TokenIDs), len(ev.BlockHashes), ev.BlockSize)
	}
	return nil
}

func (d *decoder) hashList() ([]Hash, error) {
	n, err := d.r.arrayLen(math.MaxInt32)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	hs := d.hashes.take(n, d.r.remaining())
	r := &d.r
	for i := range hs {
		// Fast path: positive fixint and uint64, the common vLLM forms.
		if r.p+9 <= len(r.b) && r.b[r.p] == 0xcf {
			hs[i] = Hash{u: binary.BigEndian.Uint64(r.b[r.p+1:])}
			r.p += 9
			continue
		}
		if hs[i], err = r.hash(); err != nil {
			return nil, fmt.Errorf("item %d: %w", i, err)
		}
	}
	return hs, nil
}

// tokenList decodes token_ids into ev: a list of integer token ids, a list
// with string items (TensorRT-LLM multimodal placeholders, see
// BlockStored.StrTokens), or SGLang's bigram pairs (see BlockStored.Bigram).
func (d *decoder) tokenList(ev *BlockStored) error {
	r := &d.r
	ev.TokenIDs, ev.StrTokens, ev.Bigram, ev.BigramNext = nil, nil, false, 0
	n, err := r.arrayLen(MaxTokens)
	if err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	if isArrayCode(r.b[r.p]) {
		return d.bigrams(ev, n)
	}
	toks := d.tokens.take(n, r.remaining())
	b := r.b
	p := r.p
	for i := range toks {
		// Fast path: with 5 bytes at hand, a fixint, uint8, uint16 or
		// uint32 token decodes without data-dependent branches.
		if p+5 <= len(b) {
			c := b[p]
			if l := tokLen[c]; l != 0 {
				w := uint64(b[p+1])<<24 | uint64(b[p+2])<<16 | uint64(b[p+3])<<8 | uint64(b[p+4])
				toks[i] = uint32(w>>tokShift[c]) | uint32(tokFix[c])
				p += int(l)
				continue
			}
		}
		// Rare encodings and the end of input: the general integer reader.
		r.p = p
		if p < len(b) && isStrCode(b[p]) {
			s, err := r.strBytes()
			if err != nil {
				return fmt.Errorf("item %d: %w", i, err)
			}
			if len(s) > MaxTokenStringLen {
				return fmt.Errorf("%w: item %d: string token of %d bytes exceeds limit %d", ErrMalformed, i, len(s), MaxTokenStringLen)
			}
			ev.StrTokens = append(ev.StrTokens, StrToken{Index: i, Value: string(s)})
			toks[i] = 0
			p = r.p
			continue
		}
		u, err := r.tokenValue()
		if err != nil {
			return fmt.Errorf("item %d: %w", i, err)
		}
		toks[i] = u
		p = r.p
	}
	r.p = p
	ev.TokenIDs = toks
	return nil
}

// tokenValue reads one integer token id.
func (r *reader) tokenValue() (uint32, error) {
	u, neg, err := r.integer()
	if err != nil {
		return 0, err
	}
	if neg || u > math.MaxUint32 {
		return 0, fmt.Errorf("%w: token id %d out of uint32 range", ErrMalformed, int64(u))
	}
	return uint32(u), nil
}

// bigrams decodes n bigram pairs [[t0,t1],[t1,t2],...]: each pair's second
// token must be the next pair's first.
func (d *decoder) bigrams(ev *BlockStored, n int) error {
	r := &d.r
	toks := d.tokens.take(n, r.remaining())
	var next uint32
	for i := range toks {
		m, err := r.arrayLen(2)
		if err != nil {
			return fmt.Errorf("bigram item %d: %w", i, err)
		}
		if m != 2 {
			return fmt.Errorf("%w: bigram item %d has %d tokens, want 2", ErrMalformed, i, m)
		}
		first, err := r.tokenValue()
		if err != nil {
			return fmt.Errorf("bigram item %d: %w", i, err)
		}
		if i > 0 && first != next {
			return fmt.Errorf("%w: bigram item %d starts with %d, but item %d ended with %d", ErrMalformed, i, first, i-1, next)
		}
		if next, err = r.tokenValue(); err != nil {
			return fmt.Errorf("bigram item %d: %w", i, err)
		}
		toks[i] = first
	}
	ev.TokenIDs, ev.Bigram, ev.BigramNext = toks, true, next
	return nil
}

func isArrayCode(c byte) bool { return (c >= 0x90 && c <= 0x9f) || c == 0xdc || c == 0xdd }
func isMapCode(c byte) bool   { return (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf }
func isStrCode(c byte) bool   { return (c >= 0xa0 && c <= 0xbf) || (c >= 0xd9 && c <= 0xdb) }

// strOrNilNext reports whether the next item is a string or nil.
func (d *decoder) strOrNilNext() bool {
	return d.r.p < len(d.r.b) && (isStrCode(d.r.b[d.r.p]) || d.r.b[d.r.p] == 0xc0)
}

// mapNext reports whether the next item is a map.
func (d *decoder) mapNext() bool {
	return d.r.p < len(d.r.b) && isMapCode(d.r.b[d.r.p])
}

// metadata decodes SGLang's BlockStoredMetadata map {"cache_salt": ...}.
// A "lora_name" key is read too: kvdir's encoder writes it when an event
// has both a salt and a LoRA name in the array layout, which SGLang (no
// lora_name) never does. Other keys are skipped.
func (d *decoder) metadata(ev *BlockStored) error {
	n, err := d.r.mapLen()
	if err != nil {
		return err
	}
	for range n {
		k, err := d.r.strBytes()
		if err != nil {
			return fmt.Errorf("key: %w", err)
		}
		switch string(k) {
		case "cache_salt":
			ev.CacheSalt, err = d.optString()
			err = fieldErr("cache_salt", err)
		case "lora_name":
			ev.LoRAName, err = d.optString()
			err = fieldErr("lora_name", err)
		default:
			err = d.r.skip()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Tables for the token fast path, indexed by the msgpack type byte: the
// item's length (0: use the slow path), the right shift that extracts the
// value from the 4 bytes after the type byte, and the value of a fixint.
var tokLen, tokShift, tokFix [256]uint8

func init() {
	for c := range 0x80 {
		tokLen[c], tokShift[c], tokFix[c] = 1, 32, uint8(c)
	}
	tokLen[0xcc], tokShift[0xcc] = 2, 24
	tokLen[0xcd], tokShift[0xcd] = 3, 16
	tokLen[0xce], tokShift[0xce] = 5, 0
}

// extraKeys decodes extra_keys: nil, or a list with one entry per block, each
// nil or a list. A map in this position (SGLang's per-event metadata after a
// lora_name) gives the event its cache_salt, with a note, rather than
// failing the event.
func (d *decoder) extraKeys(ev *BlockStored) error {
	r := &d.r
	ev.ExtraKeys = nil
	if r.nilNext() {
		return nil
	}
	c, err := r.peek()
	if err != nil {
		return err
	}
	if (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf {
		// Its cache_salt is kept: dropping it would index salted blocks
		// in the unsalted namespace.
		if err := d.metadata(ev); err != nil {
			return fieldErr("extra_keys metadata", err)
		}
		d.stats.addProblem(Problem{Index: d.index, Type: d.tag, Err: errors.New("extra_keys is a map (SGLang metadata), only its cache_salt is read")})
		return nil
	}
	n, err := r.arrayLen(math.MaxInt32)
	if err != nil {
		return fieldErr("extra_keys", err)
	}
	if n == 0 {
		ev.ExtraKeys = [][]any{} // an empty list, not None
		return nil
	}
	ek := d.lists.take(n, r.remaining())
	for i := range ek {
		if r.nilNext() {
			continue
		}
		if ek[i], err = r.anyList(1); err != nil {
			return fmt.Errorf("extra_keys item %d: %w", i, err)
		}
	}
	ev.ExtraKeys = ek
	return nil
}
