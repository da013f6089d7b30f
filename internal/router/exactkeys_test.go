package router

import (
	"net/http"
	"testing"
)

// TestRequestKeysMatchExactly sends bodies whose "model" is shadowed by a
// case variant or a duplicate key to a router in front of two workers
// serving different models: the request goes to the worker of the model
// Python's json reads (the exact key, the last duplicate), and a body
// whose only "messages" is "Messages" is no chat request.
func TestRequestKeysMatchExactly(t *testing.T) {
	good := newUpstream(t, "good", okJSON(0))
	evil := newUpstream(t, "evil", okJSON(0))
	_, url := testRouter(t, "least-load", []StaticWorker{{ID: "g", Address: good.URL, Model: "good"}, {ID: "e", Address: evil.URL, Model: "evil"}},
		func(c *Config) { c.Explain = ExplainOpen })
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	for _, body := range []string{
		`{"Model":"evil","model":"good",` + msgs + `}`,
		`{"model":"good","MODEL":"evil",` + msgs + `}`,
		`{"model":"evil","model":"good",` + msgs + `}`,
	} {
		resp, out := post(t, url+PathChat, body)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderWorker) != "g" {
			t.Errorf("%s: %d worker %q %s, want worker g", body, resp.StatusCode, resp.Header.Get(HeaderWorker), out)
		}
	}
	if resp, out := post(t, url+PathChat, `{"Model":"good",`+msgs+`}`); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("only a Model key: %d %s, want 400 (model is required)", resp.StatusCode, out)
	}
	// Explain tells chat from completion by "messages": "Messages" is not it.
	if resp, out := post(t, url+PathExplain, `{"model":"good","Messages":[{"role":"user","content":"hi"}],"prompt":"hi"}`); resp.StatusCode != http.StatusOK {
		t.Errorf("explain of a completion with a Messages key: %d %s", resp.StatusCode, out)
	}
}
