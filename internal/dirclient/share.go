package dirclient

import (
	"context"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// ShareStream is an open DirectoryService.Share stream and the node it
// goes to.
type ShareStream struct {
	kvdirv1.DirectoryService_ShareClient
	// Addr is the node's API address.
	Addr string
	c    *Client
}

// OpenShare opens a Share stream (placement intents between routers, see
// the directory's API) on the node that answered last, or the next one in
// turn when that one recently failed. The stream lives until ctx ends or
// it breaks; the caller sends its first message, and reports how the
// stream ended with Broke so that the next one goes elsewhere.
func (c *Client) OpenShare(ctx context.Context) (*ShareStream, error) {
	addr := c.order(false)[0]
	cc, err := c.conn(addr)
	if err != nil {
		return nil, err
	}
	s, err := kvdirv1.NewDirectoryServiceClient(cc).Share(c.outgoing(ctx, nil))
	if err != nil {
		c.failed(addr)
		return nil, c.finalError("share", addr, err)
	}
	return &ShareStream{DirectoryService_ShareClient: s, Addr: addr, c: c}, nil
}

// Answered records that the stream's node answered (so reads prefer it).
func (s *ShareStream) Answered() { s.c.answered(s.Addr) }

// Broke records that the stream's node failed, so that the next stream
// and the next calls try another node first.
func (s *ShareStream) Broke() { s.c.failed(s.Addr) }
