// Package e2e holds tether's end-to-end tests: the binary is built once
// (TestMain), `tether dev --port 0` runs as a child process, and requests go
// through its edges over real HTTP exactly as a developer's curl or an
// OpenAI client would send them. Scenarios that need to crash an edge run
// the same stack in-process through ops/devstack. The tests live in
// _test.go files.
package e2e
