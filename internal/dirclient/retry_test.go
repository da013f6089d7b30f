package dirclient

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestRetryable(t *testing.T) {
	live := context.Background()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"unavailable", live, status.Error(codes.Unavailable, "no leader"), true},
		{"attempt deadline", live, status.Error(codes.DeadlineExceeded, "slow node"), true},
		{"call deadline", done, status.Error(codes.DeadlineExceeded, "slow node"), false},
		{"connection torn down", live, status.Error(codes.Canceled, "context canceled while waiting for connections to become ready"), true},
		{"caller cancelled", done, status.Error(codes.Canceled, "context canceled"), false},
		{"refused", live, status.Error(codes.PermissionDenied, "bad token"), false},
		{"plain error", live, errors.New("boom"), false},
	} {
		if got := retryable(c.ctx, c.err); got != c.want {
			t.Errorf("%s: retryable = %v, want %v", c.name, got, c.want)
		}
	}
}
