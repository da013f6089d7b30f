package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/kvdir/kvdir/internal/openai"
)

// loraModule is one LoRA adapter given with --lora-modules, as vLLM's
// LoRAModulePath: a name requests use as their model, the adapter's path
// and, optionally, the base model it applies to.
type loraModule struct {
	Name          string `json:"name"`
	Path          string `json:"path"`
	BaseModelName string `json:"base_model_name,omitempty"`
}

// loraFlag is the value of --lora-modules. Like vLLM's flag it takes
// name=path items or a JSON object {"name","path","base_model_name"};
// items may also be comma-separated, and the flag repeated, each time
// adding to the list.
type loraFlag struct{ p *[]loraModule }

func (f loraFlag) Type() string { return "name=path,..." }

func (f loraFlag) String() string {
	if f.p == nil {
		return ""
	}
	items := make([]string, len(*f.p))
	for i, m := range *f.p {
		items[i] = m.Name + "=" + m.Path
	}
	return strings.Join(items, ",")
}

// Set adds the adapters of one flag value.
func (f loraFlag) Set(s string) error {
	mods, err := parseLoRAModules(s)
	if err != nil {
		return err
	}
	*f.p = append(*f.p, mods...)
	return nil
}

// parseLoRAModules reads one --lora-modules value: a JSON object (or an
// array of them), or comma-separated name=path items.
func parseLoRAModules(s string) ([]loraModule, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "{") || strings.HasPrefix(s, "[") {
		dec := json.NewDecoder(strings.NewReader(s))
		dec.DisallowUnknownFields()
		var mods []loraModule
		if s[0] == '{' {
			var m loraModule
			if err := dec.Decode(&m); err != nil {
				return nil, fmt.Errorf("invalid JSON for --lora-modules %s: %w", s, err)
			}
			mods = []loraModule{m}
		} else if err := dec.Decode(&mods); err != nil {
			return nil, fmt.Errorf("invalid JSON for --lora-modules %s: %w", s, err)
		}
		if dec.More() {
			return nil, fmt.Errorf("invalid JSON for --lora-modules %s: trailing data (give one JSON object per flag)", s)
		}
		for _, m := range mods {
			if m.Name == "" || m.Path == "" {
				return nil, fmt.Errorf("--lora-modules %s: name and path are required", s)
			}
		}
		return mods, nil
	}
	var mods []loraModule
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, path, ok := strings.Cut(item, "=")
		if !ok || name == "" || path == "" || strings.Contains(path, "=") {
			return nil, fmt.Errorf("--lora-modules %q: want name=path (or a JSON object {\"name\",\"path\",\"base_model_name\"})", item)
		}
		mods = append(mods, loraModule{Name: name, Path: path})
	}
	return mods, nil
}

// checkLoRA refuses adapters the engine cannot serve: a name given twice
// or equal to the served model, and a base model that is not the served
// one (the simulator serves one base model).
func (c *config) checkLoRA() error {
	seen := map[string]bool{}
	for _, m := range c.loraModules {
		switch {
		case m.Name == c.model:
			return fmt.Errorf("--lora-modules: adapter name %q is the served model's name", m.Name)
		case seen[m.Name]:
			return fmt.Errorf("--lora-modules: adapter %q given twice", m.Name)
		case m.BaseModelName != "" && m.BaseModelName != c.model:
			return fmt.Errorf("--lora-modules: adapter %q has base_model_name %q, but the served model is %q", m.Name, m.BaseModelName, c.model)
		}
		seen[m.Name] = true
	}
	return nil
}

// adapterOf returns the LoRA adapter named model and its integer id
// (vLLM's lora_int_id: 1 for the first --lora-modules adapter, and so on),
// or ok false if model names no adapter.
func (s *server) adapterOf(model string) (name string, id int64, ok bool) {
	for i, m := range s.cfg.loraModules {
		if m.Name == model {
			return m.Name, int64(i + 1), true
		}
	}
	return "", 0, false
}

// modelCard is a card of GET /v1/models as vLLM's ModelCard: parent null
// for the base model, max_model_len null for an adapter.
type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen *int    `json:"max_model_len"`
}

// modelCards lists the served model and, as vLLM's show_available_models
// does, one card per adapter: id the adapter's name, root its path, parent
// the base model's name.
func (s *server) modelCards() []modelCard {
	out := []modelCard{{ID: s.cfg.model, Object: openai.ObjectModel, Created: s.start.Unix(), OwnedBy: "vllm",
		Root: s.cfg.model, MaxModelLen: &s.cfg.maxModelLen}}
	for _, m := range s.cfg.loraModules {
		out = append(out, modelCard{ID: m.Name, Object: openai.ObjectModel, Created: s.start.Unix(), OwnedBy: "vllm",
			Root: m.Path, Parent: &s.cfg.model})
	}
	return out
}

func (s *server) handleModels(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{openai.ObjectList, s.modelCards()})
}
