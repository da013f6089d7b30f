package kvevents

import (
	"bytes"
	"math"
	"reflect"
	"testing"
)

func containsNaN(b Batch) bool {
	if math.IsNaN(b.TS) {
		return true
	}
	var walk func(v any) bool
	walk = func(v any) bool {
		switch x := v.(type) {
		case float64:
			return math.IsNaN(x)
		case []any:
			for _, it := range x {
				if walk(it) {
					return true
				}
			}
		case map[string]any:
			for _, it := range x {
				if walk(it) {
					return true
				}
			}
		}
		return false
	}
	for _, ev := range b.Events {
		if s, ok := ev.(*BlockStored); ok {
			for _, k := range s.ExtraKeys {
				if walk(k) {
					return true
				}
			}
		}
	}
	return false
}

func FuzzDecodeBatch(f *testing.F) {
	f.Add(v026Bytes())
	for _, b := range sampleBatches() {
		for _, form := range []Form{FormArray, FormMap, FormMapBatch} {
			f.Add(EncodeBatch(b, form))
		}
	}
	f.Add(cat(mArr(2), mF64(1), mArr(2),
		cat(mArr(3), mStr("Unknown"), mArr(1), mNil()),
		cat(mMap(2), mStr("block_hashes"), cat(mArr(1), mBin([]byte{1, 2, 3})), mStr("type"), mStr("BlockRemoved"))))
	f.Add([]byte{0x92, 0xca, 0x7f, 0xc0, 0, 0, 0x90})
	// Engine shapes (see shapes_test.go): hybrid MLA groups, SGLang bigrams
	// and cache salt, TensorRT-LLM string tokens and locality.
	for _, seed := range shapeSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		b, st, err := DecodeBatch(data)
		if err != nil {
			return
		}
		if st.Events != len(b.Events) {
			t.Fatalf("stats.Events %d != %d events", st.Events, len(b.Events))
		}
		for _, form := range []Form{FormArray, FormMap, FormMapBatch} {
			enc := EncodeBatch(b, form)
			b2, st2, err := DecodeBatch(enc)
			if err != nil {
				t.Fatalf("%v: re-decode failed: %v\ninput %x\nenc   %x", form, err, data, enc)
			}
			if st2.Malformed != 0 || st2.Unknown != 0 || st2.Events != len(b.Events) {
				t.Fatalf("%v: re-decode stats %+v", form, st2)
			}
			if !bytes.Equal(EncodeBatch(b2, form), enc) {
				t.Fatalf("%v: encoding not stable", form)
			}
			if !containsNaN(b) && !reflect.DeepEqual(b, b2) {
				t.Fatalf("%v: round trip differs:\n%#v\n%#v", form, b, b2)
			}
		}
	})
}
