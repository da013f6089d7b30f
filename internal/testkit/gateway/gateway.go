// Package gateway is a test data plane for an endpoint picker: it drives
// Envoy's external processing protocol (envoy.service.ext_proc.v3) as
// Envoy's ext_proc filter does in front of a Gateway API Inference
// Extension pool, one stream per request: the request headers, the body
// buffered (request_body_mode BUFFERED, here sent in one message or
// several, the last with end_of_stream; or FULL_DUPLEX_STREAMED), then, once
// the picker named an endpoint, the response headers, body chunks (STREAMED,
// or FULL_DUPLEX_STREAMED with each chunk streamed back by the picker) and
// end of stream. It can send the request to the picked endpoint over HTTP and
// feed the real response through the response phases, as the gateway
// would.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
)

// The protocol's names (the endpoint picker protocol of the Gateway API
// Inference Extension).
const (
	DestinationHeader = "x-gateway-destination-endpoint"
	LBNamespace       = "envoy.lb"
	SubsetNamespace   = "envoy.lb.subset_hint"
	SubsetKey         = "x-gateway-destination-endpoint-subset"
	ServedKey         = "x-gateway-destination-endpoint-served"
)

// Gateway is a data plane talking to one endpoint picker.
type Gateway struct {
	conn   *grpc.ClientConn
	client extprocv3.ExternalProcessorClient
	// BodyMessages is how many request body messages a body is split
	// into (default 1, as Envoy's BUFFERED mode sends it).
	BodyMessages int
	// FullDuplex announces request_body_mode FULL_DUPLEX_STREAMED in the
	// protocol configuration: the picker answers the headers with the pick,
	// after the body.
	FullDuplex bool
	// FullDuplexResponse announces response_body_mode FULL_DUPLEX_STREAMED:
	// every response body chunk must be answered with the chunk to send
	// on (a streamed body mutation), and the client gets only what the
	// picker streams back.
	FullDuplexResponse bool
	// HTTP sends requests to picked endpoints (default: a client without
	// compression).
	HTTP *http.Client
}

// Dial connects to the picker's gRPC address (plaintext).
func Dial(addr string) (*Gateway, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("gateway: dial %s: %w", addr, err)
	}
	return &Gateway{conn: conn, client: extprocv3.NewExternalProcessorClient(conn), BodyMessages: 1,
		HTTP: &http.Client{Transport: &http.Transport{DisableCompression: true}}}, nil
}

// Conn is the picker's connection (for its health service).
func (g *Gateway) Conn() *grpc.ClientConn { return g.conn }

// Close closes the connection.
func (g *Gateway) Close() error { return g.conn.Close() }

// Request is one client request through the gateway.
type Request struct {
	Method string // default POST
	Path   string
	Header http.Header
	Body   []byte
	// Subset, with HasSubset, is the subset hint sent in the filter
	// metadata (HasSubset with an empty Subset sends an empty list).
	Subset    []string
	HasSubset bool
}

// Exchange is one request's stream, after its request phases.
type Exchange struct {
	g      *Gateway
	stream extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	req    *Request

	// Endpoint is the picked endpoint from the header mutation;
	// MetadataEndpoint the one in the dynamic metadata (namespace
	// envoy.lb). Both are "" when the picker refused the request.
	Endpoint, MetadataEndpoint string
	// RequestHeader is the request's headers after the picker's mutations.
	RequestHeader http.Header
	// Immediate is the picker's immediate response, when it refused.
	Immediate *extprocv3.ImmediateResponse
	// ResponseHeader is the response's headers after the picker's
	// mutations (after Respond or Forward).
	ResponseHeader http.Header
	// Status and Body are the response the client got (after Respond or
	// Forward; the immediate response's when refused).
	Status int
	Body   []byte
}

// Start runs req's request phases: the headers, then the body. It returns
// when the picker has answered with an endpoint or an immediate response.
func (g *Gateway) Start(ctx context.Context, req *Request) (*Exchange, error) {
	ctx, cancel := context.WithCancel(ctx)
	st, err := g.client.Process(ctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("gateway: open stream: %w", err)
	}
	x := &Exchange{g: g, stream: st, cancel: cancel, req: req, RequestHeader: req.Header.Clone()}
	if x.RequestHeader == nil {
		x.RequestHeader = http.Header{}
	}
	if err := x.requestPhases(); err != nil {
		x.Close()
		return nil, err
	}
	return x, nil
}

func (x *Exchange) metadata() *corev3.Metadata {
	if !x.req.HasSubset {
		return nil
	}
	vals := make([]*structpb.Value, len(x.req.Subset))
	for i, e := range x.req.Subset {
		vals[i] = structpb.NewStringValue(e)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		SubsetNamespace: {Fields: map[string]*structpb.Value{SubsetKey: structpb.NewListValue(&structpb.ListValue{Values: vals})}},
	}}
}

func headerMap(pseudo [][2]string, h http.Header) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for _, p := range pseudo {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: p[0], RawValue: []byte(p[1])})
	}
	for k, vs := range h {
		for _, v := range vs {
			m.Headers = append(m.Headers, &corev3.HeaderValue{Key: strings.ToLower(k), RawValue: []byte(v)})
		}
	}
	return m
}

// recv receives the next response, or the immediate response (ok false).
func (x *Exchange) recv() (*extprocv3.ProcessingResponse, bool, error) {
	r, err := x.stream.Recv()
	if err != nil {
		return nil, false, fmt.Errorf("gateway: receive: %w", err)
	}
	if im := r.GetImmediateResponse(); im != nil {
		x.Immediate = im
		x.Status = int(im.GetStatus().GetCode())
		x.Body = im.GetBody()
		return r, false, nil
	}
	return r, true, nil
}

// pick records the endpoint a response names and applies its mutation.
func (x *Exchange) pick(r *extprocv3.ProcessingResponse, common *extprocv3.CommonResponse) {
	applyMutation(x.RequestHeader, common.GetHeaderMutation())
	if v := x.RequestHeader.Get(DestinationHeader); v != "" {
		x.Endpoint = v
	}
	if v := r.GetDynamicMetadata().GetFields()[LBNamespace].GetStructValue().GetFields()[DestinationHeader].GetStringValue(); v != "" {
		x.MetadataEndpoint = v
	}
}

func applyMutation(h http.Header, m *extprocv3.HeaderMutation) {
	for _, k := range m.GetRemoveHeaders() {
		h.Del(k)
	}
	for _, o := range m.GetSetHeaders() {
		v := string(o.GetHeader().GetRawValue())
		if v == "" {
			v = o.GetHeader().GetValue()
		}
		h.Set(o.GetHeader().GetKey(), v)
	}
}

func (x *Exchange) requestPhases() error {
	method := x.req.Method
	if method == "" {
		method = http.MethodPost
	}
	first := &extprocv3.ProcessingRequest{MetadataContext: x.metadata(),
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers:     headerMap([][2]string{{":method", method}, {":path", x.req.Path}, {":scheme", "http"}, {":authority", "gateway"}}, x.req.Header),
			EndOfStream: len(x.req.Body) == 0}}}
	mode := procmodev3.ProcessingMode_BUFFERED
	if x.g.FullDuplex {
		mode = procmodev3.ProcessingMode_FULL_DUPLEX_STREAMED
	}
	respMode := procmodev3.ProcessingMode_STREAMED
	if x.g.FullDuplexResponse {
		respMode = procmodev3.ProcessingMode_FULL_DUPLEX_STREAMED
	}
	first.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: mode, ResponseBodyMode: respMode}
	if err := x.stream.Send(first); err != nil {
		return fmt.Errorf("gateway: send headers: %w", err)
	}
	if !x.g.FullDuplex || len(x.req.Body) == 0 {
		r, ok, err := x.recv()
		if err != nil || !ok {
			return err
		}
		if r.GetRequestHeaders() == nil {
			return fmt.Errorf("gateway: answer to the request headers is %T", r.GetResponse())
		}
		x.pick(r, r.GetRequestHeaders().GetResponse())
		if len(x.req.Body) == 0 {
			return nil
		}
	}
	n := max(x.g.BodyMessages, 1)
	body := x.req.Body
	size := (len(body) + n - 1) / n
	for i := 0; i < n; i++ {
		part := body[min(i*size, len(body)):min((i+1)*size, len(body))]
		if err := x.stream.Send(&extprocv3.ProcessingRequest{MetadataContext: x.metadata(),
			Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: part, EndOfStream: i == n-1}}}); err != nil {
			return fmt.Errorf("gateway: send body: %w", err)
		}
	}
	if x.g.FullDuplex {
		r, ok, err := x.recv()
		if err != nil || !ok {
			return err
		}
		if r.GetRequestHeaders() == nil {
			return fmt.Errorf("gateway: full duplex: first answer is %T, want the request headers' answer", r.GetResponse())
		}
		x.pick(r, r.GetRequestHeaders().GetResponse())
	}
	r, ok, err := x.recv()
	if err != nil || !ok {
		return err
	}
	if r.GetRequestBody() == nil {
		return fmt.Errorf("gateway: answer to the request body is %T", r.GetResponse())
	}
	if !x.g.FullDuplex {
		x.pick(r, r.GetRequestBody().GetResponse())
	} else if sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse(); sr == nil || string(sr.GetBody()) != string(body) || !sr.GetEndOfStream() {
		return errors.New("gateway: full duplex: the body answer does not carry the request body back whole")
	}
	return nil
}

// servedMetadata is the response phases' filter metadata naming the
// endpoint that served.
func (x *Exchange) servedMetadata() *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		LBNamespace: {Fields: map[string]*structpb.Value{ServedKey: structpb.NewStringValue(x.Endpoint)}}}}
}

// Respond runs the response phases for a response of status and header
// whose body arrives in chunks (nil: none), and ends the stream.
func (x *Exchange) Respond(status int, header http.Header, chunks [][]byte) error {
	next := func(yield func([]byte) bool) {
		for _, c := range chunks {
			if !yield(c) {
				return
			}
		}
	}
	return x.respond(status, header, len(chunks) == 0, next)
}

func (x *Exchange) respond(status int, header http.Header, noBody bool, chunks func(func([]byte) bool)) error {
	if x.Immediate != nil {
		return errors.New("gateway: the picker refused the request; nothing to respond")
	}
	x.Status = status
	x.ResponseHeader = header.Clone()
	if x.ResponseHeader == nil {
		x.ResponseHeader = http.Header{}
	}
	if err := x.stream.Send(&extprocv3.ProcessingRequest{MetadataContext: x.servedMetadata(),
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap([][2]string{{":status", strconv.Itoa(status)}}, header), EndOfStream: noBody}}}); err != nil {
		return fmt.Errorf("gateway: send response headers: %w", err)
	}
	r, ok, err := x.recv()
	if err != nil || !ok {
		return errors.Join(err, errors.New("gateway: no answer to the response headers"))
	}
	applyMutation(x.ResponseHeader, r.GetResponseHeaders().GetResponse().GetHeaderMutation())
	if !noBody {
		var sendErr error
		chunks(func(c []byte) bool {
			if sendErr = x.sendBody(c, false); sendErr != nil {
				return false
			}
			return true
		})
		if sendErr != nil {
			return sendErr
		}
		if err := x.sendBody(nil, true); err != nil {
			return err
		}
	}
	return x.Close()
}

// sendBody sends one response body chunk and reads its answer. The client
// gets the chunk itself, or in full-duplex mode what the answer streams
// back (which must end the body when the chunk does).
func (x *Exchange) sendBody(b []byte, end bool) error {
	if err := x.stream.Send(&extprocv3.ProcessingRequest{MetadataContext: x.servedMetadata(),
		Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: end}}}); err != nil {
		return fmt.Errorf("gateway: send response body: %w", err)
	}
	r, ok, err := x.recv()
	if err != nil || !ok {
		return errors.Join(err, errors.New("gateway: no answer to a response body chunk"))
	}
	if r.GetResponseBody() == nil {
		return fmt.Errorf("gateway: answer to a response body chunk is %T", r.GetResponse())
	}
	if !x.g.FullDuplexResponse {
		x.Body = append(x.Body, b...)
		return nil
	}
	sr := r.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
	if sr == nil {
		return errors.New("gateway: full duplex: a response body chunk's answer streams no body back (the client would get nothing)")
	}
	if sr.GetEndOfStream() != end {
		return fmt.Errorf("gateway: full duplex: a response body chunk with end_of_stream %v answered with %v", end, sr.GetEndOfStream())
	}
	x.Body = append(x.Body, sr.GetBody()...)
	return nil
}

// Forward sends the request to the picked endpoint over HTTP, with the
// picker's request header mutations, and feeds the response through the
// response phases as it arrives.
func (x *Exchange) Forward(ctx context.Context) error {
	if x.Endpoint == "" {
		return errors.New("gateway: no endpoint picked")
	}
	if x.MetadataEndpoint != x.Endpoint {
		return fmt.Errorf("gateway: header endpoint %q differs from the metadata's %q", x.Endpoint, x.MetadataEndpoint)
	}
	hr, err := http.NewRequestWithContext(ctx, x.methodOr(), "http://"+x.Endpoint+x.req.Path, strings.NewReader(string(x.req.Body)))
	if err != nil {
		return err
	}
	hr.Header = x.RequestHeader.Clone()
	hr.Header.Del(DestinationHeader)
	if hr.Header.Get("Content-Type") == "" {
		hr.Header.Set("Content-Type", "application/json")
	}
	resp, err := x.g.HTTP.Do(hr)
	if err != nil {
		x.Close()
		return fmt.Errorf("gateway: upstream %s: %w", x.Endpoint, err)
	}
	defer resp.Body.Close()
	var readErr error
	buf := make([]byte, 16<<10)
	err = x.respond(resp.StatusCode, resp.Header, false, func(yield func([]byte) bool) {
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 && !yield(append([]byte(nil), buf[:n]...)) {
				return
			}
			if err != nil {
				if err != io.EOF {
					readErr = err
				}
				return
			}
		}
	})
	return errors.Join(err, readErr)
}

func (x *Exchange) methodOr() string {
	if x.req.Method != "" {
		return x.req.Method
	}
	return http.MethodPost
}

// Close ends the stream: it half-closes, waits for the picker to end it,
// then releases it.
func (x *Exchange) Close() error {
	defer x.cancel()
	if err := x.stream.CloseSend(); err != nil {
		return fmt.Errorf("gateway: close: %w", err)
	}
	for {
		if _, err := x.stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("gateway: stream end: %w", err)
		}
	}
}

// Abort cancels the stream without a response, as a gateway whose client
// left (or whose upstream could not be reached) does.
func (x *Exchange) Abort() { x.cancel() }

// Do runs req through the picker and, when it picks an endpoint, sends it
// there and feeds the response back: the whole life of one request.
func (g *Gateway) Do(ctx context.Context, req *Request) (*Exchange, error) {
	x, err := g.Start(ctx, req)
	if err != nil {
		return nil, err
	}
	if x.Immediate != nil {
		return x, x.Close()
	}
	return x, x.Forward(ctx)
}
