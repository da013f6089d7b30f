#!/usr/bin/env bash
# Sends two turns of one chat session through the compose cluster's two
# routers and prints the responses with their X-Kvdir-* headers: turn 1 to
# router 1, turn 2 (turn 1's transcript plus a new question) to router 2,
# which has never seen the session and must find its prefix in the directory.
#
# Usage: deploy/compose/demo.sh [router1-url] [router2-url]
#        (default: the routers' published addresses, KVDIR_BIND with
#        KVDIR_ROUTER1_PORT and KVDIR_ROUTER2_PORT from the environment or
#        else from deploy/compose/.env: http://127.0.0.1:28080 and :28081)
# KVDIR_DEMO_MODEL names the requests' model (default: KVDIR_MODEL from the
# environment or .env, llama3-8b); with groups.yml, KVDIR_DEMO_MODEL=llama3-70b
# goes through the second directory group to kvdir-engine5.
# Needs curl and python3 (to put turn 1's answer into turn 2).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# env_or_dotenv NAME: $NAME if set and not empty, else its value in .env.
env_or_dotenv() { local v="${!1:-}"; [ -n "$v" ] || v="$(sed -n "s/^$1=//p" "$here/.env")"; echo "$v"; }
bind="$(env_or_dotenv KVDIR_BIND)"
r1="${1:-http://${bind:-127.0.0.1}:$(env_or_dotenv KVDIR_ROUTER1_PORT)}"
r2="${2:-http://${bind:-127.0.0.1}:$(env_or_dotenv KVDIR_ROUTER2_PORT)}"
model="${KVDIR_DEMO_MODEL:-$(env_or_dotenv KVDIR_MODEL)}"
sys='You are a concise assistant for an LLM serving team. Answer in one sentence.'
q1='What does a prefix cache save?'
q2='And what evicts it?'

post() { # post <url> <body>: the response's status line, X-Kvdir headers and body
  curl -sS -i "$1/v1/chat/completions" -H 'Content-Type: application/json' -H 'X-Session-Id: demo-1' -d "$2" |
    tr -d '\r' | grep -iv '^date:\|^content-length:'
}

t1=$(python3 -c 'import json,sys; print(json.dumps({"model":sys.argv[3],"max_tokens":8,"messages":[
  {"role":"system","content":sys.argv[1]},{"role":"user","content":sys.argv[2]}]}))' "$sys" "$q1" "$model")
echo "== turn 1 -> $r1"
out=$(post "$r1" "$t1")
echo "$out"
reply=$(echo "$out" | tail -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])')
t2=$(python3 -c 'import json,sys; print(json.dumps({"model":sys.argv[5],"max_tokens":8,"messages":[
  {"role":"system","content":sys.argv[1]},{"role":"user","content":sys.argv[2]},
  {"role":"assistant","content":sys.argv[3]},{"role":"user","content":sys.argv[4]}]}))' "$sys" "$q1" "$reply" "$q2" "$model")
echo
echo "== turn 2 -> $r2"
post "$r2" "$t2"
