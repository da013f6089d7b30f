package enginemetrics

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	text := `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0 1712345678000
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.25
vllm:num_requests_running_total 99
vllm:prefix_cache_hits_total{model_name="x"} 12
vllm:prefix_cache_queries_total{engine="0",model_name="x"} 40
vllm:prefix_cache_queries_total{engine="1",model_name="x"} 60
vllm:gpu_prefix_cache_queries_total{model_name="x"} 999
vllm:num_requests_waiting{engine="2"} NaN
`
	l, err := Parse(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	want := Load{Running: 5, Waiting: 4, KVUsage: 0.5, PrefixQueries: 100, PrefixHits: 12, Model: "meta-llama/Llama-3.1-8B-Instruct"}
	if l != want {
		t.Fatalf("got %+v, want %+v", l, want)
	}
	old := "vllm:gpu_cache_usage_perc{model_name=\"a\\\"b\"} 0.75\nvllm:num_requests_running 1\n"
	if l, err = Parse(strings.NewReader(old)); err != nil || l.KVUsage != 0.75 || l.Running != 1 || l.Model != `a\"b` {
		t.Fatalf("old names: %+v, %v", l, err)
	}
	if _, err := Parse(strings.NewReader("go_goroutines 4\n")); err == nil {
		t.Fatal("metrics without vLLM gauges accepted")
	}
}

// TestCacheConfigCapacity: vLLM's info gauge gives the KV cache's size.
func TestCacheConfigCapacity(t *testing.T) {
	const text = `# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="9392"} 1.0
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
`
	l, err := Parse(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if l.CapacityTokens != 9392*16 {
		t.Fatalf("capacity %d tokens, want %d", l.CapacityTokens, 9392*16)
	}
	bad := strings.ReplaceAll(text, `num_gpu_blocks="9392"`, `num_gpu_blocks="None"`)
	if l, err = Parse(strings.NewReader(bad)); err != nil || l.CapacityTokens != 0 {
		t.Fatalf("num_gpu_blocks None: capacity %d, err %v; want 0, nil", l.CapacityTokens, err)
	}
}
