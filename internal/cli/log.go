package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
)

// levelValue is --log-level: debug, info, warn or error.
type levelValue struct{ level slog.Level }

func (v *levelValue) String() string { return strings.ToLower(v.level.String()) }
func (v *levelValue) Type() string   { return "LEVEL" }
func (v *levelValue) Set(s string) error {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "debug":
		v.level = slog.LevelDebug
	case "info":
		v.level = slog.LevelInfo
	case "warn", "warning":
		v.level = slog.LevelWarn
	case "error":
		v.level = slog.LevelError
	default:
		return fmt.Errorf("unknown log level %q (want debug, info, warn or error)", s)
	}
	return nil
}

// formatValue is --log-format: text or json.
type formatValue struct{ json bool }

func (v *formatValue) String() string {
	if v.json {
		return "json"
	}
	return "text"
}
func (v *formatValue) Type() string { return "FORMAT" }
func (v *formatValue) Set(s string) error {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "text":
		v.json = false
	case "json":
		v.json = true
	default:
		return fmt.Errorf("unknown log format %q (want text or json)", s)
	}
	return nil
}

// NewLogger returns a logger writing to w at level in format ("text" or
// "json").
func NewLogger(w io.Writer, level slog.Level, json bool) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if json {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// LogLevel returns the level --log-level chose.
func (p *Program) LogLevel() slog.Level { return p.logLevel.level }

// JSONLogs reports whether --log-format is json.
func (p *Program) JSONLogs() bool { return p.logFormat.json }

// Logger returns the logger --log-level and --log-format describe, writing
// to Stderr. Call it after Parse.
func (p *Program) Logger() *slog.Logger {
	if p.logger == nil {
		p.logger = NewLogger(p.stderr(), p.logLevel.level, p.logFormat.json)
	}
	return p.logger
}

// DeferredLogger returns a logger that writes through Logger once Parse
// (or a cobra tree's PersistentPreRunE) has read --log-level and
// --log-format: for commands that hand their logger out while building
// the flags. Records logged before that go to a text logger at info.
func (p *Program) DeferredLogger() *slog.Logger { return slog.New(&deferredHandler{p: p}) }

type deferredHandler struct {
	p   *Program
	ops []func(slog.Handler) slog.Handler
}

func (h *deferredHandler) handler() slog.Handler {
	var inner slog.Handler
	if h.p.parsed {
		inner = h.p.Logger().Handler()
	} else {
		inner = slog.NewTextHandler(h.p.stderr(), nil)
	}
	for _, op := range h.ops {
		inner = op(inner)
	}
	return inner
}

func (h *deferredHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.handler().Enabled(ctx, l)
}
func (h *deferredHandler) Handle(ctx context.Context, r slog.Record) error {
	return h.handler().Handle(ctx, r)
}
func (h *deferredHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &deferredHandler{p: h.p, ops: append(slices.Clip(h.ops), func(x slog.Handler) slog.Handler { return x.WithAttrs(attrs) })}
}
func (h *deferredHandler) WithGroup(name string) slog.Handler {
	return &deferredHandler{p: h.p, ops: append(slices.Clip(h.ops), func(x slog.Handler) slog.Handler { return x.WithGroup(name) })}
}
