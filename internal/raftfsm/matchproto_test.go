package raftfsm

import (
	"testing"

	"github.com/kvdir/kvdir/internal/radix"
)

// The API's match carries every run the index reports, the GPU-or-CPU run
// included (the router's tier split needs it).
func TestWorkerMatchProto(t *testing.T) {
	m := radix.WorkerMatch{Worker: "w", Blocks: 9, Media: [radix.NumMedia]int{2, 0, 9, 0}, GPUOrCPU: 6}
	p := WorkerMatchProto(m, 16)
	if p.WorkerId != "w" || p.Blocks != 9 || p.GpuBlocks != 2 || p.CpuBlocks != 0 || p.DiskBlocks != 9 ||
		p.GpuOrCpuBlocks != 6 || p.Tokens != 144 {
		t.Fatalf("proto %v", p)
	}
}
