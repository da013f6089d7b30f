package simengine

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkEngineVirtual measures the scheduler's own overhead: requests per
// second of wall time on a virtual clock (time scale 0), with up to 512
// requests in flight, each 1,344 prompt tokens (1,280 shareable) and 32
// generated tokens. The prompt generator's cost is included.
func BenchmarkEngineVirtual(b *testing.B) {
	e := mustEngine(b, Config{CapacityBlocks: 32768}, nil)
	p := NewBenchPrompts()
	b.ReportAllocs()
	b.ResetTimer()
	now, submitted, finished := time.Duration(0), 0, 0
	for finished < b.N {
		for submitted < b.N && submitted-finished < 512 {
			if err := e.Submit(now, Request{ID: fmt.Sprint(submitted), Tokens: p.Prompt(submitted), MaxTokens: 32}); err != nil {
				b.Fatal(err)
			}
			submitted++
		}
		res := e.Step(now)
		now = res.End
		finished += len(res.Finished)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	b.ReportMetric(float64(b.N)/now.Seconds(), "modelled-req/s")
}

// BenchmarkRunnerScaleZero measures requests per second through a
// RealtimeRunner at time scale 0, with streams, from one submitter.
func BenchmarkRunnerScaleZero(b *testing.B) {
	r, err := NewRealtimeRunner(Config{Profile: mustProfile(b, "llama3-8b"), CapacityBlocks: 32768}, nil, 0)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	p := NewBenchPrompts()
	b.ReportAllocs()
	b.ResetTimer()
	streams := make(chan *Stream, 512)
	submitErr := make(chan error, 1)
	go func() {
		defer close(streams)
		for i := range b.N {
			s, err := r.Submit(Request{ID: fmt.Sprint(i), Tokens: p.Prompt(i), MaxTokens: 32})
			if err != nil {
				submitErr <- err
				return
			}
			streams <- s
		}
	}()
	for s := range streams {
		if _, _, err := collect(s); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case err := <-submitErr:
		b.Fatal(err)
	default:
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	cancel()
	<-done
}
