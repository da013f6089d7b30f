// Command routerbench measures kvdir's router (make bench-router):
//
//   - the placement decision for a turn of a long session (render the new
//     messages, tokenize them, hash the chain, match it in a real 3-node
//     directory, score), warm (the session's earlier turns cached) and cold
//     (first sight of the whole prompt), as the router itself times it
//     (decision_us of POST /v1/kvdir/explain);
//   - the proxy overhead on small requests, side by side with HAProxy
//     (Debian's package, balance hdr(X-Session-Id), hash-type consistent,
//     hash-balance-factor 150) in front of the same upstream;
//   - requests per second sustained through the router.
//
// It writes the figures as JSON:
//
//	go run ./bench/cmd/routerbench -out bench/results/router.json
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/kvdir/kvdir/internal/benchjson"
)

// config holds the flags.
type config struct {
	dir                        string
	sessions, warm, cold       int
	sessionTokens, turnTokens  int
	latencyRequests            int
	rpsDuration                time.Duration
	rpsClients                 int
	haproxy                    string
	skipDecision, skipOverhead bool
}

func main() {
	var c config
	flag.StringVar(&c.dir, "dir", "", "directory for binaries and data (default: a temporary one, removed after)")
	flag.IntVar(&c.sessions, "sessions", 6, "long sessions built for the decision phase")
	flag.IntVar(&c.sessionTokens, "session-tokens", 32768, "prompt tokens of each session when the decision is timed")
	flag.IntVar(&c.turnTokens, "turn-tokens", 4096, "tokens added per turn while a session is built")
	flag.IntVar(&c.warm, "warm", 60, "warm decisions timed per session")
	flag.IntVar(&c.cold, "cold", 20, "cold decisions timed per session")
	flag.IntVar(&c.latencyRequests, "latency-requests", 3000, "sequential small requests per path (direct, router, HAProxy) for the overhead")
	flag.DurationVar(&c.rpsDuration, "rps-duration", 5*time.Second, "how long each throughput run lasts")
	flag.IntVar(&c.rpsClients, "rps-clients", 32, "concurrent clients of the throughput runs")
	flag.StringVar(&c.haproxy, "haproxy", "haproxy", "HAProxy binary (Debian: apt-get install haproxy)")
	flag.BoolVar(&c.skipDecision, "skip-decision", false, "skip the decision phase")
	flag.BoolVar(&c.skipOverhead, "skip-overhead", false, "skip the overhead and throughput phases")
	out := flag.String("out", "bench/results/router.json", "where to write the JSON figures (- for stdout)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if c.dir == "" {
		d, err := os.MkdirTemp("", "routerbench-")
		if err != nil {
			log.Error("temp dir", "err", err)
			os.Exit(1)
		}
		defer os.RemoveAll(d)
		c.dir = d
	}
	res, err := run(context.Background(), log, c)
	if err != nil {
		log.Error("routerbench failed", "err", err)
		os.Exit(1)
	}
	if err := benchjson.Write(*out, res); err != nil {
		log.Error("write results", "err", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "decision p99 %.0f us (warm, %d-token session), cold p99 %.0f us; overhead p50 router %.0f us vs HAProxy %.0f us (ratio %.2f); %.0f req/s through the router\n",
		res.DecisionP99, c.sessionTokens, res.DecisionColdP99, res.ProxyOverheadP50, res.HAProxyOverheadP50, res.OverheadRatio, res.RequestsPerSec)
}
