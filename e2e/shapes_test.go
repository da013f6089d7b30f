package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
)

// turnCheck says what a two-turn session must show.
type turnCheck struct {
	// Model is the request's "model" (default llama3-8b).
	Model string
	// BlockSize is the engine's block size (default 16): turn 2 must find
	// all of turn 1's full blocks but the last cached.
	BlockSize int
	// Header is set on both turns' requests (e.g. a cache salt carrier).
	Header map[string]string
}

// turnTwoFollowsTurnOne sends turn 1 of session sess through router r0
// and turn 2 through r1 (which may be r0), after waiting until r1 learns
// from the directory where turn 1's blocks live. It checks that turn 2
// lands on turn 1's worker, not by a fallback, that the router predicted
// cached tokens, and that the engine reports at least all of turn 1's
// full blocks but the last as cached. It returns both answers.
func turnTwoFollowsTurnOne(t *testing.T, ctx context.Context, r0, r1, sess string, i int, tc turnCheck) (a1, a2 answer) {
	t.Helper()
	if tc.Model == "" {
		tc.Model = "llama3-8b"
	}
	if tc.BlockSize == 0 {
		tc.BlockSize = 16
	}
	c := chatRequest{Model: tc.Model, MaxTokens: 4, Messages: []message{
		{Role: "system", Content: systemPrompt(i)}, {Role: "user", Content: fmt.Sprintf("Question %d: what does a prefix cache save?", i)}}}
	a1, err := sendWith(ctx, r0, sess, c, tc.Header)
	if err != nil || a1.status != 200 {
		t.Fatalf("turn 1 of %s: %v %+v", sess, err, a1)
	}
	c.Messages = append(c.Messages, message{Role: "assistant", Content: a1.content}, message{Role: "user", Content: "And what does it cost?"})
	testkit.Eventually(t, 15*time.Second, "the directory to hold turn 1's blocks", func() (bool, string) {
		e, err := explainWith(ctx, r1, sess, c, tc.Header)
		if err != nil {
			return false, err.Error()
		}
		return e.Pick == a1.worker && e.PredictedCachedTokens > 0 && e.Fallback == "",
			fmt.Sprintf("pick %s (turn 1 on %s), predicted %d, fallback %q", e.Pick, a1.worker, e.PredictedCachedTokens, e.Fallback)
	})
	a2, err = sendWith(ctx, r1, sess, c, tc.Header)
	if err != nil || a2.status != 200 {
		t.Fatalf("turn 2 of %s: %v %+v", sess, err, a2)
	}
	if a2.worker != a1.worker || a2.fallback != "" {
		t.Fatalf("%s: turn 1 on %s, turn 2 on %s (fallback %q)", sess, a1.worker, a2.worker, a2.fallback)
	}
	// Turn 1's prompt ends with the generation prompt, which turn 2
	// renders differently, so all but its last partial block and those
	// few tokens must come from the cache.
	if a2.cached < (a1.prompt/tc.BlockSize-1)*tc.BlockSize || a2.cached == 0 {
		t.Fatalf("%s: engine reported %d cached tokens of turn 2 (turn 1 had %d prompt tokens, block size %d)", sess, a2.cached, a1.prompt, tc.BlockSize)
	}
	if a2.predicted == "" || a2.predicted == "0" {
		t.Fatalf("%s: router predicted no cached tokens (%q)", sess, a2.predicted)
	}
	return a1, a2
}

// engineShape is one way an engine can present itself to kvdir: the
// flags that make the simulator (and, where the operator must say so, the
// agent and router) take that shape.
type engineShape struct {
	name                              string
	engineArgs, agentArgs, routerArgs []string
	check                             turnCheck
}

// engineShapes are the model families and engines kvdir serves; each
// runs end to end: simulator in that shape, ZMQ, agent, 3-node
// directory, two routers.
var engineShapes = []engineShape{
	{name: "vllm full attention, block 16"},
}

// TestEngineShapes checks, for every engine shape, that turn 2 of a
// session lands where turn 1's blocks are and the engine reports them
// cached.
func TestEngineShapes(t *testing.T) {
	ctx := context.Background()
	for _, sh := range engineShapes {
		t.Run(sh.name, func(t *testing.T) {
			f := fleet.New(t, fleet.Config{Engines: 2, Routers: 2, Model: sh.check.Model,
				EngineArgs: append([]string{"--time-scale", "0.02", "--default-max-tokens", "4"}, sh.engineArgs...),
				AgentArgs:  sh.agentArgs,
				RouterArgs: append([]string{"--policy", "kvdir", "--match-timeout", "200ms"}, sh.routerArgs...)})
			for i := range 2 {
				turnTwoFollowsTurnOne(t, ctx, f.Routers[0].URL, f.Routers[1].URL, fmt.Sprintf("shape-%d", i), i, sh.check)
			}
		})
	}
}
