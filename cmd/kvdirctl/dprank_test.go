package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// TestWorkerViewShowsDataParallelRank checks that a rank worker's view
// carries its rank (JSON data_parallel_rank, table address#rank) and that
// a worker without one shows neither.
func TestWorkerViewShowsDataParallelRank(t *testing.T) {
	a := &app{now: time.Now}
	ranked := a.workerView(&kvdirv1.Worker{Spec: &kvdirv1.WorkerSpec{Id: "eng-dp1", Address: "http://h:8000", DataParallelRank: proto.Uint32(1)}})
	plain := a.workerView(&kvdirv1.Worker{Spec: &kvdirv1.WorkerSpec{Id: "solo", Address: "http://s:8000"}})
	if got := rankedAddress(ranked); got != "http://h:8000#1" {
		t.Fatalf("ranked address %q, want http://h:8000#1", got)
	}
	if got := rankedAddress(plain); got != "http://s:8000" {
		t.Fatalf("plain address %q, want http://s:8000", got)
	}
	b, _ := json.Marshal(ranked)
	if !strings.Contains(string(b), `"data_parallel_rank":1`) {
		t.Fatalf("ranked JSON %s has no data_parallel_rank 1", b)
	}
	b, _ = json.Marshal(plain)
	if strings.Contains(string(b), "data_parallel_rank") {
		t.Fatalf("plain JSON %s has a data_parallel_rank", b)
	}
}
