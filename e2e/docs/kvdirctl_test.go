package docs

import (
	"encoding/json"
	"regexp"
	"testing"
	"time"
)

var regexp150 = regexp.MustCompile(`chat-7f3a .*/150 `)

const kvcDir = "127.0.0.1:7001,127.0.0.1:7011,127.0.0.1:7021"

type workerRow struct {
	ID                  string   `json:"id"`
	State               string   `json:"state"`
	Epoch               int      `json:"epoch"`
	Blocks              int      `json:"blocks"`
	Running             int      `json:"running"`
	PrefixQueries       int      `json:"prefix_queries"`
	HeartbeatAgeSeconds *float64 `json:"heartbeat_age_seconds"`
}

// workersNow reads kvdirctl workers --all -o json through the leader's view.
func workersNow() map[string]workerRow {
	var out struct {
		Workers []workerRow `json:"workers"`
	}
	_ = json.Unmarshal([]byte(kvdirctl("-d", kvcDir, "workers", "--all", "-o", "json")), &out)
	m := map[string]workerRow{}
	for _, w := range out.Workers {
		m[w.ID] = w
	}
	return m
}

// kvdirctlGuide runs cmd/kvdirctl/README.md in the order of its capture,
// as "The cluster behind the examples" describes it, waiting before each
// step for the state the capture shows.
func kvdirctlGuide(t *testing.T, rw, undo func(string) string) {
	ready := func(t *testing.T) {
		waitCond(t, "both workers registered", 30*time.Second, func() bool {
			w := workersNow()
			return w["enginesim-0"].State == "ACTIVE" && w["enginesim-1"].State == "ACTIVE"
		})
		leaderIs(kvcDir, "n2")(t, nil)
	}
	heartbeats := func(t *testing.T) {
		// The blocks of both workers and a heartbeat after the traffic.
		waitCond(t, "the traffic's blocks and a heartbeat of each agent", 30*time.Second, func() bool {
			w := workersNow()
			return w["enginesim-0"].Blocks == 3 && w["enginesim-1"].Blocks == 9 &&
				w["enginesim-0"].PrefixQueries > 0 && w["enginesim-1"].PrefixQueries > 0
		})
		waitSession(kvcDir, "agent-run-0042")(t, nil)
	}
	turn3 := func(t *testing.T) {
		waitCond(t, "turn 3 recorded", 20*time.Second, func() bool {
			return regexp150.MatchString(kvdirctl("-d", kvcDir, "sessions", "--prefix", "chat"))
		})
	}
	loaded := func(t *testing.T) {
		waitCond(t, "enginesim-1's agent reporting 48 running", 60*time.Second, func() bool {
			return workersNow()["enginesim-1"].Running == 48
		})
	}
	freshHeartbeat := func(t *testing.T) {
		// The capture's who-holds came before enginesim-0's next heartbeat
		// re-registered it: expire right after one.
		waitCond(t, "a heartbeat of enginesim-0 just now", 20*time.Second, func() bool {
			h := workersNow()["enginesim-0"].HeartbeatAgeSeconds
			return h != nil && *h < 0.3
		})
	}
	reregistered := func(t *testing.T) {
		waitCond(t, "enginesim-0 registered again", 20*time.Second, func() bool {
			w := workersNow()["enginesim-0"]
			return w.State == "ACTIVE" && w.Epoch == 2 && w.HeartbeatAgeSeconds != nil
		})
	}
	finished := func(t *testing.T) {
		waitCond(t, "the 48 requests finished", 120*time.Second, func() bool {
			return workersNow()["enginesim-1"].Running == 0
		})
	}
	g := guide{file: "cmd/kvdirctl/README.md", rewrite: rw, undo: undo, order: []seq{
		{first: "make bin             # ./bin/kvdirctl, with the other binaries"},
		{first: "export PATH=$PWD/bin:$PATH"},
		{first: `chat() { curl -s localhost:8080/v1/chat/completions -H 'Content-Type: application/json' -H "X-Session-Id: $1" -d @$2; sleep 0.3; }`, before: ready},
		{first: "curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' -d @docs/examples/turn1.json"},
		{first: "kvdirctl members list", before: heartbeats},
		{first: "kvdirctl workers"},
		{first: "kvdirctl workers get enginesim-1 --top 5"},
		{first: "kvdirctl workers get enginesim-0 --top 2 -o yaml"},
		{first: "kvdirctl sessions"},
		{first: "kvdirctl match --messages docs/examples/turn3.json"},
		{first: "kvdirctl match --model llama3-8b --system 'You are a concise assistant for an LLM serving team. Answer in one sentence, and name the metric that shows it.' --chat 'What does a prefix cache save, and how would I see it on a dashboard?'"},
		{first: "kvdirctl explain --messages docs/examples/turn3.json --session chat-7f3a"},
		{first: `curl -s -D /tmp/hdr.txt localhost:8080/v1/chat/completions -H 'Content-Type: application/json' -H 'X-Session-Id: chat-7f3a' -H "X-Kvdir-Explain-Token: $KVDIR_CTL_EXPLAIN_TOKEN" -d @docs/examples/turn3.json | python3 -c "import json,sys;print(json.dumps(json.load(sys.stdin)['usage']))"; grep -i x-kvdir /tmp/hdr.txt`},
		{first: "kvdirctl sessions --prefix chat -o json", before: turn3},
		{first: "long=$(printf 'word%d ' $(seq 900))"},
		{first: "kvdirctl workers", nth: 2, before: loaded},
		{first: "kvdirctl who-holds chat-7f3a"},
		{first: "kvdirctl explain --messages docs/examples/turn3.json --session chat-7f3a", nth: 2},
		{first: "kvdirctl drain enginesim-1"},
		{first: "kvdirctl workers", nth: 3},
		{first: "kvdirctl expire enginesim-0", before: freshHeartbeat},
		{first: "kvdirctl workers --all"},
		{first: "kvdirctl who-holds chat-7f3a", nth: 2},
		{first: "kvdirctl workers --all", nth: 2, before: reregistered},
		{first: "kvdirctl snapshot"},
		{first: "kvdirctl leader transfer n3"},
		// The 48 long requests store blocks until they finish; the capture
		// was taken once they had, when the nodes stood at one index.
		{first: "kvdirctl status", before: finished},
		{first: "kvdirctl -d 127.0.0.1:7901,127.0.0.1:7911 --timeout 2s sessions"},
		{first: "kvdirctl who-holds chat-0000"},
		{first: "kvdirctl workers get enginesim-9"},
		{first: "kvdirctl who-holds"},
		{first: "kvdirctl match --chat hi --tokens 1,2"},
		{first: "kvdirctl explain --router http://127.0.0.1:8090 --messages docs/examples/turn3.json"},
		{first: "kill -9 $(cat /tmp/kvc/n1.pid)", before: finished},
		{first: "export KVDIR_CTL_DIRECTORY=127.0.0.1:7001,127.0.0.1:7011,127.0.0.1:7021"},
		{first: "kvdirctl sessions --prefix chat"},
		{first: "kvdirctl status", nth: 2},
	}}
	g.run(t, newShell(t, "KVDIR_CTL_DIRECTORY="+kvcDir))
}
