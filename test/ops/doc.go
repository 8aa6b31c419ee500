// Package ops holds the operations tests: a 3-edge cluster with workers and
// embedded NATS, in process, driven through a workload and then audited
// (replay, verify, explain on a copied data dir), administered (peer
// removal, leadership transfer, snapshots) and upgraded one node at a time;
// plus checks that every shipped configuration and manifest under deploy/
// parses with the real parsers. The tests live in _test.go files.
package ops
