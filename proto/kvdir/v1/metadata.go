package kvdirv1

// gRPC metadata keys of the kvdir API (hand-written, beside the generated
// code, so that servers and clients share them).
const (
	// MetadataLeader is set on responses to the leader's API address, when
	// the answering node knows it, so that clients can send writes there.
	MetadataLeader = "kvdir-leader"
	// MetadataWorkerToken carries, on Publish, Heartbeat and Deregister, the
	// token that Register returned for the worker.
	MetadataWorkerToken = "kvdir-worker-token"
	// MetadataForwarded marks a request a follower forwarded to the leader;
	// a node that is not the leader refuses it rather than forward it again.
	MetadataForwarded = "kvdir-forwarded"
	// MetadataRelay marks a Share stream a node opened to another node to
	// relay its routers' placement intents; its value is the relaying
	// node's id. Intents a node got by relay are not relayed again.
	MetadataRelay = "kvdir-relay"
)
