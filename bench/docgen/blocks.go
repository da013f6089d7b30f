package docgen

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"text/template"

	"github.com/kvdir/kvdir/internal/benchjson"
)

// table is a block rendered from one tool's results file by a template.
//
// The template's functions read that file (figures by name, details by
// key); numbers are formatted with a fixed number of decimals and a comma
// between thousands:
//
//	m NAME DIGITS         the figure's measured value
//	ms NAME DIV DIGITS    the same divided by DIV
//	t NAME DIGITS         its target, as "<= 10" (empty if it has none)
//	tv NAME DIV DIGITS    the target's value divided by DIV
//	op NAME               the target's comparison, "<=" or ">="
//	dn KEY DIV DIGITS     a numeric detail divided by DIV
//	ds KEY                a string detail
//	dl KEY                a list detail, to range over (its items are maps)
//	num V DIGITS          a number from such an item
//	minor VERSION         "2.6" of "2.6.12-1+deb12u4 ..."
//	cell S                S as a table cell's inside: " S ", or " " if empty
type table struct {
	file string // in bench/results
	tmpl string
}

var tables = map[string]table{
	// The headline tables (the top-level README, docs/figures.md).
	"index": {"index.json", `| figure | target | measured |
|---|---|---|
| block events applied per second, one goroutine | {{op "apply_events_per_sec"}} {{tv "apply_events_per_sec" 1e6 0}} M | {{ms "apply_events_per_sec" 1e6 1}} M |
| match of a {{dn "match_chain_blocks" 1 0}}-block chain while a writer applies {{ms "match_writer_events_per_sec" 1e3 0}} k events/s, p50 / p99 | {{op "match_p50_us"}} {{tv "match_p50_us" 1 0}} / {{tv "match_p99_us" 1 0}} µs | {{m "match_p50_us" 1}} / {{m "match_p99_us" 1}} µs |
| memory per (block, worker) entry | {{t "bytes_per_entry" 0}} B | {{m "bytes_per_entry" 1}} B |
| snapshot write / verified restore | {{t "snapshot_write_mb_per_sec" 0}} MB/s | {{m "snapshot_write_mb_per_sec" 0}} / {{m "snapshot_read_mb_per_sec" 0}} MB/s |
| content hash of a 32,768-token prompt | {{t "hash_32k_tokens_us" 0}} µs | {{m "hash_32k_tokens_us" 1}} µs |
`},
	"directory": {"directory.json", `| figure | target | measured |
|---|---|---|
| block events committed through Raft per second | {{op "events_per_sec"}} {{tv "events_per_sec" 1e6 0}} M | {{ms "events_per_sec" 1e6 2}} M |
| publish-to-commit p99 at a steady {{ms "latency_phase_events_per_sec" 1e6 0}} M events/s (p50) | {{t "publish_commit_p99_ms" 0}} ms | {{m "publish_commit_p99_ms" 0}} ms ({{m "publish_commit_p50_ms" 0}} ms) |
| match over gRPC against a follower, {{dn "match_chain_blocks" 1 0}} blocks, p99 (p50) | {{t "match_p99_us" 0}} µs | {{m "match_p99_us" 0}} µs ({{m "match_p50_us" 0}} µs) |
| an empty gRPC call to the same node, p99 (p50), for comparison | | {{m "rpc_baseline_p99_us" 0}} µs ({{m "rpc_baseline_p50_us" 0}} µs) |
| snapshot at {{dn "entries" 1e6 0}} M entries | {{or (t "snapshot_seconds" 2) "record"}} | {{m "snapshot_seconds" 2}} s, {{ms "snapshot_bytes" 1e6 0}} MB |
| a killed follower's restart until caught up | {{or (t "restart_catchup_seconds" 1) "record"}} | {{m "restart_catchup_seconds" 1}} s |
`},
	"agent": {"agent.json", `| figure | target | measured |
|---|---|---|
| KV-event decode + content hash + map, one goroutine | {{op "decode_hash_blocks_per_sec"}} {{tv "decode_hash_blocks_per_sec" 1e6 0}} M blocks/s | {{ms "decode_hash_blocks_per_sec" 1e6 2}} M blocks/s |
| engine-to-directory event lag over {{dn "end_to_end_requests" 1 0}} requests, p99 (p50) | {{t "end_to_end_event_lag_p99_ms" 0}} ms | {{m "end_to_end_event_lag_p99_ms" 1}} ms ({{m "end_to_end_event_lag_p50_ms" 1}} ms) |
| the engine model's scheduler at time scale 0, no sleeping | {{or (t "enginesim_requests_per_sec" 0) "record"}} | {{ms "enginesim_requests_per_sec" 1e3 0}} k requests/s |
`},
	"router": {"router.json", `| figure | target | measured |
|---|---|---|
| decision for a turn of a {{dn "decision_session_prompt_tokens_mean" 1e3 0}} k-token session, warm (render + tokenize the new messages + hash the new blocks + directory match + score), p99 (p50) | {{t "decision_p99_us" 0}} µs | {{m "decision_p99_us" 0}} µs ({{m "decision_p50_us" 0}} µs); the directory match alone {{m "decision_parts.match_p99_us" 0}} µs ({{m "decision_parts.match_p50_us" 0}} µs) |
| same, cold (the whole prompt tokenized), p99 (p50) | {{or (t "decision_cold_p99_us" 0) "record"}} | {{m "decision_cold_p99_us" 0}} µs ({{m "decision_cold_p50_us" 0}} µs) |
| same warm turn on a router matching from its local replica of the directory (` + "`--follow-log`" + `), p99 (p50) | {{t "decision_local_p99_us" 0}} µs | {{m "decision_local_p99_us" 0}} µs ({{m "decision_local_p50_us" 0}} µs); render {{m "decision_local_parts.render_p50_us" 0}}, hash {{m "decision_local_parts.hash_p50_us" 0}}, match {{m "decision_local_parts.match_p50_us" 0}} µs at p50 |
| same, cold, p99 (p50) | {{or (t "decision_local_cold_p99_us" 0) "record"}} | {{m "decision_local_cold_p99_us" 0}} µs ({{m "decision_local_cold_p50_us" 0}} µs) |
| proxy overhead on small requests, p50: router (session-hash, static list) / HAProxy {{minor (ds "haproxy_version")}} (` + "`balance hdr(X-Session-Id)`, `hash-type consistent`" + `) | ratio {{t "overhead_ratio_vs_haproxy" 1}} | {{m "proxy_overhead_p50_us" 0}} / {{m "haproxy_overhead_p50_us" 0}} µs = {{m "overhead_ratio_vs_haproxy" 2}} |
| same with the kvdir policy (a directory match per request) | | {{m "kvdir_proxy_overhead_p50_us" 0}} µs = {{m "kvdir_overhead_ratio_vs_haproxy" 2}}x HAProxy |
| requests per second through the router (kvdir; session-hash; HAProxy; direct), {{dn "rps_clients" 1 0}} clients | {{or (t "requests_per_sec" 0) "record"}} | {{m "requests_per_sec" 0}}; {{m "session_hash_requests_per_sec" 0}}; {{m "haproxy_requests_per_sec" 0}}; {{m "direct_requests_per_sec" 0}} |
`},
	"follow": {"follow.json", `| figure | target | measured |
|---|---|---|
| a new replica at {{dn "entries" 1e6 0}} M entries, start until in sync, median of {{len (dl "cold_starts")}} (slowest) | {{t "cold_start_seconds" 0}} s | {{m "cold_start_seconds" 2}} s ({{m "cold_start_max_seconds" 2}} s), a {{ms "snapshot_bytes" 1e6 0}} MB snapshot |
| memory per (block, worker) entry: the new replica / a state machine that applied every entry, as a node's | ratio {{t "replica_memory_ratio" 0}} | {{m "replica_bytes_per_entry" 1}} / {{m "node_fsm_bytes_per_entry" 1}} B, ratio {{m "replica_memory_ratio" 2}} |
| view lag: the leader's acknowledgement of a batch until the replica applied it, at {{ms "lag_events_per_sec" 1e3 0}} k block events/s, p99 (p50) | {{t "view_lag_p99_ms" 0}} ms | {{m "view_lag_p99_ms" 1}} ms ({{m "view_lag_p50_ms" 1}} ms); {{m "view_lag_entries_p99" 0}} log entries at p99 |
| highest block-event rate the directory sustained in a lag phase | record | {{ms "max_sustained_events_per_sec" 1e3 0}} k events/s |
`},
	"follow-phases": {"follow.json", `| offered events/s | acknowledged events/s | sustained | publish to commit p99 | view lag p50 | view lag p99 | view lag max | lag in entries p99 | batches per entry | nodes that took a snapshot |
|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|
{{range $p := dl "lag_phases"}}| {{num $p.offered_events_per_sec 0}} | {{num $p.achieved_events_per_sec 0}} | {{$p.sustained}} | {{num $p.commit_p99_ms 1}} ms | {{num $p.lag_p50_ms 1}} ms | {{num $p.lag_p99_ms 1}} ms | {{num $p.lag_max_ms 1}} ms | {{num $p.lag_entries_p99 0}} | {{num $p.batches_per_entry 1}} | {{num $p.node_snapshots 0}} |
{{end}}`},
	"follow-coldstarts": {"follow.json", `| start until in sync | first chunk after | transfer (decoding as it arrives) | after the last chunk | heap added |
|---:|---:|---:|---:|---:|
{{range $c := dl "cold_starts"}}| {{num $c.seconds 3}} s | {{num $c.wait_seconds 3}} s | {{num $c.receive_seconds 3}} s | {{num $c.apply_seconds 3}} s | {{num $c.heap_bytes 0}} B |
{{end}}`},

	"chaos": {"chaos.json", `| fault | ok | failed requests | lost ack. batches | leader recovery s | view converged s | requests | fault window: requests/s, block events/s sent and acknowledged (committed within the window) | warm-ups | digests agree at | following router: fallbacks, local matches, snapshots |
|---|---|---|---|---|---|---|---|---|---|---|
{{range $f := dl "faults"}}| ` + "`{{$f.name}}`" + ` | {{$f.ok}} | {{m (print $f.name ".failed_requests") 0}} | {{m (print $f.name ".lost_acknowledged_batches") 0}} | {{m (print $f.name ".leader_recovery_seconds") 2}} | {{m (print $f.name ".view_converged_seconds") 2}} | {{num $f.requests 0}} | {{num $f.requests_per_second 0}}, {{num $f.block_events_per_second 0}} ({{num $f.window_commit_block_events_per_second 0}}) | {{num $f.engine_warmup_requests 0}} | {{num $f.digests_agree_at_applied_index 0}} | {{num $f.following_router_fallbacks 0}}, {{num $f.following_router_local_matches 0}}, {{num $f.replica_snapshots 0}} |
{{end}}`},

	// The design notes' tables, by JSON field.
	"index-fields": {"index.json", `| figure | target | measured |
|---|---|---|
| ` + "`apply_events_per_sec`" + ` (remove + re-insert of sessions in turns, one goroutine) | {{t "apply_events_per_sec" 0}} | {{m "apply_events_per_sec" 0}} |
| ` + "`build_events_per_sec`" + ` (inserts into an empty index up to the full shape) |{{cell (t "build_events_per_sec" 0)}}| {{m "build_events_per_sec" 0}} |
| ` + "`match_p50_us` / `match_p99_us`" + ` ({{dn "match_chain_blocks" 1 0}} blocks, writer at {{ms "match_writer_events_per_sec" 1e3 0}} k events/s) | {{t "match_p50_us" 0}} / {{t "match_p99_us" 0}} | {{m "match_p50_us" 1}} / {{m "match_p99_us" 1}} |
| ` + "`match_idle_p50_us` / `match_idle_p99_us`" + ` (no writer) | | {{m "match_idle_p50_us" 1}} / {{m "match_idle_p99_us" 1}} |
| ` + "`bytes_per_entry`" + ` (live heap after GC / entries) | {{t "bytes_per_entry" 0}} | {{m "bytes_per_entry" 1}} |
| ` + "`snapshot_write_mb_per_sec`" + ` ({{ms "snapshot_bytes" 1e6 0}} MB snapshot, to memory) | {{t "snapshot_write_mb_per_sec" 0}} | {{m "snapshot_write_mb_per_sec" 0}} |
| ` + "`snapshot_read_mb_per_sec`" + ` (restore, verified, median of 9) | {{t "snapshot_read_mb_per_sec" 0}} | {{m "snapshot_read_mb_per_sec" 0}} |
| ` + "`hash_32k_tokens_us`" + ` (content hash of 32,768 tokens, B = 16) | {{t "hash_32k_tokens_us" 0}} | {{m "hash_32k_tokens_us" 1}} |
`},
	"index-goradix": {"index.json", `| | specialised tree | go-radix (prefix keys) |
|---|---|---|
| bytes per (block, worker) entry | {{m "goradix_comparison.tree_bytes_per_entry" 1}} | {{m "goradix_comparison.goradix_bytes_per_entry" 0}} ({{ms "goradix_comparison.goradix_key_bytes" 1e6 0}} MB of keys) |
| match p50, {{dn "goradix_comparison.match_chain_blocks" 1 0}}-block chain | {{m "goradix_comparison.tree_match_p50_us" 1}} µs | {{m "goradix_comparison.goradix_match_p50_us" 1}} µs |
| build | {{m "goradix_comparison.tree_build_seconds" 3}} s | {{m "goradix_comparison.goradix_build_seconds" 1}} s |
`},
	"directory-raft-tls": {"directory-raft-tls.json", `| figure | target | measured |
|---|---|---|
| block events committed per second, Raft on plain TCP (median of {{dn "rounds" 1 0}} rounds, {{dn "events" 1e6 1}} M events each) | | {{m "plain_events_per_sec" 0}} |
| same, Raft over mutual TLS | | {{m "mtls_events_per_sec" 0}} |
| ` + "`mtls_throughput_ratio`" + ` (mutual TLS / plain TCP) | {{t "mtls_throughput_ratio" 2}} | {{m "mtls_throughput_ratio" 2}} |
| CPU seconds of the three nodes per million events, plain TCP / mutual TLS (` + "`mtls_cpu_ratio`" + `) | | {{m "plain_cpu_seconds_per_m_events" 2}} / {{m "mtls_cpu_seconds_per_m_events" 2}} ({{m "mtls_cpu_ratio" 2}}) |
| publish-to-acknowledgement p99, plain TCP / mutual TLS | | {{m "plain_burst_commit_p99_ms" 0}} / {{m "mtls_burst_commit_p99_ms" 0}} ms |
`},
	"directory-workers": {"directory-workers.json", `| figure | target | measured |
|---|---|---|
| block events committed per second, 64 workers ({{dn "entries" 1e6 1}} M events, batches of at most {{dn "batch_blocks" 1 0}} blocks, {{dn "total_inflight_batches" 1 0}} in flight in all; median of {{dn "rounds" 1 0}} rounds) | | {{m "events_per_sec_64_workers" 0}} |
| same workload and batches, 1,024 workers | | {{m "events_per_sec_1024_workers" 0}} |
| ` + "`workers_throughput_ratio`" + ` (1,024 / 64 workers, median of the rounds' ratios) | {{t "workers_throughput_ratio" 2}} | {{m "workers_throughput_ratio" 2}} |
| CPU seconds of the three nodes per million events, 64 / 1,024 workers | | {{m "node_cpu_seconds_per_m_events_64_workers" 2}} / {{m "node_cpu_seconds_per_m_events_1024_workers" 2}} |
`},
	"directory-groups": {"directory-groups.json", `| groups side by side (3 nodes each) | all groups' events/s | ratio to one group | nodes' cores busy | events per node CPU second |
|---|---:|---:|---:|---:|
| 1 | {{m "events_per_sec_1_groups" 0}} | 1 | {{m "node_cores_busy_1_groups" 2}} | {{m "events_per_node_cpu_second_1_groups" 0}} |
| 2 | {{m "events_per_sec_2_groups" 0}} | {{m "throughput_ratio_2_groups" 2}} (target {{t "throughput_ratio_2_groups" 1}}) | {{m "node_cores_busy_2_groups" 2}} | {{m "events_per_node_cpu_second_2_groups" 0}} |
| 3 | {{m "events_per_sec_3_groups" 0}} | {{m "throughput_ratio_3_groups" 2}} | {{m "node_cores_busy_3_groups" 2}} | {{m "events_per_node_cpu_second_3_groups" 0}} |
`},
	"router-candidates": {"router-candidates.json", `| candidate workers for the model | decision p50 | decision p99 | target p99 |
|---|---:|---:|---:|
| 4 | {{m "decision_p50_us_4_workers" 0}} µs | {{m "decision_p99_us_4_workers" 0}} µs | |
| 1,024 | {{m "decision_p50_us_1024_workers" 0}} µs | {{m "decision_p99_us_1024_workers" 0}} µs | {{t "decision_p99_us_1024_workers" 0}} µs |
| match / score p50 at 1,024 (at 4) | {{dn "match_p50_us_1024_workers" 1 0}} / {{dn "score_p50_us_1024_workers" 1 0}} µs ({{dn "match_p50_us_4_workers" 1 0}} / {{dn "score_p50_us_4_workers" 1 1}}) | | |
`},
	"directory-quota": {"directory-quota.json", `| figure | target | measured |
|---|---|---|
| RSS per block held, one worker at its quota of {{dn "quota_blocks" 1 0}} blocks (steady state; right after the fill) | | {{m "bytes_per_entry" 0}} B ({{dn "fill_only_bytes_per_entry" 1 0}} B; the index's own estimate {{dn "index_estimate_bytes_per_entry" 1 0}} B) |
| RSS growth after {{dn "flood_multiple" 1 0}}x the quota more blocks, over quota x bytes/entry (worst node) | {{t "rss_growth_over_quota_bytes" 1}} | {{m "rss_growth_over_quota_bytes" 2}} |
| blocks held / published, acknowledged as applied | | {{dn "blocks_held" 1 0}} / {{dn "blocks_published" 1 0}} |
| time to publish the blocks past the quota | | {{m "flood_seconds" 1}} s |
`},
	"directory-fields": {"directory.json", `| JSON field | target | measured |
|---|---|---|
| ` + "`events_per_sec`" + ` ({{dn "events" 1e6 0}} M block events committed, publish as fast as acknowledged) | {{t "events_per_sec" 0}} | {{m "events_per_sec" 0}} |
| ` + "`publish_commit_p99_ms`" + ` (at a steady {{ms "latency_phase_events_per_sec" 1e6 0}} M events/s offered; p50 {{m "publish_commit_p50_ms" 1}}) | {{t "publish_commit_p99_ms" 0}} | {{m "publish_commit_p99_ms" 1}} |
| ` + "`match_p99_us`" + ` (gRPC against a follower, {{dn "match_chain_blocks" 1 0}}-block chain; p50 {{m "match_p50_us" 0}}) | {{t "match_p99_us" 0}} | {{m "match_p99_us" 0}} |
| ` + "`rpc_baseline_p99_us`" + ` (a gRPC health check, same node, interleaved; p50 {{m "rpc_baseline_p50_us" 0}}) |{{cell (t "rpc_baseline_p99_us" 0)}}| {{m "rpc_baseline_p99_us" 0}} |
| ` + "`snapshot_seconds`, `snapshot_bytes`" + ` at {{dn "entries" 1e6 0}} M entries | {{or (t "snapshot_seconds" 2) "record"}} | {{m "snapshot_seconds" 2}} s, {{ms "snapshot_bytes" 1e6 1}} MB |
| ` + "`restart_catchup_seconds`" + ` (follower killed at {{dn "entries" 1e6 0}} M entries, restarted) | {{or (t "restart_catchup_seconds" 1) "record"}} | {{m "restart_catchup_seconds" 1}} |
`},
}

func tableNames() func(func(string) bool) { return maps.Keys(tables) }

// render reads the table's results file from dir and executes its
// template over it.
func (t table) render(dir string) (string, error) {
	path := filepath.Join(dir, t.file)
	res, err := benchjson.ReadFile(path)
	if err != nil {
		return "", err
	}
	if err := res.Validate(); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	var details map[string]any
	if len(res.Details) > 0 {
		if err := json.Unmarshal(res.Details, &details); err != nil {
			return "", fmt.Errorf("%s: details: %w", path, err)
		}
	}
	fig := func(name string) (benchjson.Figure, error) {
		f, ok := res.Figure(name)
		if !ok {
			return f, fmt.Errorf("%s has no figure %s", t.file, name)
		}
		return f, nil
	}
	target := func(name string) (*benchjson.Target, error) {
		f, err := fig(name)
		if err != nil {
			return nil, err
		}
		if f.Target == nil {
			return nil, fmt.Errorf("%s: figure %s has no target", t.file, name)
		}
		return f.Target, nil
	}
	detail := func(key string) (any, error) {
		var v any = details
		for _, part := range strings.Split(key, ".") {
			m, ok := v.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("%s has no detail %s", t.file, key)
			}
			if v, ok = m[part]; !ok {
				return nil, fmt.Errorf("%s has no detail %s", t.file, key)
			}
		}
		return v, nil
	}
	funcs := template.FuncMap{
		"m": func(name string, digits int) (string, error) {
			f, err := fig(name)
			return Number(f.Measured, digits), err
		},
		"ms": func(name string, div float64, digits int) (string, error) {
			f, err := fig(name)
			return Number(f.Measured/div, digits), err
		},
		"t": func(name string, digits int) (string, error) {
			f, err := fig(name)
			if err != nil || f.Target == nil {
				return "", err
			}
			return f.Target.Op() + " " + Number(f.Target.Value, digits), nil
		},
		"tv": func(name string, div float64, digits int) (string, error) {
			tg, err := target(name)
			if err != nil {
				return "", err
			}
			return Number(tg.Value/div, digits), nil
		},
		"op": func(name string) (string, error) {
			tg, err := target(name)
			if err != nil {
				return "", err
			}
			return tg.Op(), nil
		},
		"dn": func(key string, div float64, digits int) (string, error) {
			v, err := detail(key)
			if err != nil {
				return "", err
			}
			x, ok := v.(float64)
			if !ok {
				return "", fmt.Errorf("%s: detail %s is %T, not a number", t.file, key, v)
			}
			return Number(x/div, digits), nil
		},
		"ds": func(key string) (string, error) {
			v, err := detail(key)
			if err != nil {
				return "", err
			}
			s, ok := v.(string)
			if !ok {
				return "", fmt.Errorf("%s: detail %s is %T, not a string", t.file, key, v)
			}
			return s, nil
		},
		"dl": func(key string) ([]any, error) {
			v, err := detail(key)
			if err != nil {
				return nil, err
			}
			l, ok := v.([]any)
			if !ok {
				return nil, fmt.Errorf("%s: detail %s is %T, not a list", t.file, key, v)
			}
			return l, nil
		},
		"num": func(v any, digits int) (string, error) {
			x, ok := v.(float64)
			if !ok {
				return "", fmt.Errorf("%s: %v is %T, not a number", t.file, v, v)
			}
			return Number(x, digits), nil
		},
		"cell": func(s string) string {
			if s == "" {
				return " "
			}
			return " " + s + " "
		},
		"minor": func(version string) (string, error) {
			m := minorRE.FindString(version)
			if m == "" {
				return "", fmt.Errorf("no major.minor in version %q", version)
			}
			return m, nil
		},
	}
	tm, err := template.New(t.file).Option("missingkey=error").Funcs(funcs).Parse(t.tmpl)
	if err != nil {
		return "", fmt.Errorf("template: %w", err)
	}
	var b strings.Builder
	if err := tm.Execute(&b, nil); err != nil {
		return "", err
	}
	return b.String(), nil
}

var minorRE = regexp.MustCompile(`^[0-9]+\.[0-9]+`)

// Number formats v with digits decimals and a comma between thousands:
// Number(2235965.37, 0) is "2,235,965".
func Number(v float64, digits int) string {
	s := strconv.FormatFloat(v, 'f', digits, 64)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return s
	}
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	whole, frac, hasFrac := strings.Cut(s, ".")
	var b strings.Builder
	for i, c := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if hasFrac {
		b.WriteByte('.')
		b.WriteString(frac)
	}
	return sign + b.String()
}
