// Package enginemetrics reads an inference engine's load from its /metrics:
// the Prometheus text exposition of vLLM (and of the engine simulator with
// it) or of SGLang, or the JSON iteration statistics of TensorRT-LLM's
// trtllm-serve. The router scrapes them to place requests, the agent to
// heartbeat its load, benchmarks to record queues.
package enginemetrics

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"
)

// Kind is the shape of an engine's /metrics. The zero Kind is vLLM's, the
// only shape read before the others were added.
type Kind uint8

// The kinds Parse reads.
const (
	KindVLLM   Kind = iota // Prometheus text with vllm:* names (vLLM, enginesim)
	KindSGLang             // Prometheus text with sglang:* names
	KindTRTLLM             // trtllm-serve's JSON list of iteration stats
)

// String returns the kind's flag name: vllm, sglang or trtllm.
func (k Kind) String() string {
	switch k {
	case KindVLLM:
		return "vllm"
	case KindSGLang:
		return "sglang"
	case KindTRTLLM:
		return "trtllm"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// KindNames are the values ParseKind accepts, for flag help.
const KindNames = "auto, vllm, sglang, trtllm"

// ParseKind reads a --engine-kind value: "auto" (or "") detects the kind
// from each exposition (auto true); vllm, sglang and trtllm (also
// "tensorrt-llm") force it.
func ParseKind(s string) (k Kind, auto bool, err error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "auto":
		return KindVLLM, true, nil
	case "vllm":
		return KindVLLM, false, nil
	case "sglang":
		return KindSGLang, false, nil
	case "trtllm", "tensorrt-llm":
		return KindTRTLLM, false, nil
	}
	return 0, false, fmt.Errorf("engine kind %q: want one of %s", s, KindNames)
}

// Load is what one scrape of an engine's /metrics gives. How each kind's
// metrics map onto it is told at Parse (vLLM), parseSGLang and parseTRTLLM.
type Load struct {
	Running, Waiting int     // requests running and waiting, summed over the engine's series
	KVUsage          float64 // KV-cache usage 0..1, the largest over its series
	// PrefixQueries and PrefixHits are the cumulative prefix-cache counters
	// in tokens, summed over series (0 if the engine exports none).
	PrefixQueries, PrefixHits float64
	Model                     string // the model_name label, if any
	// HitRate is the prefix-cache hit rate 0..1 the engine itself reports
	// (SGLang, TensorRT-LLM: over recent batches, not cumulative); 0 for
	// vLLM, which exports only the counters.
	HitRate float64
	// CapacityTokens is the KV cache's size in tokens, num_gpu_blocks ×
	// block_size from vLLM's vllm:cache_config_info (the largest over its
	// series); 0 if the engine does not say.
	CapacityTokens int64
	// Kind is the shape the load was read from.
	Kind Kind
}

// Options control ParseWith. The zero Options detect the kind and read
// every data-parallel rank, as Parse does.
type Options struct {
	// Kind, with Force, is the only shape accepted; without Force the
	// kind is detected from the content.
	Kind  Kind
	Force bool
	// Rank, with ByRank, selects one data-parallel rank's series: vLLM's
	// "engine" label, SGLang's "dp_rank" label. Series without the label
	// count as rank 0 (an engine without data parallelism).
	Rank   int
	ByRank bool
}

// ErrUnknownExposition is wrapped by the error of an exposition that has
// none of the load metrics of the kinds looked for.
var ErrUnknownExposition = errors.New("unknown metrics exposition")

// ErrNoNewStats is the error of a TensorRT-LLM read that found no
// iteration since the previous read: trtllm-serve drains its iteration
// stats on every read, so an empty answer means no engine step since the
// last reader, whoever that was. Its Load is the zero load of an idle
// engine; a caller that shares the engine with another reader may keep
// its last load for a while instead (the router does).
var ErrNoNewStats = errors.New("no TensorRT-LLM iteration since the previous read")

// Metric names of vLLM (and of the engine simulator) read here; the "old"
// ones are the names vLLM used before v0.10, read when the new ones are
// absent. vLLM labels each series model_name and engine (the data-parallel
// engine index; vllm/v1/metrics/loggers.py).
const (
	metricRunning    = "vllm:num_requests_running"
	metricWaiting    = "vllm:num_requests_waiting"
	metricKVUsage    = "vllm:kv_cache_usage_perc"
	metricKVUsageOld = "vllm:gpu_cache_usage_perc"
	labelVLLMRank    = "engine"
)

// Parse reads an engine's load from its /metrics body, detecting the kind
// (see ParseWith). For vLLM, running and waiting requests and the
// prefix-cache counters are summed over series (one per data-parallel
// engine); KV usage is the largest, clamped to [0, 1]. Unknown lines and
// malformed or non-finite values are ignored. It fails when the exposition
// has none of the load gauges.
func Parse(r io.Reader) (Load, error) { return ParseWith(r, Options{}) }

// ParseRank is Parse restricted to one data-parallel rank's series.
func ParseRank(r io.Reader, rank int) (Load, error) {
	return ParseWith(r, Options{Rank: rank, ByRank: true})
}

// maxLine bounds one line of a text exposition.
const maxLine = 1 << 20

// readers and lineBufs hold the buffers a parse reads through (a 64 KiB
// reader, and the text exposition's 64 KiB line buffer), reused from one
// parse to the next: a router parses each of its engines' /metrics every
// scrape interval, and with a thousand engines allocating them afresh
// made most of the process's garbage. Nothing parsed refers to them.
var (
	readers  = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 64<<10) }}
	lineBufs = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}
)

// ParseWith reads an engine's load as o says. Without o.Force the kind is
// detected from the content: a body whose first non-blank byte is '[' or
// '{' is TensorRT-LLM's JSON; otherwise it is Prometheus text, vLLM's if
// it has a vllm:* load gauge, else SGLang's if it has an sglang:* one. The
// caller bounds r.
func ParseWith(r io.Reader, o Options) (Load, error) {
	if o.ByRank && o.Rank < 0 {
		return Load{}, fmt.Errorf("enginemetrics: negative data-parallel rank %d", o.Rank)
	}
	br := readers.Get().(*bufio.Reader)
	br.Reset(r)
	defer func() { br.Reset(nil); readers.Put(br) }()
	json, err := looksJSON(br)
	if err != nil {
		return Load{}, fmt.Errorf("read metrics: %w", err)
	}
	switch {
	case o.Force && o.Kind == KindTRTLLM:
		return parseTRTLLM(br, o)
	case o.Force && o.Kind != KindVLLM && o.Kind != KindSGLang:
		return Load{}, fmt.Errorf("enginemetrics: unknown engine kind %v", o.Kind)
	case !o.Force && json:
		return parseTRTLLM(br, o)
	}
	return parseText(br, o)
}

// looksJSON reports whether the first non-blank byte of br (after a
// UTF-8 byte order mark) opens a JSON array or object, leaving it unread.
func looksJSON(br *bufio.Reader) (bool, error) {
	if b, _ := br.Peek(3); bytes.Equal(b, []byte("\xEF\xBB\xBF")) {
		_, _ = br.Discard(3)
	}
	for {
		b, err := br.ReadByte()
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		switch b {
		case ' ', '\t', '\r', '\n':
			continue
		}
		_ = br.UnreadByte()
		return b == '[' || b == '{', nil
	}
}

// vllmAcc accumulates vLLM's series.
type vllmAcc struct {
	out                         Load
	usage, oldUsage, oldQ, oldH float64
	haveUsage, haveQ            bool
	seen                        int
}

func (a *vllmAcc) add(name string, labels []byte, value float64) {
	switch name {
	case metricRunning:
		a.out.Running += int(max(value, 0))
	case metricWaiting:
		a.out.Waiting += int(max(value, 0))
	case metricKVUsage:
		a.usage, a.haveUsage = max(a.usage, value), true
	case metricKVUsageOld:
		a.oldUsage = max(a.oldUsage, value)
	case "vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries":
		a.out.PrefixQueries, a.haveQ = a.out.PrefixQueries+value, true
		return
	case "vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits":
		a.out.PrefixHits += value
		return
	case "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries":
		a.oldQ += value
		return
	case "vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits":
		a.oldH += value
		return
	case "vllm:cache_config_info":
		blocks, err1 := strconv.ParseInt(labelValue(labels, "num_gpu_blocks"), 10, 64)
		size, err2 := strconv.ParseInt(labelValue(labels, "block_size"), 10, 64)
		if err1 == nil && err2 == nil && blocks > 0 && size > 0 && blocks <= 1<<40/size {
			a.out.CapacityTokens = max(a.out.CapacityTokens, blocks*size)
		}
		return
	default:
		return
	}
	a.seen++
	if a.out.Model == "" {
		a.out.Model = labelValue(labels, "model_name")
	}
}

func (a *vllmAcc) load() Load {
	out := a.out
	usage := a.usage
	if !a.haveUsage {
		usage = a.oldUsage
	}
	out.KVUsage = min(max(usage, 0), 1)
	if !a.haveQ {
		out.PrefixQueries, out.PrefixHits = a.oldQ, a.oldH
	}
	out.Kind = KindVLLM
	return out
}

// parseText reads a Prometheus text exposition of vLLM or SGLang.
func parseText(br *bufio.Reader, o Options) (Load, error) {
	var v vllmAcc
	s := newSGLangAcc()
	wantV := !o.Force || o.Kind == KindVLLM
	wantS := !o.Force || o.Kind == KindSGLang
	sc := bufio.NewScanner(br)
	lb := lineBufs.Get().(*[]byte)
	defer lineBufs.Put(lb)
	sc.Buffer(*lb, maxLine)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || (line[0] != 'v' && line[0] != 's') {
			continue
		}
		isV := bytes.HasPrefix(line, []byte("vllm:"))
		isS := bytes.HasPrefix(line, []byte("sglang:"))
		if !(isV && wantV) && !(isS && wantS) {
			continue
		}
		name, labels, value, ok := splitSample(line)
		if !ok || math.IsNaN(value) || math.IsInf(value, 0) {
			continue
		}
		if isV {
			if o.ByRank && !rankMatches(labels, labelVLLMRank, o.Rank) {
				continue
			}
			v.add(string(name), labels, value)
		} else {
			s.add(string(name), labels, value, o)
		}
	}
	if err := sc.Err(); err != nil {
		return Load{}, fmt.Errorf("read metrics: %w", err)
	}
	switch {
	case wantV && v.seen > 0:
		return v.load(), nil
	case wantS && s.seen > 0:
		return s.load(), nil
	}
	return Load{}, unknownText(o)
}

// unknownText is the error of a text exposition without load gauges.
func unknownText(o Options) error {
	var looked []string
	if !o.Force || o.Kind == KindVLLM {
		looked = append(looked, "vLLM's "+metricRunning+", "+metricWaiting+" or "+metricKVUsage)
	}
	if !o.Force || o.Kind == KindSGLang {
		looked = append(looked, "SGLang's "+sglRunning+", "+sglQueue+" or "+sglTokenUsage)
	}
	if !o.Force {
		looked = append(looked, "TensorRT-LLM's JSON iteration stats")
	}
	rank := ""
	if o.ByRank {
		rank = fmt.Sprintf(" for data-parallel rank %d", o.Rank)
	}
	return fmt.Errorf("%w: no %s%s in the metrics", ErrUnknownExposition, strings.Join(looked, "; nor "), rank)
}

// rankMatches reports whether a series' rank label (absent: rank 0) is rank.
func rankMatches(labels []byte, key string, rank int) bool {
	v, ok := lookupLabel(labels, key)
	if !ok {
		return rank == 0
	}
	n, err := strconv.Atoi(v)
	return err == nil && n == rank
}

// splitSample splits `name{labels} value [timestamp]`.
func splitSample(line []byte) (name, labels []byte, value float64, ok bool) {
	i := bytes.IndexAny(line, "{ ")
	if i <= 0 {
		return nil, nil, 0, false
	}
	name, rest := line[:i], line[i:]
	if rest[0] == '{' {
		j := bytes.LastIndexByte(rest, '}')
		if j < 0 {
			return nil, nil, 0, false
		}
		labels, rest = rest[1:j], rest[j+1:]
	}
	fields := bytes.Fields(rest)
	if len(fields) == 0 {
		return nil, nil, 0, false
	}
	v, err := strconv.ParseFloat(string(fields[0]), 64)
	if err != nil {
		return nil, nil, 0, false
	}
	return name, labels, v, true
}

// labelValue returns the value of label key in `a="x",b="y"` (unescaped
// values are enough for model names).
func labelValue(labels []byte, key string) string {
	v, _ := lookupLabel(labels, key)
	return v
}

// lookupLabel returns the value of label key and whether it is present.
func lookupLabel(labels []byte, key string) (string, bool) {
	for len(labels) > 0 {
		eq := bytes.IndexByte(labels, '=')
		if eq < 0 || eq+1 >= len(labels) || labels[eq+1] != '"' {
			return "", false
		}
		k := bytes.TrimSpace(labels[:eq])
		end := eq + 2
		for end < len(labels) && labels[end] != '"' {
			if labels[end] == '\\' {
				end++
			}
			end++
		}
		if end >= len(labels) {
			return "", false
		}
		if string(k) == key {
			return string(labels[eq+2 : end]), true
		}
		labels = labels[end+1:]
		if len(labels) > 0 && labels[0] == ',' {
			labels = labels[1:]
		}
	}
	return "", false
}
