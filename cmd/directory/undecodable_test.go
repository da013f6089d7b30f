package main

import (
	"context"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvdir/kvdir/internal/testkit"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// runNode runs the command in this process with args; it returns the
// signal channel, the exit status once run returns, and its log.
func runNode(args []string) (chan os.Signal, chan int, *testkit.Buffer) {
	sigs := make(chan os.Signal, 2)
	exit := make(chan int, 1)
	var out testkit.Buffer
	go func() { exit <- run(args, nil, &out, &out, sigs) }()
	return sigs, exit, &out
}

func nodeStatus(t *testing.T, api string) (*kvdirv1.StatusResponse, error) {
	t.Helper()
	cc, err := grpc.NewClient(api, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return kvdirv1.NewAdminServiceClient(cc).Status(ctx, &kvdirv1.StatusRequest{})
}

func waitExit(t *testing.T, exit chan int, out *testkit.Buffer, what string) int {
	t.Helper()
	select {
	case code := <-exit:
		return code
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: run did not return; log:\n%s", what, out.String())
		return 0
	}
}

// TestUndecodableEntryExitsThenSkips runs the command on one node whose
// Raft port (plain TCP) gets a forged AppendEntries carrying an entry no
// build decodes: the node stops with exit 1 naming the index and the flag,
// refuses to start again as it was, and starts, leads and applies past the
// entry with --skip-undecodable-entry.
func TestUndecodableEntryExitsThenSkips(t *testing.T) {
	testkit.SkipIfShort(t, "runs a node three times")
	dir := t.TempDir()
	addrs := testkit.FreeAddrs(t, 2)
	args := []string{"--node-id", "n1", "--bootstrap", "--data-dir", dir, "--raft-addr", addrs[0], "--api-addr", addrs[1],
		"--http-addr", "off", "--heartbeat-timeout", "100ms", "--election-timeout", "100ms"}

	_, exit, out := runNode(args)
	var st *kvdirv1.StatusResponse
	testkit.Eventually(t, 15*time.Second, "the node to lead with its log committed and applied", func() (bool, string) {
		var err error
		if st, err = nodeStatus(t, addrs[1]); err != nil {
			return false, err.Error()
		}
		return st.State == "Leader" && st.AppliedIndex > 0 && st.CommitIndex == st.LastLogIndex && st.AppliedIndex == st.LastLogIndex, st.String()
	})
	tr, err := raft.NewTCPTransport("127.0.0.1:0", nil, 1, 2*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	term, last := st.Term+10, st.LastLogIndex // the last entry is the leader's own command, of its term
	var resp raft.AppendEntriesResponse
	lastTerm := st.Term
	if err := tr.AppendEntries("intruder", raft.ServerAddress(addrs[0]), &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("intruder"), Addr: []byte(tr.LocalAddr())},
		Term:      term, PrevLogEntry: last, PrevLogTerm: lastTerm, LeaderCommitIndex: last + 1,
		Entries: []*raft.Log{{Index: last + 1, Term: term, Type: raft.LogCommand, Data: []byte{0xff, 0xff, 0xff}}},
	}, &resp); err != nil || !resp.Success {
		t.Fatalf("forged AppendEntries: %v, success %v (the node's last entry %d, term %d)", err, resp.Success, last, lastTerm)
	}
	bad := strconv.FormatUint(last+1, 10)
	if code := waitExit(t, exit, out, "after the undecodable entry"); code != exitError {
		t.Fatalf("exit %d after the undecodable entry, want %d; log:\n%s", code, exitError, out.String())
	}
	for _, want := range []string{"stopping: a committed log entry cannot be decoded", "index=" + bad, "--skip-undecodable-entry " + bad} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, out.String())
		}
	}

	_, exit, out = runNode(args)
	if code := waitExit(t, exit, out, "restart as it was"); code != exitError {
		t.Fatalf("restart as it was: exit %d, want %d; log:\n%s", code, exitError, out.String())
	}
	for _, want := range []string{"refusing to start: this node stopped at a log entry it cannot decode", "index=" + bad, "--skip-undecodable-entry " + bad} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("log of the refused restart lacks %q:\n%s", want, out.String())
		}
	}

	sigs, exit, out := runNode(append(args, "--skip-undecodable-entry", bad))
	defer func() {
		if t.Failed() {
			t.Logf("log:\n%s", out.String())
		}
	}()
	testkit.Eventually(t, 15*time.Second, "the node to lead past the skipped entry", func() (bool, string) {
		select {
		case code := <-exit:
			t.Fatalf("run returned %d early", code)
		default:
		}
		st, err := nodeStatus(t, addrs[1])
		if err != nil {
			return false, err.Error()
		}
		return st.State == "Leader" && st.AppliedIndex >= last+1, st.String() // the skipped entry counts as applied
	})
	sigs <- syscall.SIGTERM
	if code := waitExit(t, exit, out, "SIGTERM"); code != exitOK {
		t.Fatalf("exit %d after SIGTERM, want 0", code)
	}
	if !strings.Contains(out.String(), "skipped an undecodable log entry as told") {
		t.Errorf("log lacks the skip")
	}
}
