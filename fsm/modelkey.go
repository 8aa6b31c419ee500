package fsm

import "strings"

// ModelKeySep separates a model's namespace from the key in a routing key
// of a model other than the edge's first (U+001F, the unit separator: no
// session header can carry it).
const ModelKeySep = "\x1f"

// ModelKey is key in model namespace ns: ns, ModelKeySep, key. The first
// model of an edge's catalogue has the namespace "" and its keys are bare,
// as in a single-model deployment, so adding models moves no binding and a
// cluster that mixes releases agrees on that model's keys. An empty key
// (unkeyed) stays empty. One session id on two models is two keys, so two
// bindings.
func ModelKey(ns, key string) string {
	if ns == "" || key == "" {
		return key
	}
	return ns + ModelKeySep + key
}

// SplitModelKey splits a routing key into its model namespace ("" for a
// bare key: the first model) and the key within it.
func SplitModelKey(k string) (ns, key string) {
	if ns, key, ok := strings.Cut(k, ModelKeySep); ok {
		return ns, key
	}
	return "", k
}
