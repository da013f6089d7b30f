package testkit

import (
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
)

// Logger returns a logger writing into t's output (shown when t fails or
// with -v) at info level, or at the level named by TEST_LOG_LEVEL (debug,
// info, warn, error). Lines logged after t has finished are dropped, so
// goroutines that outlive their test cannot panic the test binary.
func Logger(t testing.TB) *slog.Logger {
	w := &testWriter{w: t.Output()}
	t.Cleanup(w.close)
	level := slog.LevelInfo
	if s := os.Getenv("TEST_LOG_LEVEL"); s != "" {
		_ = level.UnmarshalText([]byte(strings.ToUpper(s)))
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

type testWriter struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return len(p), nil
	}
	return w.w.Write(p)
}

func (w *testWriter) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}
