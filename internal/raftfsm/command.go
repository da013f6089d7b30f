package raftfsm

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// EnvelopeVersion is the command envelope version this build writes and
// reads.
const EnvelopeVersion = 1

// ErrUndecodable marks a log entry this node cannot apply: a broken
// envelope, an unknown version, an unknown type not marked ignorable, or a
// payload that does not decode. Applying past it would let this node's state
// diverge, so the state machine stops the node.
var ErrUndecodable = errors.New("raftfsm: undecodable command")

// ErrSkipped is the result of an undecodable entry applied as a no-op
// because Options.SkipUndecodable said so.
var ErrSkipped = errors.New("skipped undecodable entry")

// UndecodableError is what Options.Fatal is given: the log entry that
// cannot be decoded, and why. It wraps ErrUndecodable.
type UndecodableError struct {
	Index, Term uint64
	Err         error
}

func (e *UndecodableError) Error() string {
	return fmt.Sprintf("log index %d (term %d): %v", e.Index, e.Term, e.Err)
}

func (e *UndecodableError) Unwrap() error { return e.Err }

// skippedEntry stands for a skipped entry where applied entries are passed
// on (Options.OnApplied): an envelope of no known type marked ignorable,
// which every build decodes as a no-op.
var skippedEntry = func() []byte {
	b, err := proto.Marshal(&kvdirv1.Command{Version: EnvelopeVersion, Ignorable: true})
	if err != nil {
		panic(fmt.Sprintf("raftfsm: encode the skipped-entry stand-in: %v", err))
	}
	return b
}()

// Encode wraps a payload in the envelope. timeUnixNano is the proposer's
// clock, the only time the state machine sees.
func Encode(t kvdirv1.CommandType, payload proto.Message, timeUnixNano int64) ([]byte, error) {
	p, err := proto.Marshal(payload)
	if err != nil {
		return nil, fmt.Errorf("encode %v payload: %w", t, err)
	}
	b, err := proto.Marshal(&kvdirv1.Command{
		Version: EnvelopeVersion, Type: t, Payload: p, TimeUnixNano: timeUnixNano,
	})
	if err != nil {
		return nil, fmt.Errorf("encode %v envelope: %w", t, err)
	}
	return b, nil
}

// payloads maps each known command type to a constructor of its payload.
var payloads = map[kvdirv1.CommandType]func() proto.Message{
	kvdirv1.CommandType_COMMAND_TYPE_REGISTER:        func() proto.Message { return new(kvdirv1.RegisterCommand) },
	kvdirv1.CommandType_COMMAND_TYPE_PUBLISH:         func() proto.Message { return new(kvdirv1.PublishCommand) },
	kvdirv1.CommandType_COMMAND_TYPE_LOADS:           func() proto.Message { return new(kvdirv1.LoadsCommand) },
	kvdirv1.CommandType_COMMAND_TYPE_EXPIRE_WORKER:   func() proto.Message { return new(kvdirv1.ExpireWorkerCommand) },
	kvdirv1.CommandType_COMMAND_TYPE_DEREGISTER:      func() proto.Message { return new(kvdirv1.DeregisterCommand) },
	kvdirv1.CommandType_COMMAND_TYPE_DRAIN:           func() proto.Message { return new(kvdirv1.DrainCommand) },
	kvdirv1.CommandType_COMMAND_TYPE_RECORD_SESSIONS: func() proto.Message { return new(kvdirv1.RecordSessionsCommand) },
	kvdirv1.CommandType_COMMAND_TYPE_EXPIRE_SESSIONS: func() proto.Message { return new(kvdirv1.ExpireSessionsCommand) },
	kvdirv1.CommandType_COMMAND_TYPE_MEMBER_API:      func() proto.Message { return new(kvdirv1.MemberAPICommand) },
}

// Decoded is a decoded command. Payload is nil for an ignorable command of
// an unknown type.
type Decoded struct {
	Type         kvdirv1.CommandType
	Payload      proto.Message
	TimeUnixNano int64
}

// Decode unwraps and decodes a command. Errors wrap ErrUndecodable.
func Decode(b []byte) (Decoded, error) {
	var env kvdirv1.Command
	if err := proto.Unmarshal(b, &env); err != nil {
		return Decoded{}, fmt.Errorf("%w: envelope: %w", ErrUndecodable, err)
	}
	if env.Version != EnvelopeVersion {
		return Decoded{}, fmt.Errorf("%w: envelope version %d, this build reads %d", ErrUndecodable, env.Version, EnvelopeVersion)
	}
	d := Decoded{Type: env.Type, TimeUnixNano: env.TimeUnixNano}
	mk, ok := payloads[env.Type]
	if !ok {
		if env.Ignorable {
			return d, nil
		}
		return Decoded{}, fmt.Errorf("%w: unknown command type %d", ErrUndecodable, env.Type)
	}
	d.Payload = mk()
	if err := proto.Unmarshal(env.Payload, d.Payload); err != nil {
		return Decoded{}, fmt.Errorf("%w: %v payload: %w", ErrUndecodable, env.Type, err)
	}
	return d, nil
}
