// Package reliability holds tether's in-process fault tests: real 3-node
// Raft clusters (cluster.Open on bbolt files in temp dirs) over
// cluster/faultnet, client histories checked for linearizability with
// porcupine, and the bad-input catalogue for the cluster and the fsm. The
// tests live in _test.go files; see RELIABILITY.md at the repository root
// for the catalogue, the figures and the commands.
package reliability
