package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/kvdir/kvdir/internal/openai"
)

// apiError is an error answered to the client as an OpenAI-style body.
type apiError struct {
	status int    // HTTP status
	kind   string // OpenAI error type
	msg    string
	// retryAfter, when positive, is sent as Retry-After (whole seconds,
	// rounded up).
	retryAfter time.Duration
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s: %s", e.status, e.kind, e.msg) }

func badRequest(format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, kind: "BadRequestError", msg: fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) *apiError {
	return &apiError{status: http.StatusNotFound, kind: "NotFoundError", msg: fmt.Sprintf(format, args...)}
}

func unavailable(format string, args ...any) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, kind: "ServiceUnavailableError", msg: fmt.Sprintf(format, args...)}
}

func badGateway(format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadGateway, kind: "BadGatewayError", msg: fmt.Sprintf(format, args...)}
}

// writeError writes e as {"error": {"message", "type", "code"}}.
func writeError(w http.ResponseWriter, e *apiError) {
	w.Header().Set("Content-Type", "application/json")
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(int64((e.retryAfter+time.Second-1)/time.Second), 10))
	}
	w.WriteHeader(e.status)
	_ = json.NewEncoder(w).Encode(openai.Error{Error: openai.ErrorBody{Message: e.msg, Type: e.kind, Code: e.status}})
}
