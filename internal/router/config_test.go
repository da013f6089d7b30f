package router

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/follow"
	"github.com/kvdir/kvdir/internal/placement"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func TestDefaultConfigValidate(t *testing.T) {
	d := DefaultConfig()
	if d.SessionHeader != DefaultSessionHeader || d.MaxAttempts != DefaultMaxAttempts || d.SessionInterval != DefaultSessionInterval {
		t.Errorf("defaults %+v", d)
	}
	if err := d.Validate(); err == nil || !strings.Contains(err.Error(), "Policy and Config.Renderer are required") {
		t.Errorf("defaults without a policy: %v", err)
	}
	pol, err := placement.New("round-robin", placement.Options{})
	if err != nil {
		t.Fatal(err)
	}
	d.Policy, d.Renderer = pol, NewRemoteRenderer("http://127.0.0.1:1/tokenize", "m", time.Second)
	if err := d.Validate(); err == nil || !strings.Contains(err.Error(), "static worker list") {
		t.Errorf("no workers: %v", err)
	}
	d.Static = []StaticWorker{{ID: "a", Address: "http://127.0.0.1:1"}}
	if err := d.Validate(); err != nil {
		t.Errorf("valid config: %v", err)
	}
	for _, c := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"worker without id", func(c *Config) { c.Static = []StaticWorker{{Address: "http://h:1"}} }, "has no id"},
		{"worker twice", func(c *Config) {
			c.Static = []StaticWorker{{ID: "a", Address: "http://h:1"}, {ID: "a", Address: "http://h:2"}}
		}, "given twice"},
		{"worker scheme", func(c *Config) { c.Static = []StaticWorker{{ID: "a", Address: "ftp://h:1"}} }, "scheme"},
		{"negative attempts", func(c *Config) { c.MaxAttempts = -1 }, "negative size"},
		{"negative match timeout", func(c *Config) { c.MatchTimeout = -time.Millisecond }, "match timeout"},
		{"local replica without directory", func(c *Config) { c.Local = noReplica{} }, "needs the directory it follows"},
		{"negative admission queue", func(c *Config) { c.AdmissionQueue = -1 }, "--admission-queue"},
		{"negative admission wait", func(c *Config) { c.AdmissionMaxWait = -time.Second }, "--admission-max-wait"},
		{"max stale below stale after", func(c *Config) { c.LocalStaleAfter, c.LocalMaxStale = 5*time.Second, time.Second }, "--follow-max-stale"},
	} {
		cfg := d
		c.edit(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New accepted it", c.name)
		}
	}
	d.SpecTTL = -1 // disables speculative entries: valid
	if err := d.Validate(); err != nil {
		t.Errorf("negative SpecTTL: %v", err)
	}
}

// noReplica is a LocalReplica that is never in sync.
type noReplica struct{}

func (noReplica) MatchChain(context.Context, []uint64, uint32, bool) (*kvdirv1.MatchResponse, error) {
	return nil, errors.New("not in sync")
}
func (noReplica) Synced() bool             { return false }
func (noReplica) Lag() uint64              { return 0 }
func (noReplica) Staleness() time.Duration { return time.Hour }
func (noReplica) View() follow.View        { return follow.View{} }
