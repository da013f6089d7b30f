package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"
)

// DefaultModelsInterval is how often each engine's /v1/models is read.
const DefaultModelsInterval = 2 * time.Second

// maxModelsBody bounds a /v1/models answer.
const maxModelsBody = 4 << 20

// servedModels is what one engine's GET /v1/models lists: its base models
// and its LoRA adapters. vLLM lists each base model as a card with its
// served name as id, and each adapter (--lora-modules, or loaded at run
// time) as a card whose id is the adapter's name, parent the base model's
// served name and root the adapter's path
// (vllm/entrypoints/openai/serving_models.py, show_available_models).
type servedModels struct {
	bases    []string
	adapters map[string]adapterCard // by adapter name
}

// adapterCard is one LoRA adapter an engine serves.
type adapterCard struct {
	parent string // the base model's served name
	root   string // the adapter's path, as the engine says
}

// adapter returns the card of adapter name, if m lists it.
func (m *servedModels) adapter(name string) (adapterCard, bool) {
	if m == nil {
		return adapterCard{}, false
	}
	a, ok := m.adapters[name]
	return a, ok
}

// equal reports whether m and o list the same models.
func (m *servedModels) equal(o *servedModels) bool {
	if m == nil || o == nil {
		return m == o
	}
	if !slices.Equal(m.bases, o.bases) || len(m.adapters) != len(o.adapters) {
		return false
	}
	for k, v := range m.adapters {
		if ov, ok := o.adapters[k]; !ok || ov != v {
			return false
		}
	}
	return true
}

// adapterNames returns m's adapter names, sorted.
func (m *servedModels) adapterNames() []string {
	if m == nil {
		return nil
	}
	out := make([]string, 0, len(m.adapters))
	for k := range m.adapters {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// parseModelList reads a GET /v1/models body. A card with a non-empty
// parent is a LoRA adapter of that parent; any other card is a base model.
// Cards without an id, and an adapter listed twice with different parents,
// are errors: the list is then not used.
func parseModelList(r io.Reader) (*servedModels, error) {
	var list struct {
		Object string `json:"object"`
		Data   *[]struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
			Root   *string `json:"root"`
		} `json:"data"`
	}
	dec := json.NewDecoder(io.LimitReader(r, maxModelsBody))
	if err := dec.Decode(&list); err != nil {
		return nil, fmt.Errorf("decoding the model list: %w", err)
	}
	if list.Data == nil {
		return nil, errors.New("the model list has no data array")
	}
	m := &servedModels{adapters: map[string]adapterCard{}}
	for i, c := range *list.Data {
		if c.ID == "" {
			return nil, fmt.Errorf("model card %d has no id", i)
		}
		if c.Parent == nil || *c.Parent == "" {
			if !slices.Contains(m.bases, c.ID) {
				m.bases = append(m.bases, c.ID)
			}
			continue
		}
		a := adapterCard{parent: *c.Parent}
		if c.Root != nil {
			a.root = *c.Root
		}
		if old, ok := m.adapters[c.ID]; ok && old.parent != a.parent {
			return nil, fmt.Errorf("adapter %q is listed with parents %q and %q", c.ID, old.parent, a.parent)
		}
		m.adapters[c.ID] = a
	}
	slices.Sort(m.bases)
	return m, nil
}

// modelPoller reads each worker's /v1/models on its own interval, so the
// router learns which LoRA adapters a worker serves. A failed read keeps
// the last list and is counted; it never makes a worker down (the load
// scrape decides that).
type modelPoller struct {
	client    *http.Client
	interval  time.Duration
	timeout   time.Duration
	log       *slog.Logger
	onFailure func(w *worker, reason string)
}

// run polls w until w.stop closes or ctx ends.
func (p *modelPoller) run(ctx context.Context, w *worker) { w.every(ctx, p.interval, p.once) }

// once reads w's model list one time and stores it.
func (p *modelPoller) once(ctx context.Context, w *worker) {
	m, err := p.fetch(ctx, w)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		reason := scrapeReason(err)
		if p.onFailure != nil {
			p.onFailure(w, reason)
		}
		if w.modelsKO.Add(1) == 1 {
			p.log.Warn("router: cannot read the engine's model list; keeping the last one (LoRA adapters are routed by it)",
				"worker", w.id, "reason", reason, "err", err)
		}
		return
	}
	w.modelsKO.Store(0)
	if w.model() == "" && len(m.bases) == 1 {
		w.setModel(m.bases[0]) // a static worker without a model: the engine says
	}
	old := w.served.Swap(m)
	if !m.equal(old) {
		p.logChange(w, m)
	}
}

// logChange logs a worker's new model list and, when the names disagree
// with the model the worker is registered with, says so: the agent hashes
// its engine's blocks in the namespace of its --model, so an adapter whose
// parent has another name cannot be matched.
func (p *modelPoller) logChange(w *worker, m *servedModels) {
	reg := w.model()
	p.log.Info("router: engine model list", "worker", w.id, "models", strings.Join(m.bases, ","),
		"adapters", strings.Join(m.adapterNames(), ","))
	if reg == "" {
		return
	}
	if len(m.bases) > 0 && !slices.Contains(m.bases, reg) {
		p.log.Warn("router: the engine does not list the model the worker is registered with; the agent's --model must be the engine's served model name",
			"worker", w.id, "registered", reg, "served", strings.Join(m.bases, ","))
	}
	for _, name := range m.adapterNames() {
		if a := m.adapters[name]; a.parent != reg {
			p.log.Warn("router: the engine lists a LoRA adapter whose parent is not the model the worker is registered with; "+
				"its requests are hashed under the registered model, which is what the agent indexes, but the names should agree "+
				"(the agent's --model must be the engine's served base model name)",
				"worker", w.id, "adapter", name, "parent", a.parent, "registered", reg)
		}
	}
}

// fetch reads w's /v1/models.
func (p *modelPoller) fetch(ctx context.Context, w *worker) (*servedModels, error) {
	url := w.address + "/v1/models"
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	body, err := getBody(ctx, p.client, url, maxModelsBody)
	if err != nil {
		return nil, err
	}
	m, err := parseModelList(bytes.NewReader(body))
	if err != nil {
		return nil, &scrapeError{"read", fmt.Errorf("GET %s: %w", url, err)}
	}
	return m, nil
}

// servesModel reports whether w takes requests for model: its own model,
// or a LoRA adapter its engine lists. lora is the adapter ("" for the
// base model).
func (w *worker) servesModel(model string) (lora string, ok bool) {
	if w.model() == model {
		return "", true
	}
	if _, ok := w.served.Load().adapter(model); ok {
		return model, true
	}
	return "", false
}

// modelCard is one entry of the router's GET /v1/models.
type modelCard struct {
	id, parent, root string
}

// modelCards returns what the known workers serve: their models, then the
// LoRA adapters their engines list (each once, with the parent and root of
// the first worker by id listing it), each group sorted.
func (s *Server) modelCards() []modelCard {
	var bases, adapters []modelCard
	seen := map[string]bool{}
	for _, w := range s.pool.sorted() {
		if m := w.model(); m != "" && !seen[m] {
			seen[m] = true
			bases = append(bases, modelCard{id: m})
		}
	}
	for _, w := range s.pool.sorted() {
		sm := w.served.Load()
		for _, name := range sm.adapterNames() {
			if seen[name] {
				continue
			}
			seen[name] = true
			a := sm.adapters[name]
			adapters = append(adapters, modelCard{id: name, parent: a.parent, root: a.root})
		}
	}
	cmp := func(a, b modelCard) int { return strings.Compare(a.id, b.id) }
	slices.SortFunc(bases, cmp)
	slices.SortFunc(adapters, cmp)
	return append(bases, adapters...)
}
