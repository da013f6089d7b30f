package agent

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/kvdir/kvdir/internal/dirclient"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Defaults of Config that have no constant of their own above.
const (
	// DefaultEndpoint is vLLM's default KV-events publisher address.
	DefaultEndpoint = "tcp://127.0.0.1:5557"
	// DefaultBlockSize is vLLM's default block size. The agent no longer
	// registers it when --block-size is not given (it registers 0, "not
	// told", and the directory learns the engine's block sizes from its
	// events); routers assume it for workers whose size is not known yet.
	DefaultBlockSize = 16
)

// DefaultConfig returns an agent's configuration with every default
// filled in: a vLLM engine publishing on DefaultEndpoint, and the default
// batching, map, queue and timing limits. WorkerID and the engine's
// addresses are left for the caller; a zero field of a Config passed to
// New also means its default.
func DefaultConfig() Config {
	return Config{
		Engine:          kvdirv1.EngineKind_ENGINE_KIND_VLLM,
		Endpoint:        DefaultEndpoint,
		BatchInterval:   DefaultBatchInterval,
		BatchBlocks:     DefaultBatchBlocks,
		MapCapacity:     DefaultMapCapacity,
		QueueLimit:      dirclient.DefaultQueueLimit,
		ReplayTimeout:   DefaultReplayTimeout,
		RegisterRetry:   DefaultRegisterRetry,
		ShutdownTimeout: DefaultShutdownTimeout,
	}
}

// Validate reports the first problem of c: a missing worker id or events
// source (an endpoint or, exclusively, a pull URL), engine URLs that are not http(s), negative sizes or durations.
func (c Config) Validate() error {
	if c.WorkerID == "" {
		return errors.New("agent: worker id is required")
	}
	if c.ReportMode != ReportIncremental && c.ReportMode != ReportFull {
		return fmt.Errorf("agent: unknown report mode %d", c.ReportMode)
	}
	if err := c.validatePull(); err != nil {
		return err
	}
	for _, u := range []struct{ name, v string }{{"worker address", c.WorkerAddress}, {"metrics URL", c.MetricsURL}} {
		if u.v == "" {
			continue
		}
		p, err := url.Parse(u.v)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return fmt.Errorf("agent: %s %q: want an http(s) URL such as http://10.0.0.7:8000", u.name, u.v)
		}
	}
	if c.MetricsByRank && c.MetricsRank < 0 {
		return fmt.Errorf("agent: metrics data-parallel rank %d is negative", c.MetricsRank)
	}
	if c.DataParallelRank != nil && *c.DataParallelRank > MaxDataParallelRank {
		return fmt.Errorf("agent: data-parallel rank %d is not 0 to %d", *c.DataParallelRank, MaxDataParallelRank)
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"block size", c.BlockSize}, {"batch blocks", c.BatchBlocks}, {"map capacity", c.MapCapacity}, {"queue limit", c.QueueLimit}} {
		if n.v < 0 {
			return fmt.Errorf("agent: %s %d is negative (0 means the default)", n.name, n.v)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"batch interval", c.BatchInterval}, {"heartbeat interval", c.HeartbeatInterval}, {"replay timeout", c.ReplayTimeout},
		{"register retry", c.RegisterRetry}, {"shutdown timeout", c.ShutdownTimeout}, {"engine down after", c.EngineDownAfter}} {
		if d.v < 0 {
			return fmt.Errorf("agent: %s %v is negative (0 means the default)", d.name, d.v)
		}
	}
	if c.MaxMessageBytes < 0 {
		return fmt.Errorf("agent: max message bytes %d is negative (0 means the default)", c.MaxMessageBytes)
	}
	return nil
}

// MaxDataParallelRank is the highest data-parallel rank a worker may
// register (the directory refuses higher ones).
const MaxDataParallelRank = 255
