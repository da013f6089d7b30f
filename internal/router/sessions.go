package router

import (
	"context"
	"log/slog"
	"time"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// sessionWriter is the directory call the recorder needs.
type sessionWriter interface {
	RecordSessions(ctx context.Context, sessions []*kvdirv1.SessionRecord) (*kvdirv1.RecordSessionsResponse, error)
}

// recorder batches session records (session id -> chain tail, length,
// worker) to the directory: one RecordSessions call per interval or per
// full batch. Records are advisory (they feed kvdirctl, not placement), so
// a record that cannot be written is counted and dropped, never retried
// ahead of newer ones.
type recorder struct {
	dir      sessionWriter
	in       chan *kvdirv1.SessionRecord
	interval time.Duration
	maxBatch int
	timeout  time.Duration
	m        *metrics
	group    string // the directory group it writes to (the group label)
	log      *slog.Logger
	done     chan struct{}
}

func newRecorder(dir sessionWriter, interval time.Duration, maxBatch int, m *metrics, log *slog.Logger) *recorder {
	return &recorder{dir: dir, in: make(chan *kvdirv1.SessionRecord, 16*maxBatch), interval: interval,
		maxBatch: maxBatch, timeout: 5 * time.Second, m: m, log: log, done: make(chan struct{})}
}

// add queues rec without blocking; a full queue drops it.
func (r *recorder) add(rec *kvdirv1.SessionRecord) {
	select {
	case r.in <- rec:
	default:
		r.m.sessionsLost.WithLabelValues(r.group).Inc()
	}
}

// run writes batches until ctx ends, then flushes what is queued.
func (r *recorder) run(ctx context.Context) {
	defer close(r.done)
	t := time.NewTicker(r.interval)
	defer t.Stop()
	batch := map[string]*kvdirv1.SessionRecord{}
	flush := func(ctx context.Context) {
		if len(batch) == 0 {
			return
		}
		recs := make([]*kvdirv1.SessionRecord, 0, len(batch))
		for _, rec := range batch {
			recs = append(recs, rec)
		}
		clear(batch)
		cctx, cancel := context.WithTimeout(ctx, r.timeout)
		_, err := r.dir.RecordSessions(cctx, recs)
		cancel()
		if err != nil {
			r.m.sessionBatches.WithLabelValues(r.group, "error").Inc()
			r.m.sessionsLost.WithLabelValues(r.group).Add(float64(len(recs)))
			r.log.Warn("router: recording sessions failed", "sessions", len(recs), "err", err)
			return
		}
		r.m.sessionBatches.WithLabelValues(r.group, "ok").Inc()
	}
	for {
		select {
		case rec := <-r.in:
			batch[rec.GetSessionId()] = rec // the latest turn wins
			if len(batch) >= r.maxBatch {
				flush(ctx)
			}
		case <-t.C:
			flush(ctx)
		case <-ctx.Done():
			for {
				select {
				case rec := <-r.in:
					batch[rec.GetSessionId()] = rec
				default:
					fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					flush(fctx)
					cancel()
					return
				}
			}
		}
	}
}
