package main

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/openai"
	"github.com/kvdir/kvdir/internal/tokenize"
)

// TestLoRAModulesFlag checks --lora-modules as vLLM takes it (name=path,
// a JSON object), plus comma-separated items, the repeated flag and the
// environment, and that bad values are usage errors.
func TestLoRAModulesFlag(t *testing.T) {
	noEnv := func(string) string { return "" }
	cfg, err := parseConfig([]string{"--lora-modules", "sql=/a/sql,chat=/a/chat", "--lora-modules",
		`{"name":"tool","path":"/a/tool","base_model_name":"llama3-8b"}`}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := []loraModule{{Name: "sql", Path: "/a/sql"}, {Name: "chat", Path: "/a/chat"}, {Name: "tool", Path: "/a/tool", BaseModelName: "llama3-8b"}}
	if !slices.Equal(cfg.loraModules, want) {
		t.Fatalf("modules %+v, want %+v", cfg.loraModules, want)
	}
	env := map[string]string{"KVDIR_ENGINESIM_LORA_MODULES": "sql=/a/sql"}
	if cfg, err = parseConfig(nil, func(k string) string { return env[k] }, io.Discard); err != nil || len(cfg.loraModules) != 1 || cfg.loraModules[0].Name != "sql" {
		t.Fatalf("from the environment: %+v %v", cfg.loraModules, err)
	}
	for _, v := range []string{"sql", "=/a", "sql=", "a=b=c", `{"name":"x"}`, `{"name":"x","path":"/p","rank":8}`, `{"name":`,
		"llama3-8b=/a/base", "sql=/a,sql=/b", `{"name":"x","path":"/p","base_model_name":"other"}`} {
		if _, err := parseConfig([]string{"--lora-modules", v}, noEnv, io.Discard); err == nil {
			t.Errorf("--lora-modules %s accepted", v)
		}
	}
}

// TestLoRAServing checks that /v1/models lists the adapters as vLLM does,
// that a request naming an adapter is answered under its name and cached
// in the adapter's own namespace, never shared with the base model, that
// its KV events carry lora_id and lora_name in both event forms, and that
// an unknown model is vLLM's 404.
func TestLoRAServing(t *testing.T) {
	for _, form := range []string{"array", "map"} {
		t.Run(form, func(t *testing.T) {
			sub, ep := newSub(t)
			s := startSim(t, "--time-scale", "0", "--kv-events-endpoint", ep, "--kv-events-form", form,
				"--lora-modules", "sql=/adapters/sql,chat=/adapters/chat")
			s.syncEvents(t, sub)

			code, body := s.get(t, "/v1/models")
			var list struct {
				Data []struct {
					ID          string  `json:"id"`
					Root        string  `json:"root"`
					Parent      *string `json:"parent"`
					MaxModelLen *int    `json:"max_model_len"`
				} `json:"data"`
			}
			if err := json.Unmarshal([]byte(body), &list); err != nil || code != 200 || len(list.Data) != 3 {
				t.Fatalf("/v1/models %d %s (%v)", code, body, err)
			}
			if b := list.Data[0]; b.ID != "llama3-8b" || b.Parent != nil || b.MaxModelLen == nil {
				t.Fatalf("base card %s", body)
			}
			if a := list.Data[1]; a.ID != "sql" || a.Root != "/adapters/sql" || a.Parent == nil || *a.Parent != "llama3-8b" || a.MaxModelLen != nil {
				t.Fatalf("adapter card %s", body)
			}
			if !strings.Contains(body, `"parent":null`) {
				t.Fatalf("the base card's parent is not null: %s", body)
			}

			tmpl, err := tokenize.ChatMLCL100K()
			if err != nil {
				t.Fatal(err)
			}
			chat := []tokenize.Message{msg("system", words(7, 400)), msg("user", words(8, 100))}
			prompt, _ := tmpl.RenderChat(chat, true)
			full := len(prompt) / 16 * 16
			ask := func(model string) openai.ChatCompletion {
				var r openai.ChatCompletion
				s.postOK(t, "/v1/chat/completions", map[string]any{"model": model, "messages": chat, "max_tokens": 2}, &r)
				if r.Model != model {
					t.Fatalf("response names model %q, want %q", r.Model, model)
				}
				return r
			}
			if r := ask("sql"); r.Usage.PromptTokensDetails.CachedTokens != 0 {
				t.Fatalf("first adapter request cached %d", r.Usage.PromptTokensDetails.CachedTokens)
			}
			var stored int
			for _, m := range drain(t, sub, 300*time.Millisecond) {
				for _, ev := range decode(t, m).Events {
					bs, ok := ev.(*kvevents.BlockStored)
					if !ok {
						continue
					}
					if bs.LoRAName != "sql" || bs.LoRAID == nil || *bs.LoRAID != 1 {
						t.Fatalf("BlockStored lora_name %q lora_id %v, want sql and 1", bs.LoRAName, bs.LoRAID)
					}
					// vLLM keys every block of an adapter's request by its name.
					if len(bs.ExtraKeys) != len(bs.BlockHashes) {
						t.Fatalf("BlockStored extra_keys %v for %d blocks", bs.ExtraKeys, len(bs.BlockHashes))
					}
					for _, k := range bs.ExtraKeys {
						if len(k) != 1 || k[0] != "sql" {
							t.Fatalf("BlockStored extra_keys %v, want [sql] per block", bs.ExtraKeys)
						}
					}
					stored += len(bs.BlockHashes)
				}
			}
			if stored < full/16 {
				t.Fatalf("%d blocks stored for the adapter's %d-token prompt", stored, len(prompt))
			}
			// The same prompt under the base model and under another
			// adapter finds nothing; under the same adapter, everything.
			if r := ask("llama3-8b"); r.Usage.PromptTokensDetails.CachedTokens != 0 {
				t.Fatalf("the base model hit the adapter's cache: %d tokens", r.Usage.PromptTokensDetails.CachedTokens)
			}
			if r := ask("chat"); r.Usage.PromptTokensDetails.CachedTokens != 0 {
				t.Fatalf("adapter chat hit adapter sql's cache: %d tokens", r.Usage.PromptTokensDetails.CachedTokens)
			}
			if r := ask("sql"); r.Usage.PromptTokensDetails.CachedTokens != full {
				t.Fatalf("adapter sql cached %d of its own prompt, want %d", r.Usage.PromptTokensDetails.CachedTokens, full)
			}
			var ids []int64
			for _, m := range drain(t, sub, 300*time.Millisecond) {
				for _, ev := range decode(t, m).Events {
					if bs, ok := ev.(*kvevents.BlockStored); ok {
						switch {
						case bs.LoRAName == "" && bs.LoRAID == nil:
							ids = append(ids, 0)
						case bs.LoRAName == "chat" && bs.LoRAID != nil:
							ids = append(ids, *bs.LoRAID)
						default:
							t.Fatalf("BlockStored lora_name %q lora_id %v", bs.LoRAName, bs.LoRAID)
						}
					}
				}
			}
			if !slices.Contains(ids, 0) || !slices.Contains(ids, 2) {
				t.Fatalf("lora ids of the base and chat requests' events %v, want 0 (None) and 2", ids)
			}

			// Streaming chunks name the adapter too.
			code, raw := s.post(t, "/v1/completions", map[string]any{"model": "sql", "prompt": "hi", "max_tokens": 2, "stream": true})
			if code != 200 || !strings.Contains(string(raw), `"model":"sql"`) || strings.Contains(string(raw), `"model":"llama3-8b"`) {
				t.Fatalf("stream %d %s", code, raw)
			}
			code, raw = s.post(t, "/v1/chat/completions", map[string]any{"model": "nope", "messages": chat})
			if code != http.StatusNotFound || !strings.Contains(string(raw), "The model `nope` does not exist.") || !strings.Contains(string(raw), "NotFoundError") {
				t.Fatalf("unknown model: %d %s", code, raw)
			}
			if code, raw = s.post(t, "/tokenize", map[string]any{"model": "sql", "prompt": "hi"}); code != 200 {
				t.Fatalf("tokenize with the adapter: %d %s", code, raw)
			}
		})
	}
}
