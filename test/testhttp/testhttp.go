// Package testhttp is the HTTP client tests use: its idle connections
// close when the test ends (goleak would otherwise see their goroutines),
// and a request that hangs fails the test within a minute instead of at
// the package's timeout.
package testhttp

import (
	"crypto/tls"
	"net/http"
	"testing"
	"time"
)

// Timeout bounds every request of a Client.
const Timeout = 60 * time.Second

// Client returns a client with tc as its TLS configuration (nil: the
// defaults), closed at the end of t.
func Client(t testing.TB, tc *tls.Config) *http.Client {
	tr := &http.Transport{TLSClientConfig: tc, MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: Timeout}
}
