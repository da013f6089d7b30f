package dirclient

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// watchRetryMax bounds the pause between reconnections of a watch.
const watchRetryMax = 2 * time.Second

// callbackError marks an error returned by a watch callback.
type callbackError struct{ err error }

func (e callbackError) Error() string { return e.err.Error() }

// WatchWorkers streams the workers of a model (all models if empty) to fn:
// first a message with every worker (Snapshot set), then the workers that
// changed. When the stream breaks it reconnects, to another node if need
// be, and the first message on the new stream is a snapshot again, which
// replaces everything fn was told before. fn runs on the caller's
// goroutine; an error from it ends the watch and is returned as is.
// WatchWorkers blocks until ctx ends (returning ctx.Err()), fn fails, or the
// directory refuses the watch (an error another node would repeat, such as
// a missing token).
func (c *Client) WatchWorkers(ctx context.Context, model string, fn func(*kvdirv1.WatchWorkersResponse) error) error {
	delay := retryBase
	for {
		addrs := c.order(false)
		addr := addrs[0]
		got, err := c.watchOnce(ctx, addr, model, fn)
		var cbErr callbackError
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.As(err, &cbErr):
			return cbErr.err
		case errors.Is(err, io.EOF), status.Code(err) == codes.Unavailable:
		default:
			return c.finalError("watch workers", addr, err)
		}
		c.failed(addr)
		c.noteError(addr, err)
		if got {
			delay = retryBase
		}
		c.log.Info("dirclient: worker watch broke; reconnecting", "addr", addr, "err", err, "retry_in", delay)
		if !sleep(ctx, delay) {
			return ctx.Err()
		}
		delay = min(2*delay, watchRetryMax)
	}
}

// watchOnce runs one WatchWorkers stream; got reports whether it delivered
// anything.
func (c *Client) watchOnce(ctx context.Context, addr, model string, fn func(*kvdirv1.WatchWorkersResponse) error) (got bool, err error) {
	cc, err := c.conn(addr)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := kvdirv1.NewDirectoryServiceClient(cc).WatchWorkers(c.outgoing(ctx, nil), &kvdirv1.WatchWorkersRequest{Model: model})
	if err != nil {
		return false, err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return got, err
		}
		if !got {
			got = true
			c.answered(addr)
			if md, err := stream.Header(); err == nil {
				c.noteHeader(md)
			}
		}
		if err := fn(resp); err != nil {
			return got, callbackError{err}
		}
	}
}
