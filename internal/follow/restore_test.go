package follow_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvdir/kvdir/internal/follow"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// scriptedNode is a DirectoryService whose Follow streams play a script:
// call i sends the snapshot snaps[i] in small chunks, all of it or only
// its first half, then fails the stream. Past the script a stream stays
// open and silent.
type scriptedNode struct {
	kvdirv1.UnimplementedDirectoryServiceServer
	snaps []scriptedSnapshot
	calls atomic.Int32
}

type scriptedSnapshot struct {
	data  []byte
	index uint64
	whole bool
}

const scriptChunk = 512

func (s *scriptedNode) Follow(_ *kvdirv1.FollowRequest, stream kvdirv1.DirectoryService_FollowServer) error {
	i := int(s.calls.Add(1)) - 1
	if i >= len(s.snaps) {
		<-stream.Context().Done()
		return nil
	}
	sn := s.snaps[i]
	data := sn.data
	if !sn.whole {
		data = data[:len(data)/2]
	}
	for len(data) > 0 {
		chunk := data[:min(len(data), scriptChunk)]
		data = data[len(chunk):]
		last := sn.whole && len(data) == 0
		if err := stream.Send(&kvdirv1.FollowResponse{CommitIndex: sn.index,
			Payload: &kvdirv1.FollowResponse_Snapshot{Snapshot: &kvdirv1.FollowSnapshot{Data: chunk, Index: sn.index, Last: last}}}); err != nil {
			return err
		}
	}
	return status.Error(codes.Unavailable, "scripted failure")
}

func serveScript(t *testing.T, s *scriptedNode) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	kvdirv1.RegisterDirectoryServiceServer(srv, s)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// TestSnapshotDecodedAsItArrives restores a snapshot sent in many small
// chunks, then one that breaks off halfway: the first is in place with its
// size and index reported, and the broken one leaves it untouched.
func TestSnapshotDecodedAsItArrives(t *testing.T) {
	c := dirtest.New(t, 3, nil)
	p := c.NewPublisher("w1", 1)
	publish(t, 40, p)
	c.Converged()
	n := c.Node(c.Leader()).FSM()
	var first bytes.Buffer
	firstIndex, err := n.WriteStateIndex(&first)
	if err != nil {
		t.Fatal(err)
	}
	wantDigest := n.Digest()
	publish(t, 40, p)
	c.Converged()
	var second bytes.Buffer
	secondIndex, err := n.WriteStateIndex(&second)
	if err != nil {
		t.Fatal(err)
	}
	if first.Len() < 4*scriptChunk || secondIndex <= firstIndex {
		t.Fatalf("snapshots of %d bytes at %d and %d: too small to split, or not apart", first.Len(), firstIndex, secondIndex)
	}

	script := &scriptedNode{snaps: []scriptedSnapshot{
		{data: first.Bytes(), index: firstIndex, whole: true},
		{data: second.Bytes(), index: secondIndex, whole: false},
	}}
	addr := serveScript(t, script)
	var mu sync.Mutex
	var applied []uint64
	f, err := follow.New(follow.Config{Addrs: []string{addr}, RetryMin: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond,
		Logger: testkit.Logger(t), OnApplied: func(i uint64) { mu.Lock(); applied = append(applied, i); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	defer func() { cancel(); <-done }()

	testkit.Eventually(t, 10*time.Second, "the scripted streams to be played", func() (bool, string) {
		return script.calls.Load() > int32(len(script.snaps)), fmt.Sprint(script.calls.Load(), " streams opened")
	})
	if !f.Synced() || f.AppliedIndex() != firstIndex || f.Digest() != wantDigest {
		t.Fatalf("after a snapshot broken off: synced %v, index %d digest %016x; want the first snapshot's %d %016x",
			f.Synced(), f.AppliedIndex(), f.Digest(), firstIndex, wantDigest)
	}
	if f.Snapshots() != 1 {
		t.Fatalf("restored %d snapshots, want 1", f.Snapshots())
	}
	rs, ok := f.LastRestore()
	if !ok || rs.Index != firstIndex || rs.Bytes != int64(first.Len()) {
		t.Fatalf("LastRestore: %+v %v, want index %d, %d bytes", rs, ok, firstIndex, first.Len())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(applied) != 1 || applied[0] != firstIndex {
		t.Fatalf("OnApplied saw %v, want [%d]", applied, firstIndex)
	}
}

// TestSilentNodeIsLeft follows a node whose stream opens and then stays
// silent (a node cut off, or a network that drops packets), listed before
// a live one: past Config.Silence the follower leaves it and syncs from
// the live node.
func TestSilentNodeIsLeft(t *testing.T) {
	silent := serveScript(t, &scriptedNode{})
	c := dirtest.New(t, 1, nil)
	p := c.NewPublisher("w1", 1)
	publish(t, 5, p)
	f, err := follow.New(follow.Config{Addrs: []string{silent, c.APIAddr(c.Leader())}, Silence: 300 * time.Millisecond,
		RetryMin: 10 * time.Millisecond, Logger: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	r := &running{Follower: f}
	r.run(t)
	live := c.APIAddr(c.Leader())
	testkit.Eventually(t, 10*time.Second, "the follower to leave the silent node and sync from the live one", func() (bool, string) {
		v := f.View()
		return v.Synced && v.Node == live, fmt.Sprintf("%+v", v)
	})
	matchesAcked(t, r, p)
}
