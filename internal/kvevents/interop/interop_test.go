package interop

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os/exec"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/agent"
	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/testkit"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// python is Debian's interpreter, named explicitly: another python may come
// first on PATH, without the Debian packages.
const python = "/usr/bin/python3"

const (
	script     = "testdata/vllm_publisher.py"
	topic      = "kv@127.0.0.1@test-model"
	probeTopic = "kv@probe"
	blockSize  = 4
	numBatches = 6
)

var pythonCheck struct {
	once sync.Once
	err  error
	out  []byte
}

// requirePython fails (never skips: CI installs the packages) when Debian's
// python3-zmq or python3-msgpack is missing.
func requirePython(t *testing.T) {
	t.Helper()
	testkit.SkipIfShort(t, "runs python3 with Debian's python3-zmq and python3-msgpack")
	pythonCheck.once.Do(func() {
		pythonCheck.out, pythonCheck.err = exec.Command(python, "-c", "import zmq, msgpack").CombinedOutput()
	})
	if pythonCheck.err != nil {
		t.Fatalf("%s cannot import zmq and msgpack (%v: %s); run `apt-get install python3-zmq python3-msgpack`",
			python, pythonCheck.err, bytes.TrimSpace(pythonCheck.out))
	}
}

// publisher is a running testdata/vllm_publisher.py.
type publisher struct {
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	lines    chan string
	stderr   *testkit.Buffer
	pubEP    string
	replayEP string
}

func startPublisher(t *testing.T, args ...string) *publisher {
	t.Helper()
	requirePython(t)
	cmd := exec.Command(python, append([]string{script}, args...)...)
	p := &publisher{cmd: cmd, lines: make(chan string, 16), stderr: &testkit.Buffer{}}
	cmd.Stderr = p.stderr
	var err error
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s %s: %v", python, script, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	exited := false
	t.Cleanup(func() {
		if !exited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if s := p.stderr.String(); s != "" {
			t.Logf("publisher stderr:\n%s", s)
		}
	})
	line := p.expectLine(t, "READY")
	var pubPort, replayPort int
	if _, err := fmt.Sscanf(line, "READY %d %d", &pubPort, &replayPort); err != nil {
		t.Fatalf("bad READY line %q: %v", line, err)
	}
	p.pubEP = fmt.Sprintf("tcp://127.0.0.1:%d", pubPort)
	p.replayEP = fmt.Sprintf("tcp://127.0.0.1:%d", replayPort)
	t.Cleanup(func() {
		if exited {
			return
		}
		_, _ = io.WriteString(p.stdin, "quit\n")
		_ = p.stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			exited = true
			if err != nil {
				t.Errorf("publisher exited with %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("publisher did not exit after quit")
		}
	})
	return p
}

// expectLine waits for the next stdout line, which must start with prefix.
func (p *publisher) expectLine(t *testing.T, prefix string) string {
	t.Helper()
	select {
	case line, ok := <-p.lines:
		if !ok {
			t.Fatalf("publisher closed stdout before %q; stderr:\n%s", prefix, p.stderr.String())
		}
		if !strings.HasPrefix(line, prefix) {
			t.Fatalf("publisher printed %q, want %q...", line, prefix)
		}
		return line
	case <-time.After(10 * time.Second):
		t.Fatalf("no %q line from publisher; stderr:\n%s", prefix, p.stderr.String())
	}
	return ""
}

func (p *publisher) send(t *testing.T, cmd string) {
	t.Helper()
	if _, err := io.WriteString(p.stdin, cmd+"\n"); err != nil {
		t.Fatalf("write %q to publisher: %v", cmd, err)
	}
}

type interopCase struct {
	form   string // "array" or "map" events
	hashes string // "int" or "bin"
	layout string // replay layout: "old" or "new"
	dpRank int
}

func (c interopCase) String() string {
	return fmt.Sprintf("%s-%s-replay_%s", c.form, c.hashes, c.layout)
}

func TestPythonPublisher(t *testing.T) {
	requirePython(t)
	cases := []interopCase{
		{"array", "int", "new", 0},
		{"array", "int", "old", 1},
		{"map", "int", "new", 2},
		{"map", "int", "old", 0},
		{"array", "bin", "new", 0},
		{"map", "bin", "old", 3},
	}
	// Content hashes do not depend on the wire form: every case must
	// translate to the directory events of the array/int reference batches.
	ref := translate(t, expectedBatches("array", "int", 0))
	if len(ref) == 0 {
		t.Fatal("reference translation is empty")
	}
	for _, c := range cases {
		t.Run(c.String(), func(t *testing.T) {
			t.Parallel()
			runCase(t, c, ref)
		})
	}
}

func runCase(t *testing.T, c interopCase, ref []*kvdirv1.Event) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	p := startPublisher(t, "--topic", topic, "--form", c.form, "--hashes", c.hashes,
		"--replay-layout", c.layout, "--dp-rank", fmt.Sprint(c.dpRank))

	sub, err := kvevents.NewSubscriber(ctx, kvevents.SubscriberConfig{Endpoint: p.pubEP, Topic: "kv@"})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()

	// Slow joiner: the publisher sends probes until told to start; a probe
	// proves the subscription reached libzmq's PUB socket.
	m, err := sub.Recv(ctx)
	if err != nil {
		t.Fatalf("waiting for a probe: %v", err)
	}
	if m.Topic != probeTopic || len(m.Payload) != 0 {
		t.Fatalf("first message: topic %q, %d payload bytes; want a probe", m.Topic, len(m.Payload))
	}
	p.send(t, "start")

	live := make([]kvevents.Msg, 0, numBatches)
	for len(live) < numBatches {
		m, err := sub.Recv(ctx)
		if err != nil {
			t.Fatalf("after %d batches: %v", len(live), err)
		}
		switch m.Topic {
		case probeTopic: // sent before "start" was read
			if len(live) > 0 {
				t.Fatalf("probe after batch %d", len(live))
			}
		case topic:
			if m.Seq != uint64(len(live)) {
				t.Fatalf("batch %d has seq %d", len(live), m.Seq)
			}
			live = append(live, m)
		default:
			t.Fatalf("unexpected topic %q (seq %d)", m.Topic, m.Seq)
		}
	}
	p.expectLine(t, "PUBLISHED 6")
	if st := sub.Stats(); st.Malformed != 0 || st.Filtered != 0 {
		// libzmq's PUB filters by the subscription zmq4 sent it, so the
		// "xx@other" messages never arrive.
		t.Errorf("subscriber stats %+v: want no malformed or locally filtered messages", st)
	}

	want := expectedBatches(c.form, c.hashes, c.dpRank)
	got := make([]kvevents.Batch, numBatches)
	for i, m := range live {
		got[i] = decode(t, fmt.Sprintf("live seq %d", m.Seq), m.Payload)
		checkBatch(t, fmt.Sprintf("live seq %d", i), got[i], want[i])
	}
	if tr := translate(t, got); !eventsEqual(tr, ref) {
		t.Errorf("directory events differ from the reference:\n got %v\nwant %v", tr, ref)
	}

	// Replay through libzmq's ROUTER with zmq4's DEALER. Several requests on
	// fresh DEALERs, including an empty range (end marker only).
	wantTopic := topic
	if c.layout == "old" {
		wantTopic = ""
	}
	for _, from := range []uint64{2, 0, numBatches - 1, numBatches, 1 << 40} {
		msgs, err := kvevents.Replay(ctx, p.replayEP, from)
		if err != nil {
			t.Fatalf("replay from %d: %v (got %d)", from, err, len(msgs))
		}
		wantN := 0
		if from < numBatches {
			wantN = numBatches - int(from)
		}
		if len(msgs) != wantN {
			t.Fatalf("replay from %d: %d batches, want %d", from, len(msgs), wantN)
		}
		for i, m := range msgs {
			seq := from + uint64(i)
			if m.Seq != seq || m.Topic != wantTopic {
				t.Fatalf("replay from %d, item %d: seq %d topic %q; want seq %d topic %q", from, i, m.Seq, m.Topic, seq, wantTopic)
			}
			if !bytes.Equal(m.Payload, live[seq].Payload) {
				t.Fatalf("replay from %d: payload of seq %d differs from the live one", from, seq)
			}
			checkBatch(t, fmt.Sprintf("replayed seq %d", seq), decode(t, "replay", m.Payload), want[seq])
		}
	}
}

func decode(t *testing.T, what string, payload []byte) kvevents.Batch {
	t.Helper()
	b, st, err := kvevents.DecodeBatch(payload)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if st.Malformed != 0 || st.Unknown != 0 || len(st.Problems) != 0 {
		t.Fatalf("%s: decode stats %+v", what, st)
	}
	return b
}

func checkBatch(t *testing.T, what string, got, want kvevents.Batch) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n got %s\nwant %s", what, describe(got), describe(want))
	}
}

// describe formats a batch with pointers followed, for failure messages.
func describe(b kvevents.Batch) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "ts=%v dp=%s events:", b.TS, ptr(b.DPRank))
	for _, ev := range b.Events {
		switch e := ev.(type) {
		case *kvevents.BlockStored:
			fmt.Fprintf(&sb, " Stored{hashes=%v parent=%s tokens=%v bs=%d lora=%s medium=%q name=%q extra=%#v group=%s kind=%q}",
				e.BlockHashes, ptr(e.Parent), e.TokenIDs, e.BlockSize, ptr(e.LoRAID), e.Medium, e.LoRAName,
				e.ExtraKeys, ptr(e.GroupIdx), e.SpecKind)
		case *kvevents.BlockRemoved:
			fmt.Fprintf(&sb, " Removed{hashes=%v medium=%q group=%s}", e.BlockHashes, e.Medium, ptr(e.GroupIdx))
		default:
			fmt.Fprintf(&sb, " %T", ev)
		}
	}
	return sb.String()
}

func ptr[T any](p *T) string {
	if p == nil {
		return "nil"
	}
	return fmt.Sprint(*p)
}

func pto[T any](v T) *T { return &v }

// expectedBatches mirrors batches() in testdata/vllm_publisher.py.
func expectedBatches(form, hashKind string, dpRank int) []kvevents.Batch {
	var h []kvevents.Hash
	if hashKind == "int" {
		h = []kvevents.Hash{
			kvevents.HashFromUint64(0x1234),
			kvevents.HashFromUint64(1 << 63),
			kvevents.HashFromInt64(-12345),
			kvevents.HashFromUint64(math.MaxUint64),
			kvevents.HashFromInt64(math.MinInt64),
			kvevents.HashFromUint64(math.MaxInt64),
		}
	} else {
		for i := range 6 {
			d := sha256.Sum256(fmt.Appendf(nil, "block-%d", i))
			if i == 5 {
				h = append(h, kvevents.HashFromBytes(d[:16]))
			} else {
				h = append(h, kvevents.HashFromBytes(d[:]))
			}
		}
	}
	var group *int
	kind := ""
	if form == "map" {
		group, kind = pto(0), kvevents.SpecKindFullAttention
	}
	stored := func(hashes []kvevents.Hash, parent *kvevents.Hash, tokens []uint32, loraID *int64, medium, loraName string, extra [][]any) *kvevents.BlockStored {
		return &kvevents.BlockStored{
			BlockHashes: hashes, Parent: parent, TokenIDs: tokens, BlockSize: blockSize,
			LoRAID: loraID, Medium: medium, LoRAName: loraName, ExtraKeys: extra,
			GroupIdx: group, SpecKind: kind,
		}
	}
	removed := func(hashes []kvevents.Hash, medium string) *kvevents.BlockRemoved {
		return &kvevents.BlockRemoved{BlockHashes: hashes, Medium: medium, GroupIdx: group}
	}
	events := [][]kvevents.Event{
		{stored(h[0:2], nil, []uint32{0, 1, 2, 3, 4, 5, 6, 7}, nil, "GPU", "", nil)},
		{stored(h[2:3], &h[1], []uint32{8, 9, 10, 11}, pto(int64(7)), "GPU", "adapter-a", [][]any{{"adapter-a"}})},
		{removed(h[0:1], "GPU"), stored(h[3:4], &h[2], []uint32{127, 128, 65535, math.MaxUint32}, nil, "CPU", "", [][]any{nil})},
		{&kvevents.AllBlocksCleared{}},
		{stored(h[4:6], nil, []uint32{100000, 70000, 255, 256, 0, 1, 2, 3}, nil, "", "", [][]any{{"salt-x"}, nil})},
		{removed(h[4:5], "GPU"), removed(h[5:6], "")},
	}
	out := make([]kvevents.Batch, len(events))
	for i, evs := range events {
		out[i] = kvevents.Batch{TS: 1700000000.5 + float64(i), Events: evs, DPRank: pto(dpRank)}
	}
	return out
}

// translate runs batches through the agent's translator, which computes the
// content hashes the directory stores.
func translate(t *testing.T, batches []kvevents.Batch) []*kvdirv1.Event {
	t.Helper()
	tr := agent.NewTranslator("test-model", 0, slog.New(slog.DiscardHandler))
	var out []*kvdirv1.Event
	for _, b := range batches {
		out, _ = tr.Translate(out, b)
	}
	if st := tr.Stats(); st.BlocksStored == 0 {
		t.Fatalf("translator stored no blocks: %+v", st)
	}
	return out
}

func eventsEqual(a, b []*kvdirv1.Event) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}
