// Package workload reads, writes and generates request traces in the Mooncake
// trace format, and turns a trace record into prompt tokens.
//
// A trace is JSON Lines, one request per line:
//
//	{"timestamp": 40, "input_length": 23769, "output_length": 3, "hash_ids": [151, 152, ...]}
//
// timestamp is the arrival in milliseconds since the start of the trace;
// hash_ids name the prompt's blocks of BlockSize tokens (512 in the Mooncake
// traces), ⌈input_length/BlockSize⌉ of them, and an id names the whole prefix
// up to and including its block, so equal ids mean an identical, reusable
// block. This package adds one optional field, "session_id", written by its
// generators; readers that do not know it ignore it.
//
// Every hash id gets fixed token content (see BlockTokens), so that equal ids
// give equal tokens and an engine's prefix cache sees exactly the sharing the
// trace describes, whatever the file.
package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
)

// DefaultBlockSize is the block size of the Mooncake traces, in tokens.
const DefaultBlockSize = 512

// Limits on what a trace line may contain.
const (
	// MaxLineBytes bounds one line of a trace file.
	MaxLineBytes = 64 << 20
	// MaxInputLength bounds a record's input_length.
	MaxInputLength = 1 << 24
	// MaxOutputLength bounds a record's output_length.
	MaxOutputLength = 1 << 20
)

// Record is one request of a trace.
type Record struct {
	// Timestamp is the arrival time in milliseconds since the trace's start.
	Timestamp float64 `json:"timestamp"`
	// InputLength is the prompt length in tokens.
	InputLength int `json:"input_length"`
	// OutputLength is the number of tokens to generate.
	OutputLength int `json:"output_length"`
	// HashIDs names the prompt's blocks; see the package comment.
	HashIDs []int64 `json:"hash_ids"`
	// SessionID is the conversation the request belongs to; optional.
	SessionID string `json:"session_id,omitempty"`
}

// ErrBadRecord is wrapped by every error about the content of a trace line.
var ErrBadRecord = errors.New("bad trace record")

// Validate checks r against the format for blocks of blockSize tokens.
func (r *Record) Validate(blockSize int) error {
	switch {
	case blockSize < 1:
		return fmt.Errorf("%w: block size %d, want >= 1", ErrBadRecord, blockSize)
	case math.IsNaN(r.Timestamp) || math.IsInf(r.Timestamp, 0) || r.Timestamp < 0:
		return fmt.Errorf("%w: timestamp %v, want a finite number >= 0", ErrBadRecord, r.Timestamp)
	case r.InputLength < 1 || r.InputLength > MaxInputLength:
		return fmt.Errorf("%w: input_length %d, want 1..%d", ErrBadRecord, r.InputLength, MaxInputLength)
	case r.OutputLength < 1 || r.OutputLength > MaxOutputLength:
		return fmt.Errorf("%w: output_length %d, want 1..%d", ErrBadRecord, r.OutputLength, MaxOutputLength)
	}
	if want := (r.InputLength + blockSize - 1) / blockSize; len(r.HashIDs) != want {
		return fmt.Errorf("%w: %d hash_ids for input_length %d, want ⌈%d/%d⌉ = %d",
			ErrBadRecord, len(r.HashIDs), r.InputLength, r.InputLength, blockSize, want)
	}
	return nil
}

// lineJSON detects missing required fields.
type lineJSON struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      *[]int64 `json:"hash_ids"`
	SessionID    *string  `json:"session_id"`
}

// Read parses a trace of blocks of blockSize tokens. Empty lines are skipped;
// any other bad line fails the whole read with an error naming its line
// number. Records are returned in file order; use SortByTime if the file may
// not be sorted.
func Read(r io.Reader, blockSize int) ([]Record, error) {
	if blockSize < 1 {
		return nil, fmt.Errorf("workload: block size %d, want >= 1", blockSize)
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), MaxLineBytes)
	var out []Record
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		rec, err := parseLine(b, blockSize)
		if err != nil {
			return nil, fmt.Errorf("workload: line %d: %w", line, err)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("workload: line %d: longer than %d bytes", line+1, MaxLineBytes)
		}
		return nil, fmt.Errorf("workload: read line %d: %w", line+1, err)
	}
	return out, nil
}

func parseLine(b []byte, blockSize int) (Record, error) {
	var lj lineJSON
	if err := json.Unmarshal(b, &lj); err != nil {
		return Record{}, fmt.Errorf("%w: %w", ErrBadRecord, err)
	}
	var missing []string
	if lj.Timestamp == nil {
		missing = append(missing, "timestamp")
	}
	if lj.InputLength == nil {
		missing = append(missing, "input_length")
	}
	if lj.OutputLength == nil {
		missing = append(missing, "output_length")
	}
	if lj.HashIDs == nil {
		missing = append(missing, "hash_ids")
	}
	if len(missing) > 0 {
		return Record{}, fmt.Errorf("%w: missing %v", ErrBadRecord, missing)
	}
	rec := Record{Timestamp: *lj.Timestamp, InputLength: *lj.InputLength, OutputLength: *lj.OutputLength, HashIDs: *lj.HashIDs}
	if lj.SessionID != nil {
		rec.SessionID = *lj.SessionID
	}
	if err := rec.Validate(blockSize); err != nil {
		return Record{}, err
	}
	return rec, nil
}

// ReadFile reads the trace at path (see Read).
func ReadFile(path string, blockSize int) ([]Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("workload: %w", err)
	}
	defer f.Close()
	recs, err := Read(f, blockSize)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return recs, nil
}

// SortByTime orders records by timestamp, keeping the file order of equal
// timestamps (which keeps the turns of a conversation in order).
func SortByTime(recs []Record) {
	slices.SortStableFunc(recs, func(a, b Record) int {
		switch {
		case a.Timestamp < b.Timestamp:
			return -1
		case a.Timestamp > b.Timestamp:
			return 1
		}
		return 0
	})
}

// Write writes recs as JSON Lines in the Mooncake format (integral
// timestamps are written without a fraction).
func Write(w io.Writer, recs []Record) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	for i := range recs {
		if err := enc.Encode(&recs[i]); err != nil {
			return fmt.Errorf("workload: write record %d: %w", i, err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("workload: write: %w", err)
	}
	return nil
}

// Stats summarises a trace.
type Stats struct {
	Requests     int     `json:"requests"`
	DurationSec  float64 `json:"duration_sec"`
	InputTokens  int64   `json:"input_tokens"`
	OutputTokens int64   `json:"output_tokens"`
	UniqueBlocks int     `json:"unique_blocks"`
	// HotWorkingSetTokens is the peak, over the trace's requests, of the
	// tokens of blocks that were seen before and will be used again: what a
	// cache must hold at that moment to lose no reuse (blocks of BlockSize
	// tokens, a partial block counted as full).
	HotWorkingSetTokens int64 `json:"hot_working_set_tokens"`
}

// Summarize computes a trace's Stats for blocks of blockSize tokens; recs
// must be in arrival order.
func Summarize(recs []Record, blockSize int) Stats {
	s := Stats{Requests: len(recs)}
	if len(recs) == 0 {
		return s
	}
	s.DurationSec = (recs[len(recs)-1].Timestamp - recs[0].Timestamp) / 1000
	first := make(map[int64]int)
	last := make(map[int64]int)
	for i := range recs {
		s.InputTokens += int64(recs[i].InputLength)
		s.OutputTokens += int64(recs[i].OutputLength)
		for _, h := range recs[i].HashIDs {
			if _, ok := first[h]; !ok {
				first[h] = i
			}
			last[h] = i
		}
	}
	s.UniqueBlocks = len(first)
	delta := make([]int64, len(recs)+1)
	for h, f := range first {
		if l := last[h]; l > f {
			delta[f]++
			delta[l]--
		}
	}
	var cur, peak int64
	for i := range recs {
		cur += delta[i]
		peak = max(peak, cur)
	}
	s.HotWorkingSetTokens = peak * int64(blockSize)
	return s
}
