package node

import (
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// The API server decodes with gRPC's protobuf codec, except the requests
// of a Publish stream on the leader: a worker flooding past its block quota
// would otherwise have every block it sends materialised only for the
// leader to cut it before proposing. publishCodec decodes those without the
// blocks past the quota (raftfsm.FSM.TrimBatchWire) and says how many it
// cut, which the proposal carries like the leader's own cut.

// publishFrame is what the Publish handler receives into on the leader.
type publishFrame struct {
	req *kvdirv1.PublishRequest
	cut uint64 // blocks cut from req.batch's stored events past the quota
}

// publishCodec is the API server's codec.
type publishCodec struct {
	n   *Node
	std encoding.CodecV2
}

func newPublishCodec(n *Node) publishCodec {
	return publishCodec{n: n, std: encoding.GetCodecV2(grpcproto.Name)}
}

func (c publishCodec) Name() string { return c.std.Name() }

func (c publishCodec) Marshal(v any) (mem.BufferSlice, error) { return c.std.Marshal(v) }

func (c publishCodec) Unmarshal(data mem.BufferSlice, v any) error {
	fr, ok := v.(*publishFrame)
	if !ok {
		return c.std.Unmarshal(data, v)
	}
	pool := mem.DefaultBufferPool()
	buf := data.MaterializeToBuffer(pool)
	defer buf.Free()
	src := buf.ReadOnlyData()
	if batch, ok := soleBatch(src); ok {
		var scratch *[]byte
		trimmed, cut, ok := c.n.fsm.TrimBatchWire(batch, c.n.pub.freed, func(size int) []byte {
			scratch = pool.Get(size)
			return *scratch
		})
		if scratch != nil {
			defer pool.Put(scratch)
		}
		if ok {
			fr.req.Batch = new(kvdirv1.EventBatch)
			if err := proto.Unmarshal(trimmed, fr.req.Batch); err != nil {
				return err
			}
			fr.cut = cut
			return nil
		}
	}
	return proto.Unmarshal(src, fr.req)
}

// soleBatch returns the encoded batch of a PublishRequest that holds
// nothing else.
func soleBatch(b []byte) ([]byte, bool) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 || num != 1 || typ != protowire.BytesType {
		return nil, false
	}
	v, m := protowire.ConsumeBytes(b[n:])
	if m < 0 || n+m != len(b) {
		return nil, false
	}
	return v, true
}
