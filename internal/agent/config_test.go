package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/dirclient"
)

func TestDefaultConfigValidate(t *testing.T) {
	d := DefaultConfig()
	if d.Endpoint != DefaultEndpoint || d.BatchBlocks != DefaultBatchBlocks || d.MapCapacity != DefaultMapCapacity || d.BlockSize != 0 {
		t.Errorf("defaults %+v", d)
	}
	if err := d.Validate(); err == nil || !strings.Contains(err.Error(), "worker id is required") {
		t.Errorf("defaults without a worker id: %v", err)
	}
	d.WorkerID, d.WorkerAddress = "w", "http://10.0.0.7:8000"
	if err := d.Validate(); err != nil {
		t.Errorf("defaults with a worker id: %v", err)
	}
	for _, c := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no endpoint", func(c *Config) { c.Endpoint = "" }, "kv-events endpoint is required"},
		{"worker address not a URL", func(c *Config) { c.WorkerAddress = "10.0.0.7:8000" }, "worker address"},
		{"metrics URL scheme", func(c *Config) { c.MetricsURL = "ftp://h/metrics" }, "metrics URL"},
		{"negative batch blocks", func(c *Config) { c.BatchBlocks = -1 }, "batch blocks"},
		{"negative map capacity", func(c *Config) { c.MapCapacity = -1 }, "map capacity"},
		{"negative heartbeat", func(c *Config) { c.HeartbeatInterval = -time.Second }, "heartbeat interval"},
	} {
		cfg := d
		c.edit(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
		if _, err := New(cfg, nil); err == nil {
			t.Errorf("%s: New accepted it", c.name)
		}
	}
}

// The report mode reaches the agent's translator; an unknown mode is
// refused by Validate, an unknown word by ParseReportMode.
func TestConfigReportMode(t *testing.T) {
	c := DefaultConfig()
	c.WorkerID = "w"
	c.ReportMode = ReportFull
	dir, err := dirclient.New(dirclient.Config{Addrs: []string{"127.0.0.1:1"}}) // never dialled here
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	a, err := New(c, dir)
	if err != nil {
		t.Fatal(err)
	}
	if a.tr.mode != ReportFull {
		t.Fatalf("the translator counts stores in mode %v, the config says %v", a.tr.mode, ReportFull)
	}
	c.ReportMode = ReportMode(7)
	if err := c.Validate(); err == nil {
		t.Fatal("an unknown report mode was accepted")
	}
	for _, s := range []string{"incremental", "full"} {
		if _, err := ParseReportMode(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	if _, err := ParseReportMode("sometimes"); err == nil {
		t.Fatal("ParseReportMode accepted a bad word")
	}
}
