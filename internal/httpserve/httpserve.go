// Package httpserve builds the HTTP servers of kvdir's own endpoints
// (metrics, health, the simulator's API) with timeouts, so that a client
// that opens a connection and goes quiet, before or between requests,
// does not hold it (and a goroutine) forever.
package httpserve

import (
	"log"
	"net/http"
	"time"
)

// Defaults of Timeouts.
const (
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
	// DefaultReadTimeout bounds reading a whole request where bodies are
	// small (metrics, health probes).
	DefaultReadTimeout = 10 * time.Second
)

// Timeouts of a server. A zero field takes its default; a negative one
// turns that timeout off.
type Timeouts struct {
	// ReadHeader bounds reading a request's headers.
	ReadHeader time.Duration
	// Read bounds reading a whole request, body included. Leave it off
	// (negative) for servers whose handlers stream long responses: when it
	// expires net/http cancels the request's context.
	Read time.Duration
	// Idle is how long a keep-alive connection may wait for its next
	// request before the server closes it.
	Idle time.Duration
}

func pick(v, def time.Duration) time.Duration {
	switch {
	case v < 0:
		return 0
	case v == 0:
		return def
	}
	return v
}

// New returns a server for h with the timeouts t and errorLog (nil: the
// log package's default logger).
func New(h http.Handler, t Timeouts, errorLog *log.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: pick(t.ReadHeader, DefaultReadHeaderTimeout),
		ReadTimeout:       pick(t.Read, DefaultReadTimeout),
		IdleTimeout:       pick(t.Idle, DefaultIdleTimeout),
		ErrorLog:          errorLog,
	}
}
