package node

import (
	"errors"
	"syscall"
	"testing"

	"github.com/hashicorp/raft"
)

// fullDisk is a snapshot store on a disk with no space left.
type fullDisk struct{ raft.SnapshotStore }

func (fullDisk) Create(raft.SnapshotVersion, uint64, uint64, raft.Configuration, uint64, raft.Transport) (raft.SnapshotSink, error) {
	return nil, syscall.ENOSPC
}

// shortSink accepts a snapshot but cannot write its bytes.
type shortSink struct{ raft.SnapshotStore }

func (s shortSink) Create(v raft.SnapshotVersion, i, t uint64, c raft.Configuration, ci uint64, tr raft.Transport) (raft.SnapshotSink, error) {
	sink, err := s.SnapshotStore.Create(v, i, t, c, ci, tr)
	return failingSink{sink}, err
}

type failingSink struct{ raft.SnapshotSink }

func (failingSink) Write([]byte) (int, error) { return 0, syscall.ENOSPC }

func TestSnapshotWriteFailuresAreRecorded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store raft.SnapshotStore
	}{
		{"create", fullDisk{raft.NewInmemSnapshotStore()}},
		{"write", shortSink{raft.NewInmemSnapshotStore()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var box errorBox
			s := &recordingSnapshotStore{SnapshotStore: tc.store, failed: &box}
			if box.get() != nil {
				t.Fatal("a failure before any write")
			}
			sink, err := s.Create(raft.SnapshotVersionMax, 1, 1, raft.Configuration{}, 1, nil)
			if err == nil {
				_, err = sink.Write([]byte("state"))
				_ = sink.Cancel()
			}
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("err = %v, want ENOSPC", err)
			}
			if got := box.get(); !errors.Is(got, syscall.ENOSPC) {
				t.Fatalf("recorded %v, want the snapshot store's ENOSPC (readiness and status read it)", got)
			}
		})
	}
}

func TestSnapshotSuccessRecordsNothing(t *testing.T) {
	var box errorBox
	s := &recordingSnapshotStore{SnapshotStore: raft.NewInmemSnapshotStore(), failed: &box}
	sink, err := s.Create(raft.SnapshotVersionMax, 1, 1, raft.Configuration{}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sink.Write([]byte("state")); err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	if got := box.get(); got != nil {
		t.Fatalf("recorded %v after a good snapshot", got)
	}
}
