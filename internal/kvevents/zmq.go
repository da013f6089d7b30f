package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"
)

// EndSeq is the sequence number of the replay end marker: -1 as a signed
// 8-byte big-endian value, i.e. FF FF FF FF FF FF FF FF.
const EndSeq uint64 = math.MaxUint64

// ErrBadFrames is wrapped by errors about ZMQ messages whose frames do not
// follow the live (topic, seq8, payload) or replay layouts.
var ErrBadFrames = errors.New("malformed zmq message")

// ErrClosed is returned by operations on a closed Publisher or Subscriber.
var ErrClosed = errors.New("kvevents: closed")

// Msg is one live or replayed message.
type Msg struct {
	// Topic is the first frame (empty in the old replay layout).
	Topic string
	// Seq is the batch sequence number.
	Seq uint64
	// Payload is the msgpack-encoded batch; decode it with DecodeBatch.
	Payload []byte
}

// PublisherBinds reports whether vLLM's PUB socket binds (true) or connects
// (false) to endpoint: it binds if the endpoint contains "*" or "::" or
// starts with ipc:// or inproc://. A subscriber must do the opposite.
func PublisherBinds(endpoint string) bool {
	return strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://")
}

// OffsetEndpoint returns the endpoint a data-parallel rank uses, as vLLM
// computes it: rank 0 keeps endpoint; inproc endpoints get "_dp<rank>"
// appended; tcp endpoints get their port increased by rank. Other endpoints
// with a non-zero rank are an error.
func OffsetEndpoint(endpoint string, dpRank int) (string, error) {
	if endpoint == "" || dpRank == 0 {
		return endpoint, nil
	}
	if strings.Contains(endpoint, "inproc") {
		return endpoint + "_dp" + strconv.Itoa(dpRank), nil
	}
	if !strings.Contains(endpoint, "tcp") {
		return "", fmt.Errorf("kvevents: offset endpoint %q: must contain inproc or tcp", endpoint)
	}
	i := strings.LastIndexByte(endpoint, ':')
	if i < 0 {
		return endpoint, nil
	}
	port, err := strconv.Atoi(endpoint[i+1:])
	if err != nil {
		return "", fmt.Errorf("kvevents: offset endpoint %q: bad port: %w", endpoint, err)
	}
	return endpoint[:i+1] + strconv.Itoa(port+dpRank), nil
}

// checkEndpoint refuses endpoints zmq4 cannot use, so that background
// dialing does not retry an impossible address forever.
func checkEndpoint(endpoint string) error {
	scheme, rest, ok := strings.Cut(endpoint, "://")
	if !ok || rest == "" {
		return fmt.Errorf("kvevents: endpoint %q: want scheme://address", endpoint)
	}
	switch scheme {
	case "tcp", "ipc", "inproc":
		return nil
	}
	return fmt.Errorf("kvevents: endpoint %q: unsupported transport %q", endpoint, scheme)
}

// seqBytes encodes a sequence number as 8 bytes big-endian.
func seqBytes(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq)
}

// ParseLive validates the frames of a live message: exactly 3 frames, the
// second of 8 bytes.
func ParseLive(frames [][]byte) (Msg, error) {
	if len(frames) != 3 {
		return Msg{}, fmt.Errorf("%w: live message has %d frames, want 3", ErrBadFrames, len(frames))
	}
	if len(frames[1]) != 8 {
		return Msg{}, fmt.Errorf("%w: sequence frame has %d bytes, want 8", ErrBadFrames, len(frames[1]))
	}
	return Msg{Topic: string(frames[0]), Seq: binary.BigEndian.Uint64(frames[1]), Payload: frames[2]}, nil
}

// zmqOptions returns the socket options shared by all sockets of this
// package. Dialer sockets retry forever (until the socket is closed), and
// with reconnect they dial again after a connection loss, approximating
// libzmq's asynchronous connect.
func zmqOptions(logger *log.Logger, dialer, reconnect bool) []zmq4.Option {
	if logger == nil {
		logger = log.New(io.Discard, "", 0)
	}
	opts := []zmq4.Option{zmq4.WithLogger(logger)}
	if dialer {
		opts = append(opts,
			zmq4.WithDialerMaxRetries(-1),
			zmq4.WithDialerRetry(100*time.Millisecond),
			zmq4.WithDialerTimeout(5*time.Second),
			zmq4.WithAutomaticReconnect(reconnect),
		)
	}
	return opts
}

// removeStaleSocket prepares an ipc:// endpoint for binding, as libzmq
// does: a socket file left behind by a process that died without closing
// it (SIGKILL, an engine container killed and restarted on the volume it
// shares with its agent) would make the bind fail with "address already in
// use". The file is removed only if it is a socket nothing accepts on, so
// a live publisher's endpoint still refuses a second bind. Other endpoints
// are left alone.
func removeStaleSocket(endpoint string) error {
	path, ok := strings.CutPrefix(endpoint, "ipc://")
	if !ok || path == "" {
		return nil
	}
	st, err := os.Lstat(path)
	if err != nil || st.Mode()&fs.ModeSocket == 0 {
		return nil
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		_ = c.Close()
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("kvevents: remove stale socket %s: %w", path, err)
	}
	return nil
}
