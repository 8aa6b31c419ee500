// Package engineevents tests the real-engine KV event path end to end: an
// engine's KV event publisher (vLLM's ZeroMQ protocol, spoken by a Go
// publisher and by an independent node script using the npm packages
// zeromq and @msgpack/msgpack), a `tether worker` in proxy mode consuming
// it, NATS, and an edge's fleet view whose KV index must hold exactly the
// blocks the engine reported. The tests live in _test.go files.
package engineevents
