// Package routing makes tether's routing decision, one entry point per
// question, for the edge and the trace simulator alike:
//
//   - which key: ResolveIdentity (identity.go, clientagents.go);
//   - which instance: Decider.Decide (decide.go), a request's whole decision
//     for one fleet, first attempt or retry after a failed hop;
//   - stay or move: Router.Condition, whether an instance can keep its bound
//     keys (the overload tracker's feed), and the bound key's rules (stay.go).
//
// A decision's walk goes down: decide.go (the key's placement in the log
// and this edge's proposals), stay.go (stay or move), place.go and lora.go
// (placement), then the mechanisms below: routing/kvindex, routing/overload,
// routing/rendezvous (routing/breaker feeds the views). It is pure: no I/O,
// no clock (time is a parameter), no randomness. routing/DESIGN.md draws it.
package routing
