package router

import (
	"errors"
	"fmt"
	"time"
)

// DefaultSessionInterval is how often session records are written.
const DefaultSessionInterval = 250 * time.Millisecond

// DefaultConfig returns a router's configuration with every default
// filled in. Policy, Renderer and the workers (Directory or Static) are
// left for the caller; a zero field of a Config passed to New also means
// its default.
func DefaultConfig() Config {
	return Config{
		SessionHeader:    DefaultSessionHeader,
		MaxBodyBytes:     DefaultMaxBodyBytes,
		BodyTimeout:      DefaultBodyTimeout,
		MaxPromptBytes:   DefaultMaxPromptBytes,
		MaxPromptTokens:  DefaultMaxPromptTokens,
		MatchTimeout:     DefaultMatchTimeout,
		ScrapeInterval:   DefaultScrapeInterval,
		ModelsInterval:   DefaultModelsInterval,
		SpecTTL:          DefaultSpecTTL,
		MaxAttempts:      DefaultMaxAttempts,
		DownFor:          DefaultDownFor,
		BlockSize:        DefaultBlockSize,
		ConnectTimeout:   DefaultConnectTimeout,
		SessionInterval:  DefaultSessionInterval,
		ShareIntents:     true,
		AdmissionQueue:   DefaultAdmissionQueue,
		AdmissionMaxWait: DefaultAdmissionMaxWait,
	}
}

// Validate reports the first problem of c: no policy or renderer, no way
// to find workers, a static worker without an id, given twice or at an
// address that is not an http(s) URL, negative sizes or durations (but
// SpecTTL, which a negative value disables).
func (c Config) Validate() error {
	if c.Policy == nil || c.Renderer == nil {
		return errors.New("router: Config.Policy and Config.Renderer are required")
	}
	if c.Directory == nil && len(c.Static) == 0 && len(c.Groups) == 0 {
		return errors.New("router: give a directory to discover workers from, or a static worker list")
	}
	if len(c.Groups) > 0 {
		if c.Directory != nil || c.Local != nil {
			return errors.New("router: give the directory as Config.Directory (one group) or as Config.Groups (several), not both")
		}
		if len(c.Static) > 0 && len(c.Groups) > 1 {
			return errors.New("router: static workers take one directory group at most")
		}
		if err := validateGroups(c.Groups); err != nil {
			return err
		}
	}
	if c.LocalStaleAfter < 0 || c.LocalMaxStale < 0 || (c.LocalMaxStale > 0 && c.LocalMaxStale < c.LocalStaleAfter) {
		return fmt.Errorf("router: --follow-max-stale %v must be at least --follow-stale-after %v (and neither negative)", c.LocalMaxStale, c.LocalStaleAfter)
	}
	if c.Local != nil && c.Directory == nil {
		return errors.New("router: a local replica of the directory (Config.Local) needs the directory it follows (Config.Directory)")
	}
	seen := map[string]bool{}
	for _, w := range c.Static {
		if w.ID == "" {
			return fmt.Errorf("router: static worker at %q has no id", w.Address)
		}
		if seen[w.ID] {
			return fmt.Errorf("router: static worker id %q given twice", w.ID)
		}
		seen[w.ID] = true
		if _, err := validateAddress(w.Address); err != nil {
			return fmt.Errorf("router: static worker %s: %w", w.ID, err)
		}
		if w.HasRank && (w.Rank < 0 || w.Rank > maxRank) {
			return fmt.Errorf("router: static worker %s: data-parallel rank %d is not 0 to %d", w.ID, w.Rank, maxRank)
		}
	}
	switch c.Explain {
	case "", ExplainOpen, ExplainOff:
	case ExplainToken:
		if c.ExplainToken == "" {
			return errors.New("router: --explain token needs the token (--explain-token-file, or KVDIR_ROUTER_EXPLAIN_TOKEN)")
		}
	default:
		return fmt.Errorf("router: --explain %q: want open, token or off", c.Explain)
	}
	if _, _, err := engineKind(c.EngineKind); err != nil {
		return err
	}
	if c.AdmissionQueue < 0 || c.AdmissionMaxWait < 0 {
		return fmt.Errorf("router: --admission-queue %d and --admission-max-wait %v must not be negative (0: off, and the default wait)", c.AdmissionQueue, c.AdmissionMaxWait)
	}
	if c.MaxBodyBytes < 0 || c.MaxAttempts < 0 || c.BlockSize < 0 || c.MaxPromptBytes < 0 || c.MaxPromptTokens < 0 {
		return fmt.Errorf("router: negative size (max body %d, max prompt bytes %d, max prompt tokens %d, max attempts %d, block size %d; 0 means the default)",
			c.MaxBodyBytes, c.MaxPromptBytes, c.MaxPromptTokens, c.MaxAttempts, c.BlockSize)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"match timeout", c.MatchTimeout}, {"scrape interval", c.ScrapeInterval}, {"down-for", c.DownFor},
		{"connect timeout", c.ConnectTimeout}, {"session interval", c.SessionInterval}} {
		if d.v < 0 {
			return fmt.Errorf("router: %s %v is negative (0 means the default)", d.name, d.v)
		}
	}
	return nil
}
