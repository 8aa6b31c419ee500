package pki

import (
	"crypto/tls"
	"io"
	"net"
	"slices"
	"testing"
	"time"
)

// BenchmarkMutualHandshake: one TLS 1.3 handshake with client certificates
// (ECDSA P-256, the cluster port's configuration) over loopback TCP — the
// cost a new Raft, forwarding or hop connection pays once (connections are
// kept alive). Metric: median µs per handshake.
func BenchmarkMutualHandshake(b *testing.B) {
	ca, err := NewCA("bench-ca", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	srvLeaf, err := ca.Issue("edge-1", IssueOptions{Role: RoleEdge})
	if err != nil {
		b.Fatal(err)
	}
	cliLeaf, err := ca.Issue("edge-2", IssueOptions{Role: RoleEdge})
	if err != nil {
		b.Fatal(err)
	}
	srvConf, cliConf := ca.MutualTLS(srvLeaf), ca.MutualTLS(cliLeaf)
	cliConf.ServerName = "edge-1"
	cliConf.ClientSessionCache = nil // every handshake is a full one
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := tls.Server(c, srvConf)
				if tc.Handshake() == nil {
					_, _ = tc.Write([]byte{1})
				}
			}()
		}
	}()
	var us []float64
	for b.Loop() {
		t0 := time.Now()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		tc := tls.Client(c, cliConf)
		if err := tc.Handshake(); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(tc, make([]byte, 1)); err != nil {
			b.Fatal(err)
		}
		us = append(us, float64(time.Since(t0).Microseconds()))
		c.Close()
	}
	if len(us) > 0 {
		slices.Sort(us)
		b.ReportMetric(us[len(us)/2], "us/handshake-p50")
	}
}
