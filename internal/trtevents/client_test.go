package trtevents

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestClientPull(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method != http.MethodPost:
			http.Error(w, "method", http.StatusMethodNotAllowed)
		case r.URL.Path == "/kv_cache_events":
			_, _ = w.Write([]byte(`[{"event_id":0,"data":{"type":"created"}}]`))
		case r.URL.Path == "/big":
			_, _ = w.Write([]byte("[" + strings.Repeat(" ", 100) + "]"))
		default:
			http.Error(w, "no route", http.StatusNotFound)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	body, err := (&Client{URL: srv.URL + "/kv_cache_events"}).Pull(ctx)
	if err != nil || !strings.Contains(string(body), `"created"`) {
		t.Fatalf("pull: %q %v", body, err)
	}
	_, err = (&Client{URL: srv.URL + "/nope"}).Pull(ctx)
	var se *StatusError
	if !errors.As(err, &se) || se.Status != http.StatusNotFound || !strings.Contains(se.Body, "no route") {
		t.Fatalf("404: %v", err)
	}
	if _, err := (&Client{URL: srv.URL + "/big", MaxBody: 50}).Pull(ctx); err == nil || !strings.Contains(err.Error(), "over 50 bytes") {
		t.Fatalf("body limit: %v", err)
	}
	if _, err := (&Client{URL: "http://127.0.0.1:1/kv_cache_events"}).Pull(ctx); err == nil {
		t.Fatal("no error from a closed port")
	}
}
