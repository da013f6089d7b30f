package tokenize

import (
	"sync"
	"testing"

	tiktoken "github.com/pkoukk/tiktoken-go"
	loader "github.com/pkoukk/tiktoken-go-loader"
)

// The reference encoder is tiktoken-go itself, with the offline loader.
var (
	refOnce sync.Once
	refEnc  *tiktoken.Tiktoken
	refErr  error
)

func reference(tb testing.TB) *tiktoken.Tiktoken {
	tb.Helper()
	refOnce.Do(func() {
		tiktoken.SetBpeLoader(loader.NewOfflineLoader())
		refEnc, refErr = tiktoken.GetEncoding(tiktoken.MODEL_CL100K_BASE)
	})
	if refErr != nil {
		tb.Fatalf("tiktoken-go reference: %v", refErr)
	}
	return refEnc
}

func refEncode(tb testing.TB, s string) []uint32 {
	tb.Helper()
	ints := reference(tb).EncodeOrdinary(s)
	out := make([]uint32, len(ints))
	for i, v := range ints {
		out[i] = uint32(v)
	}
	return out
}

func mustCL100K(tb testing.TB) *BPE {
	tb.Helper()
	b, err := CL100K()
	if err != nil {
		tb.Fatalf("CL100K: %v", err)
	}
	return b
}

func mustChatML(tb testing.TB) *ChatML {
	tb.Helper()
	t, err := ChatMLCL100K()
	if err != nil {
		tb.Fatalf("ChatMLCL100K: %v", err)
	}
	return t
}
