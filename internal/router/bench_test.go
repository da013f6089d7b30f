package router

import (
	"bytes"
	"io"
	"net/http"
	"testing"
)

// BenchmarkProxySmall measures one small chat request through a real HTTP
// router (session-hash over two static workers) to an upstream that answers
// at once, over keep-alive connections. Compare with BenchmarkDirectSmall.
func BenchmarkProxySmall(b *testing.B) {
	benchSmall(b, true)
}

// BenchmarkDirectSmall is the same request sent straight to the upstream.
func BenchmarkDirectSmall(b *testing.B) {
	benchSmall(b, false)
}

func benchSmall(b *testing.B, viaRouter bool) {
	up0, up1 := newUpstream(b, "m", okJSON(0)), newUpstream(b, "m", okJSON(0))
	url := up0.URL
	if viaRouter {
		_, url = testRouter(b, "session-hash", []StaticWorker{{ID: "a", Address: up0.URL, Model: "m"}, {ID: "b", Address: up1.URL, Model: "m"}}, nil)
	}
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"the cache prefix token block worker router engine session agent model tensor batch queue latency memory request response stream replica cluster leader follower index chain hash snapshot lease epoch prefill decode schedule evict store match score place route serve trace replay profile metric budget"}],"max_tokens":1}`)
	c := &http.Client{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req, _ := http.NewRequest(http.MethodPost, url+PathChat, bytes.NewReader(body))
		req.Header.Set("X-Session-Id", "s"+string(rune('a'+i%26)))
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
}
