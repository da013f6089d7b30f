package trtevents

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/kvevents"
)

// Event types (data.type) as trtllm-serve writes them.
const (
	TypeCreated = "created"
	TypeStored  = "stored"
	TypeRemoved = "removed"
	TypeUpdated = "updated"
)

// DefaultBlockSize is TensorRT-LLM's default tokens_per_block.
const DefaultBlockSize = 32

// Bounds of one response.
const (
	// MaxEvents is the most events one response may hold.
	MaxEvents = 1 << 20
	// MaxBlocks is the most blocks one stored or removed event may hold.
	MaxBlocks = 1 << 16
	// maxPartial bounds the remembered hashes of partial blocks.
	maxPartial = 1 << 16
)

// ErrNotArray is returned for a body that is not a JSON array of events.
var ErrNotArray = errors.New("trtevents: body is not a JSON array of KV cache events")

// Event is one decoded event of the pull endpoint.
type Event struct {
	// ID is event_id: consecutive from 0 (the created event) for the life
	// of the engine's KV cache manager.
	ID uint64
	// Type is data.type as sent.
	Type string
	// WindowSize is window_size (0 when absent or null).
	WindowSize int
	// DPRank is attention_dp_rank; nil when absent.
	DPRank *int
	// Event is what the translator consumes: *kvevents.BlockStored,
	// *kvevents.BlockRemoved or *kvevents.AllBlocksCleared; nil for an
	// event that changes nothing held (updated, an unknown or malformed
	// event with a valid id, a store of partial blocks only).
	Event kvevents.Event
}

// Stats counts what one Decode call met.
type Stats struct {
	// Events counts the events with a valid event_id (returned).
	Events int
	// Empty counts {} and null entries (the serializer writes {} for a
	// None event); they carry no id and are skipped.
	Empty int
	// Updated counts updated events (kept for their id only).
	Updated int
	// Unknown counts events of an unknown data.type (kept for their id).
	Unknown int
	// Malformed counts events with bad fields: with a valid id they are
	// kept with a nil Event, without one they are skipped.
	Malformed int
	// PartialBlocks counts stored blocks left out because they are shorter
	// than the block size (or follow such a block); PartialRemoved the
	// removals of such blocks that were dropped.
	PartialBlocks, PartialRemoved int
}

// Decoder decodes responses of the pull endpoint. It learns the engine's
// block size (see NewDecoder) and remembers the partial blocks it left out,
// so one Decoder must read one engine's responses in order. It is not safe
// for concurrent use.
type Decoder struct {
	blockSize int
	partial   map[uint64]struct{}
}

// NewDecoder returns a Decoder for an engine whose tokens_per_block is
// blockSize (0: unknown). A full block is one of blockSize tokens; when a
// block that cannot be partial (one followed by another block of the same
// event) is longer, blockSize becomes its length; with blockSize 0, the
// first block of the first store sets it.
func NewDecoder(blockSize int) *Decoder {
	return &Decoder{blockSize: max(blockSize, 0), partial: map[uint64]struct{}{}}
}

// BlockSize returns the block size the decoder uses now.
func (d *Decoder) BlockSize() int { return d.blockSize }

// Reset forgets the partial blocks (a new engine).
func (d *Decoder) Reset() { clear(d.partial) }

// wire types: numbers stay json.Number so that 64-bit hashes keep their
// precision and bad values are reported per event.
type wireEvent struct {
	EventID         *json.Number    `json:"event_id"`
	Data            json.RawMessage `json:"data"`
	WindowSize      *json.Number    `json:"window_size"`
	AttentionDPRank *json.Number    `json:"attention_dp_rank"`
}

type wireData struct {
	Type        string        `json:"type"`
	ParentHash  *json.Number  `json:"parent_hash"`
	Blocks      []wireBlock   `json:"blocks"`
	BlockHashes []json.Number `json:"block_hashes"`
}

type wireBlock struct {
	BlockHash *json.Number `json:"block_hash"`
	Tokens    []wireToken  `json:"tokens"`
	LoRAID    *json.Number `json:"lora_id"`
}

type wireToken struct {
	TokenID      *json.Number `json:"token_id"`
	TokenExtraID *json.Number `json:"token_extra_id"`
}

// Decode decodes one response body (a JSON array of events) into events in
// wire order. It fails only if the body is not a JSON array or holds more
// than MaxEvents entries; bad events are counted in Stats.
func (d *Decoder) Decode(body []byte) ([]Event, Stats, error) {
	var st Stats
	var raw []json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, st, fmt.Errorf("%w: %v", ErrNotArray, err)
	}
	if len(raw) > MaxEvents {
		return nil, st, fmt.Errorf("trtevents: %d events in one response, more than %d", len(raw), MaxEvents)
	}
	out := make([]Event, 0, len(raw))
	for _, r := range raw {
		r = bytes.TrimSpace(r)
		if bytes.Equal(r, []byte("null")) || bytes.Equal(r, []byte("{}")) {
			st.Empty++
			continue
		}
		var we wireEvent
		if err := json.Unmarshal(r, &we); err != nil || we.EventID == nil {
			if err == nil && we.Data == nil && we.WindowSize == nil {
				st.Empty++ // an object with none of the fields
				continue
			}
			st.Malformed++
			continue
		}
		id, err := strconv.ParseUint(we.EventID.String(), 10, 64)
		if err != nil {
			st.Malformed++
			continue
		}
		ev := Event{ID: id}
		st.Events++
		if we.WindowSize != nil {
			if ws, err := smallInt(*we.WindowSize); err == nil {
				ev.WindowSize = ws
			}
		}
		if we.AttentionDPRank != nil {
			if r, err := smallInt(*we.AttentionDPRank); err == nil {
				ev.DPRank = &r
			}
		}
		var data wireData
		if err := json.Unmarshal(we.Data, &data); err != nil {
			st.Malformed++
			out = append(out, ev)
			continue
		}
		ev.Type = data.Type
		switch data.Type {
		case TypeCreated:
			ev.Event = &kvevents.AllBlocksCleared{}
			d.Reset()
		case TypeStored:
			e, ok := d.stored(&data, &st)
			if !ok {
				st.Malformed++
			} else if e != nil {
				ev.Event = e
			}
		case TypeRemoved:
			e, ok := d.removed(&data, &st)
			if !ok {
				st.Malformed++
			} else if e != nil {
				ev.Event = e
			}
		case TypeUpdated:
			st.Updated++
		default:
			st.Unknown++
		}
		out = append(out, ev)
	}
	return out, st, nil
}

// stored maps a stored event; nil (and ok) when no full block is left.
func (d *Decoder) stored(data *wireData, st *Stats) (*kvevents.BlockStored, bool) {
	n := len(data.Blocks)
	if n == 0 || n > MaxBlocks {
		return nil, n == 0
	}
	e := &kvevents.BlockStored{}
	if data.ParentHash != nil {
		h, err := parseHash(*data.ParentHash)
		if err != nil {
			return nil, false
		}
		e.Parent = &h
	}
	// Learn the block size from blocks that cannot be partial.
	for i, b := range data.Blocks {
		l := len(b.Tokens)
		if l < 1 || l > blockhash.MaxBlockSize {
			return nil, false
		}
		if (i < n-1 || d.blockSize == 0) && l > d.blockSize {
			d.blockSize = l
		}
	}
	bs := d.blockSize
	e.BlockSize = bs
	e.BlockHashes = make([]kvevents.Hash, 0, n)
	e.TokenIDs = make([]uint32, 0, n*bs)
	full := true
	for i, b := range data.Blocks {
		if b.BlockHash == nil {
			return nil, false
		}
		h, err := parseHash(*b.BlockHash)
		if err != nil {
			return nil, false
		}
		if full && len(b.Tokens) != bs {
			full = false
		}
		if !full {
			st.PartialBlocks++
			if len(d.partial) >= maxPartial {
				clear(d.partial)
			}
			d.partial[h.Key()] = struct{}{}
			continue
		}
		if i == 0 && b.LoRAID != nil {
			id, err := strconv.ParseInt(b.LoRAID.String(), 10, 64)
			if err != nil {
				return nil, false
			}
			if id != 0 {
				e.LoRAID = &id
				e.LoRAName = "trtllm-lora-" + strconv.FormatInt(id, 10)
			}
		}
		for _, t := range b.Tokens {
			if t.TokenID == nil {
				return nil, false
			}
			v, err := strconv.ParseUint(t.TokenID.String(), 10, 32)
			if err != nil {
				return nil, false
			}
			if t.TokenExtraID != nil && t.TokenExtraID.String() != "0" {
				x, err := strconv.ParseUint(t.TokenExtraID.String(), 10, 64)
				if err != nil {
					return nil, false
				}
				e.StrTokens = append(e.StrTokens, kvevents.StrToken{Index: len(e.TokenIDs), Value: "extra:" + strconv.FormatUint(x, 10)})
				v = 0
			}
			e.TokenIDs = append(e.TokenIDs, uint32(v))
		}
		e.BlockHashes = append(e.BlockHashes, h)
	}
	if len(e.BlockHashes) == 0 {
		return nil, true
	}
	return e, true
}

// removed maps a removed event, dropping the hashes of partial blocks; nil
// (and ok) when none is left.
func (d *Decoder) removed(data *wireData, st *Stats) (*kvevents.BlockRemoved, bool) {
	if len(data.BlockHashes) > MaxBlocks {
		return nil, false
	}
	e := &kvevents.BlockRemoved{BlockHashes: make([]kvevents.Hash, 0, len(data.BlockHashes))}
	for _, n := range data.BlockHashes {
		h, err := parseHash(n)
		if err != nil {
			return nil, false
		}
		if _, ok := d.partial[h.Key()]; ok {
			delete(d.partial, h.Key())
			st.PartialRemoved++
			continue
		}
		e.BlockHashes = append(e.BlockHashes, h)
	}
	if len(e.BlockHashes) == 0 {
		return nil, true
	}
	return e, true
}

// parseHash reads a block hash: an unsigned 64-bit integer (TensorRT-LLM's
// size_t), or a negative 64-bit one kept as its two's complement.
func parseHash(n json.Number) (kvevents.Hash, error) {
	s := n.String()
	if u, err := strconv.ParseUint(s, 10, 64); err == nil {
		return kvevents.HashFromUint64(u), nil
	}
	i, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return kvevents.Hash{}, fmt.Errorf("trtevents: block hash %q is not a 64-bit integer", s)
	}
	return kvevents.HashFromInt64(i), nil
}

// smallInt reads a non-negative int that fits in 32 bits.
func smallInt(n json.Number) (int, error) {
	v, err := strconv.ParseInt(n.String(), 10, 64)
	if err != nil || v < 0 || v > math.MaxInt32 {
		return 0, fmt.Errorf("trtevents: %q is not a small non-negative integer", n.String())
	}
	return int(v), nil
}
