package trtevents

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// DefaultMaxBody bounds a response body read by Client.
const DefaultMaxBody = 64 << 20

// DefaultTimeout is Client's default request timeout. trtllm-serve waits up
// to 2 s for a first event when its queue is empty
// (get_kv_cache_events_async(2)), so the timeout must be longer.
const DefaultTimeout = 10 * time.Second

// StatusError is a response other than 200.
type StatusError struct {
	URL    string
	Status int
	Body   string // the start of the body
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("trtevents: POST %s: status %d: %s", e.URL, e.Status, e.Body)
}

// Client pulls KV cache events from trtllm-serve's POST /kv_cache_events.
type Client struct {
	// URL is the endpoint, e.g. http://engine:8000/kv_cache_events.
	URL string
	// HTTP is the client used (default: one with DefaultTimeout).
	HTTP *http.Client
	// MaxBody bounds the body read (default DefaultMaxBody).
	MaxBody int64
}

// Pull POSTs an empty body to the endpoint and returns the response body:
// the events the engine queued since the last pull (the engine drains its
// queue on every read). A body over MaxBody is an error, not a truncation.
func (c *Client) Pull(ctx context.Context) ([]byte, error) {
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: DefaultTimeout}
	}
	limit := c.MaxBody
	if limit <= 0 {
		limit = DefaultMaxBody
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, http.NoBody)
	if err != nil {
		return nil, fmt.Errorf("trtevents: POST %s: %w", c.URL, err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("trtevents: POST %s: %w", c.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		return nil, &StatusError{URL: c.URL, Status: resp.StatusCode, Body: strings.TrimSpace(string(b))}
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("trtevents: POST %s: read body: %w", c.URL, err)
	}
	if int64(len(body)) > limit {
		return nil, fmt.Errorf("trtevents: POST %s: body over %d bytes", c.URL, limit)
	}
	return body, nil
}
