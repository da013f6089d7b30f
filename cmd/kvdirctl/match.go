package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/clitable"
	"github.com/kvdir/kvdir/internal/ctlview"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func (a *app) matchCommand() *cobra.Command {
	var (
		in         promptInput
		consistent bool
	)
	cmd := &cobra.Command{
		Use:   "match",
		Short: "Each worker's cached prefix of a prompt (matched blocks and tokens)",
		Long: `match tokenizes a prompt the way the engines and the router do (chat messages
with the ChatML template over cl100k; completion text with cl100k alone;
token ids as given), hashes it into a chain of content hashes for each
worker's namespace (model, block size, LoRA adapter, cache salt), the same
hashes the agents publish, and asks the directory how many leading blocks of
the chain each worker of the model holds.

MATCHED-TOKENS is matched blocks times the block size. HIT-TOKENS is what the
engine would report as usage.prompt_tokens_details.cached_tokens if the
prompt went there now: a hit stops short of the prompt's last token (vLLM
always computes at least one), so a prompt that is all full blocks hits one
block less.`,
		Example: `  kvdirctl match --model llama3-8b --chat "What does a prefix cache save?" --system "Answer in one sentence."
  kvdirctl match --messages request.json
  kvdirctl match --model llama3-8b --prompt "Once upon a time"
  kvdirctl match --model llama3-8b --tokens 9906,1917,0 -o json`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := in.parse()
			if err != nil {
				return err
			}
			return a.match(cmd.Context(), p, in.lora, consistent)
		},
	}
	in.addFlags(cmd, "the model (the OpenAI \"model\" name; default: the messages file's, or the only model the workers serve)")
	cmd.Flags().BoolVar(&consistent, "consistent", false, "read through the leader (linearizable) instead of any node")
	cmd.RegisterFlagCompletionFunc("model", a.completeModels)
	return cmd
}

// resolveModel returns the prompt's model or, when none was given, the only
// model the registered workers serve.
func (a *app) resolveModel(ctx context.Context, model string) (string, error) {
	if model != "" {
		return model, nil
	}
	var models []string
	err := a.eachGroup(func(*dirGroup) error {
		c, err := a.dir()
		if err != nil {
			return err
		}
		lw, err := c.ListWorkers(ctx, "", false)
		if err != nil {
			return err
		}
		for _, w := range lw.Workers {
			if m := w.GetSpec().GetModel(); !slices.Contains(models, m) {
				models = append(models, m)
			}
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	switch len(models) {
	case 0:
		return "", usageErrorf("--model is not set and no worker is registered to take it from")
	case 1:
		return models[0], nil
	}
	slices.Sort(models)
	return "", usageErrorf("--model is not set and the workers serve several models: %s", strings.Join(models, ", "))
}

func (a *app) match(ctx context.Context, p *prompt, lora string, consistent bool) error {
	model, err := a.resolveModel(ctx, p.model)
	if err != nil {
		return err
	}
	ids, err := p.tokenIDs()
	if err != nil {
		return err
	}
	if err := a.groupOfModel(ctx, model); err != nil {
		return err
	}
	c, err := a.dir()
	if err != nil {
		return err
	}
	lw, err := c.ListWorkers(ctx, model, false)
	if err != nil {
		return err
	}
	doc := ctlview.Match{Model: model, PromptKind: p.kind(), PromptTokens: len(ids), CacheSalt: p.cacheSalt, LoRA: lora,
		Workers: []ctlview.MatchRow{}, Read: []ctlview.Read{}}
	// One chain and one Match per block size among the model's workers.
	bySize := map[uint32][]*kvdirv1.Worker{}
	var sizes []uint32
	for _, w := range lw.Workers {
		bs := effectiveBlockSize(w)
		if _, ok := bySize[bs]; !ok {
			sizes = append(sizes, bs)
		}
		bySize[bs] = append(bySize[bs], w)
	}
	slices.Sort(sizes)
	for _, bs := range sizes {
		if bs < 1 || bs > blockhash.MaxBlockSize {
			return fmt.Errorf("worker %s block size %d, outside 1..%d", bySize[bs][0].GetSpec().GetId(), bs, blockhash.MaxBlockSize)
		}
		h, err := blockhash.New(blockhash.Namespace{Model: model, LoRA: lora, CacheSalt: p.cacheSalt, BlockSize: int(bs)})
		if err != nil {
			return usageErrorf("hashing namespace: %v", err)
		}
		chain := h.Chain(nil, ids, nil)
		got := map[string]*kvdirv1.WorkerMatch{}
		if len(chain) > 0 {
			resp, err := c.MatchChain(ctx, chain, bs, consistent)
			if err != nil {
				return err
			}
			doc.Read = append(doc.Read, readOf(resp.Read))
			for _, m := range resp.Matches {
				got[m.WorkerId] = m
			}
		}
		maxHit := uint32(0)
		if len(ids) > 0 {
			maxHit = uint32((len(ids) - 1) / int(bs))
		}
		for _, w := range bySize[bs] {
			id := w.GetSpec().GetId()
			r := ctlview.MatchRow{Worker: id, State: stateName(w.State), BlockSize: bs, ChainBlocks: len(chain)}
			if m := got[id]; m != nil {
				r.MatchedBlocks, r.GPUBlocks, r.CPUBlocks, r.DiskBlocks, r.RemoteBlocks = m.Blocks, m.GpuBlocks, m.CpuBlocks, m.DiskBlocks, m.RemoteBlocks
			}
			r.MatchedTokens = uint64(r.MatchedBlocks) * uint64(bs)
			r.HitTokens = uint64(min(r.MatchedBlocks, maxHit)) * uint64(bs)
			if len(ids) > 0 {
				r.Percent = clitable.Float(100 * float64(r.MatchedTokens) / float64(len(ids)))
			}
			doc.Workers = append(doc.Workers, r)
		}
	}
	slices.SortStableFunc(doc.Workers, func(x, y ctlview.MatchRow) int {
		if x.MatchedTokens != y.MatchedTokens {
			if x.MatchedTokens > y.MatchedTokens {
				return -1
			}
			return 1
		}
		return strings.Compare(x.Worker, y.Worker)
	})
	return a.write(a.out, doc, func(out io.Writer) error {
		fmt.Fprintf(out, "prompt: %d tokens (%s), model %s", doc.PromptTokens, doc.PromptKind, model)
		if p.cacheSalt != "" {
			fmt.Fprintf(out, ", cache salt %q", p.cacheSalt)
		}
		if lora != "" {
			fmt.Fprintf(out, ", LoRA %s", lora)
		}
		fmt.Fprintln(out)
		if len(doc.Workers) == 0 {
			fmt.Fprintf(out, "No worker of model %s is registered.\n", model)
			return nil
		}
		fmt.Fprintln(out)
		t := clitable.NewTab("WORKER", "STATE", "BLOCK-SIZE", "MATCHED-BLOCKS", "MATCHED-TOKENS", "HIT-TOKENS", "OF-PROMPT", "GPU", "CPU")
		for _, r := range doc.Workers {
			t.Add(r.Worker, r.State, r.BlockSize, fmt.Sprintf("%d/%d", r.MatchedBlocks, r.ChainBlocks), r.MatchedTokens, r.HitTokens,
				fmt.Sprintf("%.1f%%", r.Percent), r.GPUBlocks, r.CPUBlocks)
		}
		_, err := t.WriteTo(out)
		return err
	})
}
