package api

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"log"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/internal/apireq"
)

// Requests net/http cannot parse — a control character (NUL, a bare CR)
// in a header field, an invalid header name, a header block beyond
// MaxHeaderBytes, an unsupported transfer encoding or protocol version —
// never reach a handler: the server writes its own plain-text answer
// ("HTTP/1.1 400 Bad Request", Content-Type text/plain) straight to the
// connection and closes it. apiErrorConn sits between the server and the
// connection and rewrites exactly those answers into the API's JSON error
// shape of the request's path (Anthropic's on the Messages paths, OpenAI's
// elsewhere: the path is read from the request line the connection
// delivered, requestLines), with the same status. It recognises them by
// their fixed form:
// the status line followed directly by Content-Type text/plain and
// Connection: close, in one write; a response a handler writes always
// carries a Date and its headers sorted (Connection before Content-Type),
// so it never matches.
//
// The connection the server sees is the wrapper, not the *tls.Conn: the
// handshake happens on the first read, under the header read deadline (as
// the server's own handshake does), a plain-HTTP request to the TLS port
// is answered in the same JSON shape, and ConnContext/RestoreTLS give the
// handlers back their r.TLS.

// serverErrorHeaders is what net/http writes between its error status line
// and its error text (net/http server.go, conn.serve).
const serverErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// Listener wraps every accepted connection of the API's listener in an
// apiErrorConn; with TLS set it serves TLS on the accepted connections
// (as tls.NewListener does), keeping what a client sent first so a
// plain-HTTP request to the TLS port is answered in its path's shape.
type Listener struct {
	net.Listener
	TLS *tls.Config
}

func (l Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	var first *firstBytes
	if l.TLS != nil {
		first = &firstBytes{Conn: c}
		c = tls.Server(first, l.TLS)
	}
	ac := &apiErrorConn{Conn: c, first: first}
	if tc, ok := c.(*tls.Conn); ok {
		ac.tls = tc
	}
	return ac, nil
}

// firstBytes keeps the first lineTailBytes a connection delivers (under
// TLS: the start of the client's first record, or of a plain-HTTP
// request).
type firstBytes struct {
	net.Conn
	mu   sync.Mutex
	head []byte
}

func (f *firstBytes) Read(b []byte) (int, error) {
	n, err := f.Conn.Read(b)
	f.mu.Lock()
	if room := lineTailBytes - len(f.head); room > 0 {
		f.head = append(f.head, b[:min(n, room)]...)
	}
	f.mu.Unlock()
	return n, err
}

func (f *firstBytes) bytes() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]byte(nil), f.head...)
}

type apiErrorConn struct {
	net.Conn
	tls   *tls.Conn   // the TLS connection, when the listener serves TLS
	first *firstBytes // under it, what the client sent first (Listener.TLS set)

	mu        sync.Mutex
	plainHTTP net.Conn // set when a plain-HTTP request reached the TLS port: answer on it
	lines     requestLines
}

func (c *apiErrorConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lines.feed(b[:n])
	var rh tls.RecordHeaderError
	if err != nil && c.tls != nil && errors.As(err, &rh) && rh.Conn != nil && looksLikeHTTP(rh.RecordHeader) {
		c.plainHTTP = rh.Conn
		c.lines = requestLines{}
		if c.first != nil {
			c.lines.feed(c.first.bytes())
		}
	}
	return n, err
}

// looksLikeHTTP: a TLS record header that is the start of an HTTP request
// (net/http's tlsRecordHeaderLooksLikeHTTP).
func looksLikeHTTP(hdr [5]byte) bool {
	switch string(hdr[:]) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO":
		return true
	}
	return false
}

func (c *apiErrorConn) Write(b []byte) (int, error) {
	status, text, ok := parseServerError(b)
	if !ok {
		return c.Conn.Write(b)
	}
	c.mu.Lock()
	raw := c.plainHTTP
	d := c.lines.dialect()
	c.mu.Unlock()
	out, resp := c.Conn, serverErrorJSON(status, text, d)
	if raw != nil {
		// The client speaks plain HTTP: answer it in plain HTTP.
		out, resp = raw, apiErrorResponse(http.StatusBadRequest, "https_required", "the client sent an HTTP request to an HTTPS server: this port serves HTTPS only", d)
	}
	if _, err := out.Write(resp); err != nil {
		return 0, err
	}
	return len(b), nil
}

// CloseWrite lets the server half-close before it waits (net/http does for
// its 431 answer).
func (c *apiErrorConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// parseServerError recognises net/http's own error answer, the whole of b:
// its status and reason ("Bad Request: invalid header name", "Request
// Header Fields Too Large").
func parseServerError(b []byte) (int, string, bool) {
	rest, ok := bytes.CutPrefix(b, []byte("HTTP/1.1 "))
	if !ok {
		return 0, "", false
	}
	line, body, ok := bytes.Cut(rest, []byte(serverErrorHeaders))
	if !ok || bytes.Contains(line, []byte("\r\n")) || bytes.Contains(body, []byte("\r\n")) || len(line) < 4 || line[3] != ' ' {
		return 0, "", false
	}
	status, err := strconv.Atoi(string(line[:3]))
	if err != nil || status < 400 || status > 599 {
		return 0, "", false
	}
	// Its text repeats the status line (one answer is worded apart).
	if !bytes.Equal(body, line) && !(status == http.StatusNotImplemented && string(body) == "Unsupported transfer encoding") {
		return 0, "", false
	}
	return status, string(line[4:]), true
}

// serverErrorJSON is the whole HTTP response for a request the server
// could not parse, in dialect d's error shape.
func serverErrorJSON(status int, text string, d apireq.Dialect) []byte {
	code, msg := "malformed_request", ""
	switch status {
	case http.StatusRequestHeaderFieldsTooLarge:
		code, msg = "request_header_too_large", "the request's header block exceeds the edge's limit (1 MiB)"
	case http.StatusHTTPVersionNotSupported:
		code, msg = "http_version_not_supported", "only HTTP/1.x is served here"
	case http.StatusNotImplemented:
		code, msg = "transfer_encoding_not_supported", "unsupported transfer encoding (chunked or none)"
	default:
		msg = "the request could not be parsed: a header field holds a control character (NUL, a bare CR or LF), a header name is invalid, Content-Length is repeated or invalid, or the request line is malformed"
	}
	if _, detail, ok := strings.Cut(text, ": "); ok && detail != "" {
		msg += " (" + detail + ")"
	}
	return apiErrorResponse(status, code, msg, d)
}

// apiErrorResponse is a whole HTTP response carrying an
// invalid_request_error in dialect d's shape (Messages: Anthropic's
// {"type":"error","error":{"type","message"}}, whatever the status: every
// such refusal is the request's fault; others: OpenAI's object with its
// code); the connection closes after it.
func apiErrorResponse(status int, code, msg string, d apireq.Dialect) []byte {
	// The type is fixed: 400 is already invalid_request_error in either
	// shape, and a 431, 501 or 505 answers a malformed request too.
	e := Error{Status: http.StatusBadRequest, Message: msg, Type: "invalid_request_error", Code: code}
	body := append(e.JSON(d), '\n')
	var b bytes.Buffer
	b.WriteString("HTTP/1.1 " + strconv.Itoa(status) + " " + http.StatusText(status) + "\r\n")
	b.WriteString("Content-Type: application/json\r\n")
	b.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\n")
	b.WriteString("Connection: close\r\n\r\n")
	b.Write(body)
	return b.Bytes()
}

// connKey is the context key of the connection a request arrived on.
type connKey struct{}

// ConnContext is the HTTP server's ConnContext: it remembers the
// connection, so RestoreTLS can fill r.TLS.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if ac, ok := c.(*apiErrorConn); ok && ac.tls != nil {
		return context.WithValue(ctx, connKey{}, ac.tls)
	}
	return ctx
}

// RestoreTLS sets r.TLS from the request's TLS connection (the server does
// not see it as one behind apiErrorConn).
func RestoreTLS(r *http.Request) {
	if r.TLS != nil {
		return
	}
	if tc, ok := r.Context().Value(connKey{}).(*tls.Conn); ok {
		cs := tc.ConnectionState()
		r.TLS = &cs
	}
}

// MaxHeaderBytes bounds a request's header block (431 beyond, in the API's
// error shape).
const MaxHeaderBytes = 1 << 20

// NewServer is the API's HTTP server for h, to serve on a Listener: the
// listener's timeouts (read_header_timeout, read_timeout, write_timeout,
// idle_timeout), the header limit, and r.TLS restored for the handlers
// (RestoreTLS).
func NewServer(h http.Handler, cfg *config.Config, errorLog *log.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,  // bodies up to max_body_bytes
		WriteTimeout:      cfg.WriteTimeout, // 0: none; streams extend it per chunk (DeadlineWriter)
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		ConnContext:       ConnContext,
		ErrorLog:          errorLog,
	}
}
