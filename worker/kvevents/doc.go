// Package kvevents is the producer side of engine KV cache events: a
// vLLM-compatible ZeroMQ publisher (PUB socket and ROUTER replay, as
// vllm/distributed/kv_events.py ZmqEventPublisher) and Engine, which wraps
// the simulated engine so it publishes its cache changes as vLLM's
// BlockStored/BlockRemoved events and serves them as trtllm-serve's
// POST /kv_cache_events. A `tether worker` in proxy mode (or an edge) then
// consumes them through internal/enginekv exactly as it consumes a real
// engine's. See DESIGN.md.
package kvevents
