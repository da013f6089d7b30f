package trtevents

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvdir/kvdir/internal/kvevents"
)

// The fixtures below reproduce the JSON that trtllm-serve's POST
// /kv_cache_events answers (NVIDIA/TensorRT-LLM
// tensorrt_llm/serve/openai_server.py, get_kv_cache_events: a JSON array
// of the events drained by get_kv_cache_events_async), each event written
// by KVCacheEventSerializer.to_json_str in tensorrt_llm/_utils.py (read at
// revisions 000a01de66f0 and ed53795b33fc, whose serializer is the same:
// event_id, data, window_size, attention_dp_rank when set; stored blocks
// with block_hash, tokens of {type, token_id, token_extra_id},
// cache_level, priority and no lora_id). The event order (0 created, then
// stored, removed) follows tests/unittest/llmapi/test_llm_kv_cache_events.py
// (revision 025b36c315f2). Block size 4 keeps them short.

// fixtureSession: created, a store of two blocks and a partial third, a
// store chained on it, an update, a removal.
const fixtureSession = `[
 {"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [1024, 0]}, "window_size": 4096},
 {"event_id": 1, "data": {"type": "stored", "parent_hash": null, "blocks": [
   {"type": "stored_block", "block_hash": 18446744073709551615, "tokens": [
     {"type": "unique_token", "token_id": 1, "token_extra_id": 0}, {"type": "unique_token", "token_id": 2, "token_extra_id": 0},
     {"type": "unique_token", "token_id": 3, "token_extra_id": 0}, {"type": "unique_token", "token_id": 4, "token_extra_id": 0}],
    "cache_level": 0, "priority": 35},
   {"type": "stored_block", "block_hash": 22, "tokens": [
     {"type": "unique_token", "token_id": 5, "token_extra_id": 0}, {"type": "unique_token", "token_id": 6, "token_extra_id": 0},
     {"type": "unique_token", "token_id": 7, "token_extra_id": 0}, {"type": "unique_token", "token_id": 8, "token_extra_id": 0}],
    "cache_level": 0, "priority": 35},
   {"type": "stored_block", "block_hash": 33, "tokens": [
     {"type": "unique_token", "token_id": 9, "token_extra_id": 0}],
    "cache_level": 0, "priority": 35}]}, "window_size": 4096},
 {"event_id": 2, "data": {"type": "stored", "parent_hash": 22, "blocks": [
   {"type": "stored_block", "block_hash": 44, "tokens": [
     {"type": "unique_token", "token_id": 9, "token_extra_id": 0}, {"type": "unique_token", "token_id": 10, "token_extra_id": 0},
     {"type": "unique_token", "token_id": 11, "token_extra_id": 7}, {"type": "unique_token", "token_id": 12, "token_extra_id": 0}],
    "cache_level": 1, "priority": 35}]}, "window_size": 4096, "attention_dp_rank": 0},
 {"event_id": 3, "data": {"type": "updated", "block_hash": 22,
   "cache_level": {"type": "event_diff", "new_value": 1, "old_value": 0},
   "priority": {"type": "event_diff", "new_value": 35, "old_value": 35}}, "window_size": 4096},
 {},
 {"event_id": 4, "data": {"type": "removed", "block_hashes": [44, 33]}, "window_size": 4096}
]`

func TestDecodeSession(t *testing.T) {
	d := NewDecoder(4)
	evs, st, err := d.Decode([]byte(fixtureSession))
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 5 || st.Events != 5 || st.Empty != 1 || st.Updated != 1 || st.Malformed != 0 || st.Unknown != 0 {
		t.Fatalf("events %d, stats %+v", len(evs), st)
	}
	for i, ev := range evs {
		if ev.ID != uint64(i) || ev.WindowSize != 4096 {
			t.Fatalf("event %d: id %d window %d", i, ev.ID, ev.WindowSize)
		}
	}
	if _, ok := evs[0].Event.(*kvevents.AllBlocksCleared); !ok || evs[0].Type != TypeCreated {
		t.Fatalf("created -> %T", evs[0].Event)
	}
	s1, ok := evs[1].Event.(*kvevents.BlockStored)
	if !ok {
		t.Fatalf("stored -> %T", evs[1].Event)
	}
	if s1.Parent != nil || s1.BlockSize != 4 || len(s1.BlockHashes) != 2 ||
		s1.BlockHashes[0] != kvevents.HashFromUint64(1<<64-1) || s1.BlockHashes[1] != kvevents.HashFromUint64(22) {
		t.Fatalf("store 1: %+v", s1)
	}
	if got := s1.TokenIDs; len(got) != 8 || got[0] != 1 || got[7] != 8 {
		t.Fatalf("store 1 tokens %v", got)
	}
	if s1.Medium != "" || s1.LoRAName != "" {
		t.Fatalf("store 1 medium %q lora %q", s1.Medium, s1.LoRAName)
	}
	if st.PartialBlocks != 1 || st.PartialRemoved != 1 {
		t.Fatalf("partial blocks %d, partial removed %d", st.PartialBlocks, st.PartialRemoved)
	}
	s2 := evs[2].Event.(*kvevents.BlockStored)
	if s2.Parent == nil || *s2.Parent != kvevents.HashFromUint64(22) || s2.Medium != "" {
		t.Fatalf("store 2: %+v", s2)
	}
	if len(s2.StrTokens) != 1 || s2.StrTokens[0].Index != 2 || s2.StrTokens[0].Value != "extra:7" || s2.TokenIDs[2] != 0 {
		t.Fatalf("store 2 extra-id tokens %+v %v", s2.StrTokens, s2.TokenIDs)
	}
	if evs[2].DPRank == nil || *evs[2].DPRank != 0 || evs[1].DPRank != nil {
		t.Fatal("attention_dp_rank not read")
	}
	if evs[3].Event != nil || evs[3].Type != TypeUpdated {
		t.Fatalf("updated -> %T", evs[3].Event)
	}
	r := evs[4].Event.(*kvevents.BlockRemoved)
	if len(r.BlockHashes) != 1 || r.BlockHashes[0] != kvevents.HashFromUint64(44) {
		t.Fatalf("removed (partial block 33 dropped): %+v", r)
	}
}

func TestDecodeLearnsBlockSize(t *testing.T) {
	// A 32-token engine read with the vLLM default of 16: the first of two
	// blocks cannot be partial, so it sets the size.
	tok := func(n int) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = `{"type":"unique_token","token_id":1,"token_extra_id":0}`
		}
		return strings.Join(parts, ",")
	}
	body := `[{"event_id":7,"data":{"type":"stored","parent_hash":5,"blocks":[` +
		`{"type":"stored_block","block_hash":1,"tokens":[` + tok(32) + `],"cache_level":0,"priority":35},` +
		`{"type":"stored_block","block_hash":2,"tokens":[` + tok(32) + `],"cache_level":0,"priority":35}]},"window_size":4096}]`
	d := NewDecoder(16)
	evs, _, err := d.Decode([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	s := evs[0].Event.(*kvevents.BlockStored)
	if d.BlockSize() != 32 || s.BlockSize != 32 || len(s.BlockHashes) != 2 || len(s.TokenIDs) != 64 {
		t.Fatalf("block size %d, store %d blocks of %d, %d tokens", d.BlockSize(), len(s.BlockHashes), s.BlockSize, len(s.TokenIDs))
	}
	// A lone longer block may be partial of a larger size: not learned
	// from, and not taken as full.
	d = NewDecoder(16)
	one := `[{"event_id":0,"data":{"type":"stored","parent_hash":null,"blocks":[{"block_hash":1,"tokens":[` + tok(20) + `]}]}}]`
	evs, st, err := d.Decode([]byte(one))
	if err != nil || d.BlockSize() != 16 || evs[0].Event != nil || st.PartialBlocks != 1 {
		t.Fatalf("lone 20-token block: size %d, event %T, %+v, %v", d.BlockSize(), evs[0].Event, st, err)
	}
}

func TestDecodeLoRAAndNegativeHash(t *testing.T) {
	body := `[{"event_id":3,"data":{"type":"stored","parent_hash":-2,"blocks":[{"block_hash":-1,"lora_id":9,` +
		`"tokens":[{"token_id":1},{"token_id":2}]}]}}]`
	evs, _, err := NewDecoder(2).Decode([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	s := evs[0].Event.(*kvevents.BlockStored)
	if s.LoRAName != "trtllm-lora-9" || s.LoRAID == nil || *s.LoRAID != 9 {
		t.Fatalf("lora: %q %v", s.LoRAName, s.LoRAID)
	}
	if *s.Parent != kvevents.HashFromInt64(-2) || s.BlockHashes[0] != kvevents.HashFromInt64(-1) {
		t.Fatalf("hashes %v %v", s.Parent, s.BlockHashes)
	}
}

func TestDecodeBadInput(t *testing.T) {
	for _, body := range []string{``, `{}`, `"x"`, `[1,`, `null`} {
		if _, _, err := NewDecoder(4).Decode([]byte(body)); !errors.Is(err, ErrNotArray) && body != "null" {
			t.Errorf("%q: err %v, want ErrNotArray", body, err)
		}
	}
	// Bad events are counted and, with an id, kept for the sequence.
	body := `[
	 {"event_id": "x", "data": {"type": "created"}},
	 {"data": {"type": "created"}},
	 {"event_id": 1, "data": {"type": "stored", "parent_hash": 1.5, "blocks": [{"block_hash": 1, "tokens": [{"token_id": 1}]}]}},
	 {"event_id": 2, "data": {"type": "stored", "parent_hash": null, "blocks": [{"block_hash": 1, "tokens": [{"token_id": -1}]}]}},
	 {"event_id": 3, "data": {"type": "removed", "block_hashes": ["abc"]}},
	 {"event_id": 4, "data": {"type": "rotated"}},
	 {"event_id": 5, "data": 7},
	 {"event_id": 6, "data": {"type": "stored", "parent_hash": null, "blocks": [{"tokens": [{"token_id": 1}]}]}},
	 {"event_id": 7, "data": {"type": "stored", "parent_hash": null, "blocks": [{"block_hash": 1, "tokens": []}]}},
	 7
	]`
	evs, st, err := NewDecoder(1).Decode([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 7 || st.Unknown != 1 || st.Malformed != 9 {
		t.Fatalf("%d events, %+v", len(evs), st)
	}
	for _, ev := range evs {
		if ev.Event != nil {
			t.Fatalf("event %d decoded to %T", ev.ID, ev.Event)
		}
	}
	// null decodes to an empty array.
	if evs, _, err := NewDecoder(1).Decode([]byte("null")); err != nil || len(evs) != 0 {
		t.Fatalf("null: %v %v", evs, err)
	}
}
