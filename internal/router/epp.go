package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvdir/kvdir/internal/openai"
)

// The endpoint picker protocol of the Gateway API Inference Extension: the
// names its data plane (Envoy's ext_proc filter) and endpoint picker agree
// on.
const (
	// EPPDestinationHeader is the request header, and the key in
	// EPPMetadataNamespace of the dynamic metadata, naming the endpoint
	// ("ip:port") the data plane is to send the request to.
	EPPDestinationHeader = "x-gateway-destination-endpoint"
	// EPPMetadataNamespace is the dynamic metadata namespace of the picked
	// endpoint, and of the filter metadata naming the endpoint that served.
	EPPMetadataNamespace = "envoy.lb"
	// EPPSubsetNamespace and EPPSubsetKey locate the subset hint in the
	// request's filter metadata: a list of "ip:port" the pick must be one
	// of.
	EPPSubsetNamespace = "envoy.lb.subset_hint"
	EPPSubsetKey       = "x-gateway-destination-endpoint-subset"
	// EPPServedKey, in EPPMetadataNamespace of the filter metadata of the
	// response phases, names the endpoint that served the request.
	EPPServedKey = "x-gateway-destination-endpoint-served"
	// EPPServiceName is the ext_proc service as the health service names
	// it; its status is readiness's.
	EPPServiceName = "envoy.service.ext_proc.v3.ExternalProcessor"
	// EPPLiveness and EPPReadiness are the health services the protocol
	// adds: the process answers, and the picker can place requests.
	EPPLiveness  = "liveness"
	EPPReadiness = "readiness"
)

// subsetKey names the subset hint in errors.
const subsetKey = EPPSubsetNamespace + "/" + EPPSubsetKey

// endpointSubset is a request's subset hint: the endpoints it may go to.
type endpointSubset struct {
	list []string // as given, normalised
	set  map[string]bool
}

// newEndpointSubset returns the subset of the endpoints in list, each
// normalised as endpointOf normalises a worker's (lower-case host, IPv6 in
// brackets).
func newEndpointSubset(list []string) *endpointSubset {
	sub := &endpointSubset{list: make([]string, 0, len(list)), set: make(map[string]bool, len(list))}
	for _, e := range list {
		e = normalEndpoint(e)
		if e == "" || sub.set[e] {
			continue
		}
		sub.list = append(sub.list, e)
		sub.set[e] = true
	}
	return sub
}

// normalEndpoint normalises a "host:port" as endpointOf writes one.
func normalEndpoint(e string) string {
	e = strings.TrimSpace(e)
	host, port, err := net.SplitHostPort(e)
	if err != nil {
		return strings.ToLower(e)
	}
	return net.JoinHostPort(strings.ToLower(host), port)
}

// has reports whether endpoint is in the subset.
func (sub *endpointSubset) has(endpoint string) bool { return sub.set[endpoint] }

// String lists the subset's first endpoints, for errors.
func (sub *endpointSubset) String() string {
	const shown = 8
	if len(sub.list) <= shown {
		return strings.Join(sub.list, ",")
	}
	return strings.Join(sub.list[:shown], ",") + fmt.Sprintf(",... (%d more)", len(sub.list)-shown)
}

// subsetHint reads the subset hint from a request's filter metadata: nil
// when the metadata has none. A list of strings is the protocol's form; a
// single string of comma-separated endpoints is taken too.
func subsetHint(md *corev3.Metadata) *endpointSubset {
	ns, ok := md.GetFilterMetadata()[EPPSubsetNamespace]
	if !ok {
		return nil
	}
	v, ok := ns.GetFields()[EPPSubsetKey]
	if !ok {
		return nil
	}
	var list []string
	switch k := v.GetKind().(type) {
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			if s, ok := e.GetKind().(*structpb.Value_StringValue); ok {
				list = append(list, s.StringValue)
			}
		}
	case *structpb.Value_StringValue:
		list = strings.Split(k.StringValue, ",")
	}
	return newEndpointSubset(list)
}

// servedEndpoint reads the endpoint that served the request from a
// response phase's filter metadata ("" when absent).
func servedEndpoint(md *corev3.Metadata) string {
	return md.GetFilterMetadata()[EPPMetadataNamespace].GetFields()[EPPServedKey].GetStringValue()
}

// headerValue returns a header's value: Envoy sends raw_value, older
// versions value.
func headerValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}

// httpHeaders converts an ext_proc header map (pseudo-headers included, as
// ":path") into an http.Header.
func httpHeaders(m *corev3.HeaderMap) http.Header {
	h := make(http.Header, len(m.GetHeaders()))
	for _, hv := range m.GetHeaders() {
		h.Add(hv.GetKey(), headerValue(hv))
	}
	return h
}

// setHeader is a header mutation's option replacing key's value.
func setHeader(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: strings.ToLower(key), RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
}

// immediate is the ImmediateResponse answering e, with the same
// OpenAI-style JSON body the proxy writes.
func immediate(e *apiError) *extprocv3.ProcessingResponse {
	body, _ := json.Marshal(openai.Error{Error: openai.ErrorBody{Message: e.msg, Type: e.kind, Code: e.status}})
	hm := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("content-type", "application/json")}}
	if e.retryAfter > 0 {
		hm.SetHeaders = append(hm.SetHeaders, setHeader("retry-after", strconv.FormatInt(int64((e.retryAfter+time.Second-1)/time.Second), 10)))
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status: &typev3.HttpStatus{Code: typev3.StatusCode(e.status)}, Headers: hm, Body: body,
		Details: "kvdir_router_" + strings.ReplaceAll(strings.ToLower(http.StatusText(e.status)), " ", "_"),
	}}}
}

// destinationMetadata is the dynamic metadata naming the picked endpoint.
func destinationMetadata(endpoint string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		EPPMetadataNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			EPPDestinationHeader: structpb.NewStringValue(endpoint)}}),
	}}
}

// RegisterEPP registers the router's endpoint picker on gs: Envoy's
// external processing service (envoy.service.ext_proc.v3), speaking the
// Gateway API Inference Extension's endpoint picker protocol, and the gRPC
// health service, with the protocol's services: "" and EPPLiveness serve
// while the process runs, EPPReadiness and EPPServiceName follow Ready.
// The health statuses are updated until ctx ends, then set to NOT_SERVING.
//
// Each ext_proc stream is one request: its headers are answered at once
// (request_header_mode SEND), its body is read to its end (request_body_mode
// BUFFERED; in one message or several, or FULL_DUPLEX_STREAMED when the
// data plane's protocol configuration says so), and the request is placed
// as the proxy places it (same decision, admission queue, speculative
// entries and shared intents). The answer sets EPPDestinationHeader and
// the same endpoint in the dynamic metadata; a request the router refuses
// gets an ImmediateResponse with the status and body the proxy would
// answer. The response phases (headers, body chunks, trailers) are
// observed as the proxy observes a relayed response: first byte, usage,
// end of stream; with response_body_mode FULL_DUPLEX_STREAMED each body
// chunk is streamed back unchanged.
func (s *Server) RegisterEPP(ctx context.Context, gs *grpc.Server) {
	extprocv3.RegisterExternalProcessorServer(gs, &eppServer{s: s})
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	hs.SetServingStatus(EPPLiveness, healthpb.HealthCheckResponse_SERVING)
	set := func(ready bool) {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if ready {
			st = healthpb.HealthCheckResponse_SERVING
		}
		hs.SetServingStatus(EPPReadiness, st)
		hs.SetServingStatus(EPPServiceName, st)
	}
	ready, _ := s.Ready()
	set(ready)
	go func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				hs.Shutdown()
				return
			case <-t.C:
				ready, _ := s.Ready()
				set(ready)
			}
		}
	}()
}

// eppServer is the ext_proc service.
type eppServer struct {
	extprocv3.UnimplementedExternalProcessorServer
	s *Server
}

// Process serves one request's ext_proc stream.
func (e *eppServer) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	x := &eppExchange{s: e.s, stream: stream, ctx: stream.Context()}
	err := x.run()
	x.finish(err)
	if err != nil && !errors.Is(err, io.EOF) && x.ctx.Err() == nil {
		return err
	}
	return nil
}

// eppExchange is one ext_proc stream: one request and its response.
type eppExchange struct {
	s      *Server
	stream extprocv3.ExternalProcessor_ProcessServer
	ctx    context.Context

	fullDuplex bool // request_body_mode FULL_DUPLEX_STREAMED: the headers are answered with the pick
	// respDuplex: response_body_mode FULL_DUPLEX_STREAMED, where the data
	// plane sends on only the body the picker streams back.
	respDuplex bool
	reqHeaders http.Header // the request's headers, pseudo-headers included
	subset     *endpointSubset
	hinted     bool // a message carried the subset hint (subset may still be nil: then none)
	body       []byte
	bodyParts  int
	placed     bool // the request was answered (picked, or refused)

	f           *flight
	ticket      *admitTicket
	status      int  // the response's :status (0 until its headers)
	eventStream bool // the response is an event stream
	usage       usageScanner
	ended       bool   // the response's end was accounted
	served      string // the endpoint the data plane reports serving
	explainOK   bool
}

// run reads the stream until it ends or the request is answered with an
// immediate response.
func (x *eppExchange) run() error {
	for {
		msg, err := x.stream.Recv()
		if err != nil {
			return err
		}
		if pc := msg.GetProtocolConfig(); pc != nil {
			x.fullDuplex = pc.GetRequestBodyMode() == procmodev3.ProcessingMode_FULL_DUPLEX_STREAMED
			x.respDuplex = pc.GetResponseBodyMode() == procmodev3.ProcessingMode_FULL_DUPLEX_STREAMED
		}
		if !x.hinted {
			if sub := subsetHint(msg.GetMetadataContext()); sub != nil {
				x.subset, x.hinted = sub, true
			}
		}
		if ep := servedEndpoint(msg.GetMetadataContext()); ep != "" {
			x.served = normalEndpoint(ep)
		}
		done, err := x.handle(msg)
		if err != nil || done {
			return err
		}
	}
}

// handle answers one message; done says the exchange is over.
func (x *eppExchange) handle(msg *extprocv3.ProcessingRequest) (done bool, err error) {
	switch r := msg.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		x.reqHeaders = httpHeaders(r.RequestHeaders.GetHeaders())
		x.explainOK = x.s.explainAllowed(x.reqHeaders)
		if x.reqHeaders.Get(":method") == http.MethodGet && x.path() == "/v1/models" {
			// The router knows the pool's models: it answers, as the
			// proxy does.
			return true, x.answerModels()
		}
		if aerr := x.checkTarget(); aerr != nil {
			return true, x.refuse(aerr)
		}
		if r.RequestHeaders.GetEndOfStream() {
			return true, x.refuse(badRequest("the request has no body: the router places OpenAI chat and completion requests, whose JSON body names the model and the prompt"))
		}
		if x.fullDuplex {
			return false, nil // answered with the pick, once the body is in
		}
		return false, x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}})
	case *extprocv3.ProcessingRequest_RequestBody:
		if x.placed {
			return false, x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}})
		}
		x.bodyParts++
		if int64(len(x.body))+int64(len(r.RequestBody.GetBody())) > x.s.cfg.MaxBodyBytes {
			return true, x.refuse(&apiError{status: http.StatusRequestEntityTooLarge, kind: "BadRequestError",
				msg: "request body is larger than the router's limit of " + strconv.FormatInt(x.s.cfg.MaxBodyBytes, 10) + " bytes"})
		}
		x.body = append(x.body, r.RequestBody.GetBody()...)
		if !r.RequestBody.GetEndOfStream() {
			return false, nil // the rest of the body comes; it is answered once, at its end
		}
		return x.pick()
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if !x.placed {
			// Trailers end the request: its body is all in.
			if done, err := x.pick(); done || err != nil {
				return done, err
			}
		}
		return false, x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		h := httpHeaders(r.ResponseHeaders.GetHeaders())
		x.status, _ = strconv.Atoi(h.Get(":status"))
		x.eventStream = isEventStream(h.Get("Content-Type"))
		x.usage = usageScanner{stream: x.eventStream}
		hm := &extprocv3.HeaderMutation{}
		if x.f != nil {
			dh := http.Header{}
			x.f.decorate(dh, x.explainOK)
			for k, vs := range dh {
				hm.SetHeaders = append(hm.SetHeaders, setHeader(k, strings.Join(vs, ",")))
			}
		}
		err := x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: hm}}}})
		if r.ResponseHeaders.GetEndOfStream() {
			x.end(OutcomeOK)
		}
		return false, err
	case *extprocv3.ProcessingRequest_ResponseBody:
		if b := r.ResponseBody.GetBody(); len(b) > 0 && x.f != nil {
			x.f.firstByte()
			x.usage.feed(b)
		}
		err := x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: x.responseChunk(r.ResponseBody)}})
		if r.ResponseBody.GetEndOfStream() {
			x.end(OutcomeOK)
		}
		return false, err
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		x.end(OutcomeOK)
		return false, x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
	return false, nil
}

// responseChunk answers one response body chunk: an empty answer when the
// data plane keeps the chunk (STREAMED, BUFFERED), the chunk itself,
// unchanged, when it sends on what the picker streams back
// (FULL_DUPLEX_STREAMED).
func (x *eppExchange) responseChunk(b *extprocv3.HttpBody) *extprocv3.BodyResponse {
	if !x.respDuplex {
		return &extprocv3.BodyResponse{}
	}
	return &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
			Body: b.GetBody(), EndOfStream: b.GetEndOfStream()}}}}}
}

// checkTarget refuses a request that is not an OpenAI chat or completion
// POST.
func (x *eppExchange) checkTarget() *apiError {
	if m := x.reqHeaders.Get(":method"); m != "" && m != http.MethodPost {
		return badRequest("not an OpenAI request the router places: %s %s (want POST %s or %s, or GET /v1/models)", m, x.path(), PathChat, PathCompletions)
	}
	switch x.path() {
	case PathChat, PathCompletions:
		return nil
	}
	return badRequest("not an OpenAI request the router places: path %q (want POST %s or %s, or GET /v1/models)", x.path(), PathChat, PathCompletions)
}

// path is the request's :path without its query.
func (x *eppExchange) path() string {
	p, _, _ := strings.Cut(x.reqHeaders.Get(":path"), "?")
	return p
}

// pick parses the buffered body, places the request and answers with the
// endpoint (or the refusal).
func (x *eppExchange) pick() (done bool, err error) {
	x.placed = true
	req, aerr := parseRequest(x.body, x.path() == PathChat)
	if aerr == nil {
		req.session = x.reqHeaders.Get(x.s.cfg.SessionHeader)
		if len(req.session) > 1024 {
			aerr = badRequest("%s is longer than 1024 bytes", x.s.cfg.SessionHeader)
		}
	}
	if aerr != nil {
		x.s.metrics.requests.WithLabelValues("none", x.s.policy.Name(), OutcomeRejected).Inc()
		return true, x.refuse(aerr)
	}
	if x.hinted {
		req.subset = x.subset
	}
	f, aerr, cancelled := x.s.place(x.ctx, req, nil, true, &x.ticket)
	x.ticket.release()
	if cancelled {
		return true, x.ctx.Err()
	}
	if aerr != nil {
		return true, x.refuse(aerr)
	}
	x.f = f
	hm := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(EPPDestinationHeader, f.wk.endpoint)},
		// The router reads usage from the response, so it asks for it
		// uncompressed; the operator's explain token is never an engine's.
		RemoveHeaders: []string{"accept-encoding", strings.ToLower(HeaderExplainToken)}}
	if f.wk.hasRank {
		hm.SetHeaders = append(hm.SetHeaders, setHeader(HeaderDataParallelRank, strconv.Itoa(f.wk.rank)))
	}
	md := destinationMetadata(f.wk.endpoint)
	if !x.fullDuplex {
		// Buffered: the answer to the body's last message carries the
		// pick (the messages before it get none: Envoy buffers the body
		// into one message, a data plane that splits it waits for its end).
		return false, x.send(&extprocv3.ProcessingResponse{DynamicMetadata: md, Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: hm, ClearRouteCache: true}}}})
	}
	// Full duplex: the headers, held until now, go on with the pick, then
	// the body as it came.
	if err := x.send(&extprocv3.ProcessingResponse{DynamicMetadata: md, Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
		Response: &extprocv3.CommonResponse{HeaderMutation: hm, ClearRouteCache: true}}}}); err != nil {
		return true, err
	}
	return false, x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
		Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: x.body, EndOfStream: true}}}}}}})
}

// answerModels answers GET /v1/models with the workers' models and LoRA
// adapters, as an immediate response.
func (x *eppExchange) answerModels() error {
	x.placed = true
	body, err := json.Marshal(x.s.modelList())
	if err != nil {
		return fmt.Errorf("router: epp: models: %w", err)
	}
	return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status: &typev3.HttpStatus{Code: typev3.StatusCode_OK}, Body: body,
		Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("content-type", "application/json")}},
	}}})
}

// refuse answers the request with aerr as an immediate response.
func (x *eppExchange) refuse(aerr *apiError) error {
	x.placed = true
	x.s.log.Debug("router: epp: refusing a request", "status", aerr.status, "err", aerr.msg)
	return x.send(immediate(aerr))
}

// send sends one response on the stream.
func (x *eppExchange) send(r *extprocv3.ProcessingResponse) error {
	if err := x.stream.Send(r); err != nil {
		return fmt.Errorf("router: epp: send: %w", err)
	}
	return nil
}

// end accounts the response's end; outcome OK is refined by the status.
func (x *eppExchange) end(outcome string) {
	if x.f == nil || x.ended {
		return
	}
	x.ended = true
	if outcome == OutcomeOK {
		outcome = outcomeOf(false, false, x.status)
	}
	if x.served != "" && x.served != x.f.wk.endpoint {
		x.s.log.Warn("router: epp: the data plane served the request at another endpoint than the one picked; accounted on the picked worker",
			"picked", x.f.wk.endpoint, "served", x.served, "worker", x.f.wk.id)
	}
	x.f.end(outcome, &x.usage, x.eventStream)
}

// finish accounts a stream that ended (err: how) before the response's end
// was seen: a request placed that got no response never reached its worker
// for the router's accounting (the data plane could not connect, or the
// client left); one whose response had begun is cancelled, or, when the
// data plane closed the stream cleanly without sending the response's end
// (a response body mode of NONE), ended by its status.
func (x *eppExchange) finish(err error) {
	x.ticket.release()
	if x.f == nil || x.ended {
		return
	}
	switch {
	case x.status == 0:
		x.f.abort()
		x.s.metrics.requests.WithLabelValues(x.f.wk.id, x.f.d.policy, OutcomeCancelled).Inc()
		x.ended = true
	case errors.Is(err, io.EOF):
		x.end(OutcomeOK)
	default:
		if status.Code(err) != codes.Canceled && x.ctx.Err() == nil {
			x.s.log.Debug("router: epp: stream broke during the response", "worker", x.f.wk.id, "err", err)
		}
		x.end(OutcomeCancelled)
	}
}
