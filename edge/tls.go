package edge

// URL is the edge's base URL (https://host:port with TLS), "" before
// Start.
func (e *Edge) URL() string {
	if e.http.ln == nil {
		return ""
	}
	return e.tls.Scheme() + "://" + e.http.ln.Addr().String()
}

// TLSMode is the transport security the edge runs: mutual or plaintext.
func (e *Edge) TLSMode() string {
	if e.cfg.TLS.Mutual() {
		return TLSModeMutual
	}
	return TLSModePlaintext
}
